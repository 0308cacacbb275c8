//! Listing jobs: a page at a time, through the status or queue index, or
//! by scanning the records in id order.

use super::{decode, record::Payload, record_key, Sled, SledError};
use crate::{
    error::{Error, Result},
    job::{Job, JobId},
    store::{ListFilter, Page},
};

impl Sled {
    pub(super) fn list_scan(&self, filter: &ListFilter) -> Result<Page> {
        let limit = filter.limit.max(1);
        let Some(start) = filter.after.map_or(Some(0), |id| id.0.checked_add(1)) else {
            return Ok(Page::default());
        };
        let matches = |job: &Job| {
            filter.queue.as_ref().is_none_or(|q| *q == job.queue)
                && filter.status.is_none_or(|s| s == job.status)
                && filter
                    .key
                    .as_ref()
                    .is_none_or(|k| job.key.as_ref() == Some(k))
        };
        // With queue and key given, at most one retained job matches.
        if let (Some(queue), Some(key)) = (&filter.queue, &filter.key) {
            let id = self.lock().key(queue, key);
            let jobs = match id.filter(|id| id.0 >= start) {
                Some(id) => match self.load_record(id) {
                    Ok((mut job, payload)) if matches(&job) => {
                        self.fill_progress(&mut job)?;
                        if filter.omit_payload {
                            job.payload = Vec::new();
                            vec![job]
                        } else {
                            match self.fill_settled(&mut job, payload) {
                                Ok(()) => vec![job],
                                Err(Error::NotFound(_)) => vec![],
                                Err(e) => return Err(e),
                            }
                        }
                    }
                    Ok(_) | Err(Error::NotFound(_)) => vec![],
                    Err(e) => return Err(e),
                },
                None => vec![],
            };
            return Ok(Page { jobs, next: None });
        }
        // The page ends at `limit` jobs or at `max_bytes` of them, whichever
        // comes first, so it is never built bigger than that in memory (nor
        // too big for the reply); a job alone over the bound still makes a
        // page, so paging always moves on.
        let mut jobs = Vec::new();
        let (mut bytes, mut full) = (0usize, false);
        // By queue, status or key: only the records the index names for
        // them (a queue with few jobs among many is not a scan); with no
        // filter every record from `start` on, all of which match.
        let indexed = |select, ids: Vec<JobId>, from| Indexed {
            sled: self,
            select,
            from,
            ids: ids.into_iter(),
        };
        let mut records: Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> + '_> =
            match (&filter.queue, filter.status, &filter.key) {
                (Some(queue), status, _) => Box::new(indexed(
                    Select::Queue(queue, status),
                    Vec::new(),
                    Some(start),
                )),
                (None, Some(status), None) => {
                    Box::new(indexed(Select::Status(status), Vec::new(), Some(start)))
                }
                // At most one job per queue holds a key.
                (None, _, Some(key)) => {
                    let mut ids = self.lock().keyed(key);
                    ids.retain(|id| id.0 >= start);
                    Box::new(indexed(Select::Named, ids, None))
                }
                // Records only: the saved-index token (written at a clean
                // stop) sorts after every record's key.
                (None, None, None) => Box::new(
                    self.jobs
                        .range(start.to_be_bytes()..=record_key(JobId(u64::MAX))),
                ),
            };
        for record in records.by_ref() {
            let (key, value) = record.map_err(SledError::from)?;
            let (mut job, payload) = decode(&key, &value)?;
            if !matches(&job) {
                continue;
            }
            self.fill_progress(&mut job)?;
            // A progress report's message and its stamp.
            let mut size = value.len().saturating_add(
                job.progress
                    .as_ref()
                    .map_or(0, |p| p.message.len().saturating_add(PROGRESS_FIELDS)),
            );
            if filter.omit_payload {
                size = size.saturating_sub(job.payload.len());
                job.payload = Vec::new();
            } else if let Payload::Apart(len) | Payload::File(len) = payload {
                size = size.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
            }
            if !jobs.is_empty() && bytes.saturating_add(size) > filter.max_bytes {
                full = true;
                break;
            }
            if !filter.omit_payload {
                match self.fill_settled(&mut job, payload) {
                    Ok(()) => {}
                    // Purged meanwhile: not listed.
                    Err(Error::NotFound(_)) => continue,
                    Err(e) => return Err(e),
                }
            }
            bytes = bytes.saturating_add(size);
            jobs.push(job);
            if jobs.len() == limit {
                full = true;
                break;
            }
        }
        // A full page may have a successor; an exhausted scan has none.
        // (Stopped by bytes, the job that did not fit is the successor.)
        let next = match jobs.last() {
            Some(last) if full && (jobs.len() < limit || records.next().is_some()) => Some(last.id),
            _ => None,
        };
        Ok(Page { jobs, next })
    }
}

/// What a progress report weighs on a page besides its message: its
/// percent and stamp, encoded.
const PROGRESS_FIELDS: usize = 24;

/// Which of the index's id sets a listing walks.
enum Select<'f> {
    /// Jobs with one status.
    Status(crate::job::Status),
    /// One queue's jobs, of one status or all.
    Queue(&'f str, Option<crate::job::Status>),
    /// The ids given at the start, and no more.
    Named,
}

/// The records of the jobs an index set names, in id order: fetched a
/// chunk of ids at a time under the lock, each record read without it (so
/// a job may have changed since; the caller's filter checks it again).
struct Indexed<'a, 'f> {
    sled: &'a Sled,
    select: Select<'f>,
    /// The next id to look from; `None` once the set is exhausted.
    from: Option<u64>,
    ids: std::vec::IntoIter<JobId>,
}

/// Ids fetched under the lock per step of [`Indexed`].
pub(super) const LIST_CHUNK: usize = 256;

impl Iterator for Indexed<'_, '_> {
    type Item = sled::Result<(sled::IVec, sled::IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(id) = self.ids.next() {
                let key = record_key(id);
                match self.sled.jobs.get(key) {
                    Ok(Some(value)) => return Some(Ok((sled::IVec::from(&key[..]), value))),
                    // Purged or deleted since the ids were read.
                    Ok(None) => continue,
                    Err(e) => return Some(Err(e)),
                }
            }
            let from = JobId(self.from?);
            let ids = match self.select {
                Select::Status(status) => self.sled.lock().with_status(status, from, LIST_CHUNK),
                Select::Queue(queue, status) => {
                    self.sled.lock().in_queue(queue, status, from, LIST_CHUNK)
                }
                Select::Named => Vec::new(),
            };
            self.from = match ids.last() {
                Some(last) if ids.len() == LIST_CHUNK => last.0.checked_add(1),
                _ => None,
            };
            if ids.is_empty() {
                return None;
            }
            self.ids = ids.into_iter();
        }
    }
}
