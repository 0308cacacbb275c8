//! The write path: every change of a record, under the state lock, through
//! [`machine::apply`]; inserts, takes, lease expiry and purge steps.

use std::{collections::HashMap, fs::File, time::SystemTime};

use super::{
    encode,
    index::Index,
    keys::{Leftovers, Met},
    record::Payload,
    record_key, Sled, SledError, PURGE_CHUNK,
};
use crate::{
    error::{Error, Result},
    job::{Job, JobId, KeyScope, LeaseId, NewJob, Status},
    machine::{self, Event},
    store::{rules::Retention, Change, Enqueued},
};

impl Sled {
    /// Writes records (`None` removes one) to the jobs tree, all or none
    /// after a crash.
    ///
    /// A single record goes in as a plain insert or remove: sled 0.34's
    /// `apply_batch` rolls its log buffer twice (`pin_log`), each roll a
    /// `pwrite` and a `sync_file_range` handed to sled's I/O threads, and
    /// paying that on every enqueue, take and ack made the server 2-3x
    /// slower. Only several records need the batch's atomicity.
    pub(super) fn write(&self, writes: Vec<([u8; 8], Option<Vec<u8>>)>) -> Result<()> {
        self.check_open()?;
        match <[_; 1]>::try_from(writes) {
            Ok([(key, Some(value))]) => {
                self.jobs.insert(key, value).map_err(SledError::from)?;
            }
            Ok([(key, None)]) => {
                self.jobs.remove(key).map_err(SledError::from)?;
            }
            Err(writes) if writes.is_empty() => {}
            Err(writes) => {
                let mut batch = sled::Batch::default();
                for (key, value) in writes {
                    match value {
                        Some(value) => batch.insert(&key, value),
                        None => batch.remove(&key),
                    }
                }
                self.jobs.apply_batch(batch).map_err(SledError::from)?;
            }
        }
        Ok(())
    }

    /// The one write path: under the lock, load each job (or the version
    /// this call already changed), apply its event, then write every
    /// changed record in one batch and update the indexes.
    pub(super) fn apply_locked(
        &self,
        index: &mut Index,
        events: Vec<(JobId, Event)>,
        now: SystemTime,
    ) -> Result<Vec<Result<Change>>> {
        self.check_open()?;
        // Jobs changed by this call so far: (as loaded, latest, where the
        // payload is).
        let mut changed: HashMap<JobId, (Job, Job, Payload)> = HashMap::new();
        let mut loaded: HashMap<JobId, Payload> = HashMap::new();
        let mut out = Vec::with_capacity(events.len());
        for (id, event) in events {
            let current = match changed.get(&id) {
                Some((_, latest, _)) => latest.clone(),
                None => match self.load_record(id) {
                    Ok((job, payload)) => {
                        loaded.insert(id, payload);
                        job
                    }
                    Err(Error::NotFound(id)) => {
                        out.push(Err(Error::NotFound(id)));
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            match machine::apply(current.clone(), event, now) {
                Ok(new) => {
                    let payload = loaded.get(&id).copied().unwrap_or(Payload::Inline);
                    changed
                        .entry(id)
                        .or_insert_with(|| (current.clone(), new.clone(), payload))
                        .1 = new.clone();
                    out.push(Ok(Change { old: current, new }));
                }
                Err(e) => out.push(Err(e.into())),
            }
        }
        if changed.is_empty() {
            return Ok(out);
        }
        let mut writes = Vec::with_capacity(changed.len());
        for (id, (first, new, payload)) in &mut changed {
            let placed = match *payload {
                Payload::Apart(len) => Payload::Apart(len),
                Payload::File(len) => Payload::File(len),
                // An older record may hold a big payload inline: it moves
                // apart now, once.
                Payload::Inline => Payload::for_len(new.payload.len()),
            };
            if *payload == Payload::Inline && placed != Payload::Inline {
                self.put_payload(*id, &new.payload)?;
            }
            // Made DONE by this call: its result, or none (which also
            // clears a result an earlier ack left before a crash cut it
            // short).
            if first.status != Status::Done && new.status == Status::Done {
                match &new.result {
                    Some(result) => self.put_result(*id, result)?,
                    None => self.clear_result(*id)?,
                }
            }
            // Reported by this call (the loads never carry it).
            if let Some(progress) = new
                .progress
                .as_ref()
                .filter(|p| first.progress.as_ref() != Some(*p))
            {
                self.put_progress(*id, progress)?;
            }
            writes.push((record_key(*id), Some(encode(new, placed)?)));
        }
        self.write(writes)?;
        for (first, last, _) in changed.values() {
            index.update(first, last);
        }
        Ok(out)
    }

    /// Writes the payloads of `batch` that go to files, durably, each
    /// under a job id taken now; returns the ids taken, one per job (empty
    /// if no payload goes to a file; `None` for a job whose key is already
    /// taken, which will not be created).
    pub(super) async fn write_files(&self, batch: &mut Vec<NewJob>) -> Result<Vec<Option<JobId>>> {
        if !batch.iter().any(|new| self.files.wants(new.payload.len())) {
            return Ok(Vec::new());
        }
        self.check_open()?;
        let taken: Vec<bool> = {
            let index = self.lock();
            batch
                .iter()
                .map(|new| {
                    // (A job whose key is held only while active or for a
                    // window, or a replace that may meet a RUNNING holder,
                    // may take the key over: it gets an id.)
                    let may_take_over = new.unique.scope == KeyScope::Active
                        || new.unique.unique_for.is_some()
                        || new.unique.replace;
                    !may_take_over
                        && new
                            .key
                            .as_deref()
                            .is_some_and(|k| index.key(&new.queue, k).is_some())
                })
                .collect()
        };
        // Every job to be created gets its id now, in batch order, not
        // only those with a file: ids order jobs of one run_at, so a batch
        // stays FIFO whatever its payloads' sizes.
        let mut ids = Vec::with_capacity(batch.len());
        for taken in taken {
            ids.push(match taken {
                false => Some(JobId(self.next_id()?)),
                true => None,
            });
        }
        let files = self.files.clone();
        let jobs = std::mem::take(batch);
        let reserved = ids.clone();
        let (jobs, written) = tokio::task::spawn_blocking(move || {
            let written = files.write(
                jobs.iter()
                    .zip(&reserved)
                    .filter(|(new, _)| files.wants(new.payload.len()))
                    .filter_map(|(new, id)| id.map(|id| (id, new.payload.as_slice()))),
            );
            (jobs, written)
        })
        .await
        .map_err(|e| Error::Io(format!("payload writer: {e}")))?;
        *batch = jobs;
        if written.is_err() {
            // No record was written: the files of this batch are nobody's.
            self.files.remove(ids.iter().flatten().copied());
        }
        written.map(|()| ids)
    }

    /// Inserts `batch`; `ids[i]`, if set, is the id taken for job `i` by
    /// [`Sled::write_files`], which wrote its payload to its file if it
    /// goes to one.
    pub(super) fn insert_locked(
        &self,
        batch: Vec<NewJob>,
        ids: &[Option<JobId>],
        now: SystemTime,
    ) -> Result<Vec<Enqueued>> {
        let mut index = self.lock();
        self.check_open()?;
        let mut out: Vec<Enqueued> = Vec::with_capacity(batch.len());
        let mut writes = Vec::with_capacity(batch.len());
        let mut leftovers = Leftovers::default();
        for (i, new) in batch.into_iter().enumerate() {
            let mut taken_over = None;
            if let Some(holder) = new.key.as_deref().and_then(|k| index.key(&new.queue, k)) {
                match self.meet_holder(holder, &new, now, &mut writes, &mut leftovers)? {
                    Met::Done(enqueued) => {
                        out.push(*enqueued);
                        continue;
                    }
                    Met::TakenOver(change) => taken_over = Some(*change),
                }
            }
            let taken = ids.get(i).copied().flatten();
            let id = match taken {
                Some(id) => id,
                None => JobId(self.next_id()?),
            };
            let mut job = machine::create(id, new, now);
            // (A key taken at `write_files` but freed since leaves a big
            // payload without a file: it goes to the tree.)
            let placed = match taken.is_some() && self.files.wants(job.payload.len()) {
                true => Payload::File(job.payload.len() as u64),
                false => Payload::for_len(job.payload.len()),
            };
            if let Payload::Apart(_) = placed {
                self.put_payload(job.id, &job.payload)?;
            }
            writes.push((record_key(job.id), Some(encode(&mut job, placed)?)));
            out.push(Enqueued {
                changed: taken_over,
                ..Enqueued::created(job)
            });
        }
        self.write(writes)?;
        for enqueued in &out {
            if let Some(change) = &enqueued.changed {
                index.update(&change.old, &change.new);
            }
            if enqueued.created {
                index.insert(&enqueued.job);
            }
        }
        self.clear_leftovers(leftovers)?;
        Ok(out)
    }

    /// Takes the first due job under the lock; a payload in a file comes
    /// back opened, for the caller to read without it.
    pub(super) fn take_locked(
        &self,
        queues: &[String],
        take: Event,
        now: SystemTime,
    ) -> Result<Option<(Change, Option<Unread>)>> {
        let mut index = self.lock();
        for queue in queues {
            index.release(queue, now);
        }
        let Some(id) = queues
            .iter()
            .filter(|q| !index.is_paused(q) && index.may_take(q, now))
            .find_map(|q| index.first_due(q, now))
        else {
            return Ok(None);
        };
        let mut results = self.apply_locked(&mut index, vec![(id, take)], now)?;
        match results.pop() {
            Some(Ok(mut change)) => {
                index.took(&change.new.queue, change.new.group.as_deref(), now);
                // The take is written. What follows may fail (a payload
                // that cannot be read) or wait (a file read, during which
                // a Dequeue's caller may give up) before the caller
                // publishes it, so its lease is made reapable and durable
                // now: otherwise the job would stay RUNNING under a lease
                // nobody holds, and nothing would wake the reaper for it.
                if let Some(at) = change.new.lease_expires_at() {
                    if let Some(remote) = self.remote.get() {
                        remote.lease_expires(at);
                    }
                }
                self.flusher.request();
                // The worker needs the payload, which the change left apart.
                // A file is opened under the lock (so a delete right after
                // cannot take it away) and read by the caller without it
                // (it may be big).
                if change.new.payload.is_empty() {
                    let (_, placed) = self.load_record(id)?;
                    if let Payload::File(len) = placed {
                        let file = self.files.open_file(id)?;
                        return Ok(Some((change, Some(Unread { file, len }))));
                    }
                    self.fill(&mut change.new, placed)?;
                }
                Ok(Some((change, None)))
            }
            Some(Err(Error::NotFound(id))) => Err(Error::Corrupt(format!(
                "job {id} is indexed but has no record"
            ))),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    pub(super) fn expiring_locked(&self, at: SystemTime) -> Result<Vec<(JobId, LeaseId)>> {
        let ids = self.lock().expired(at);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            match self.load(id) {
                Ok(job) => {
                    if let Some(lease) = job.lease_id() {
                        out.push((id, lease));
                    }
                }
                // Purged or changed meanwhile: the caller re-checks anyway.
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// One purge step: reads up to [`PURGE_CHUNK`] DONE and FAILED jobs
    /// after `after` (by the status index: PENDING and RUNNING records are
    /// never read, so a purge over 1M pending jobs reads none of them) —
    /// or, for a purge of PENDING jobs, that queue's PENDING ones —
    /// without the lock, then deletes the purgeable ones under it,
    /// re-checking each (it may have been retried or taken meanwhile).
    /// Returns the number deleted and where the next step starts.
    pub(super) fn purge_chunk_locked(
        &self,
        after: Option<JobId>,
        retention: Retention,
    ) -> Result<(u64, Option<JobId>, Vec<JobId>)> {
        let Some(start) = after.map_or(Some(0), |id| id.0.checked_add(1)) else {
            return Ok((0, None, Vec::new()));
        };
        let ids = {
            let index = self.lock();
            // One queue's purge walks that queue's finished jobs, not every
            // queue's.
            let finished = |status| match &retention.queue {
                Some(queue) => index.in_queue(queue, Some(status), JobId(start), PURGE_CHUNK),
                None => index.with_status(status, JobId(start), PURGE_CHUNK),
            };
            match (&retention.queue, retention.pending_through) {
                (Some(queue), Some(_)) => {
                    index.in_queue(queue, Some(Status::Pending), JobId(start), PURGE_CHUNK)
                }
                _ => {
                    let mut ids = finished(Status::Done);
                    ids.extend(finished(Status::Failed));
                    ids.sort_unstable();
                    ids.truncate(PURGE_CHUNK);
                    ids
                }
            }
        };
        let Some(&last) = ids.last() else {
            return Ok((0, None, Vec::new()));
        };
        let mut candidates = Vec::new();
        let mut next = Some(last);
        for id in ids {
            match self.load(id) {
                // The rest finished too recently: the pass ends here, having
                // read the purgeable jobs and not every retained one.
                Ok(job) if retention.past_every_cutoff(&job) => {
                    next = None;
                    break;
                }
                Ok(job) if retention.purgeable(&job) => candidates.push(id),
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if candidates.is_empty() {
            return Ok((0, next, Vec::new()));
        }
        let mut index = self.lock();
        let mut writes = Vec::new();
        let (mut gone, mut apart, mut files) = (Vec::new(), Vec::new(), Vec::new());
        for id in candidates {
            match self.load_record(id) {
                Ok((job, payload)) if retention.purgeable(&job) => {
                    writes.push((record_key(id), None));
                    // An inline record's job may have a payload in the tree
                    // left by a replace a crash cut short (removing none is
                    // a look-up).
                    apart.push(id);
                    if let Payload::File(_) = payload {
                        files.push(id);
                    }
                    gone.push(job);
                }
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.remove_progress(gone.iter().map(|job| job.id))?;
        self.write(writes)?;
        self.remove_payloads(apart)?;
        self.remove_results(gone.iter().map(|job| job.id))?;
        for job in &gone {
            index.remove(job);
        }
        Ok((gone.len() as u64, next, files))
    }
}

/// A taken job's payload file, opened under the store's lock (`None`: it
/// was missing) and not read yet, and the length its record gives.
pub(super) struct Unread {
    pub(super) file: Option<File>,
    pub(super) len: u64,
}
