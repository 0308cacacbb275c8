//! Where a payload lives and how it is read back: inline in its record,
//! apart in the `payloads` tree, or in a file of its own (see the module
//! docs of [`super`]).

use std::fs::File;

use super::{record::Payload, record_key, remove_keyed, Sled, SledError};
use crate::{
    error::{Error, Result},
    job::{Job, JobId},
};

/// How many times a reader without the lock reads a record again whose
/// payload moved while it read.
const REREADS: usize = 3;

impl Sled {
    /// A job with its payload, to hand out.
    pub(super) async fn load_full(&self, id: JobId) -> Result<Job> {
        let mut tries = 0;
        loop {
            let (mut job, payload) = self.load_record(id)?;
            let read = match payload {
                Payload::File(len) => {
                    let file = self.files.open_file(id)?;
                    let stored = self.read_file(id, file).await?;
                    self.place(&mut job, stored, len)
                }
                payload => self.fill(&mut job, payload),
            };
            match read {
                Err(Error::Corrupt(_)) if tries < REREADS && self.moved(id, payload)? => tries += 1,
                read => return read.map(|()| job),
            }
        }
    }

    /// Whether the record of `id` no longer says its payload is at
    /// `payload`: a debounce replaced it while a reader without the lock
    /// read the old place, which the replace clears once its record is
    /// written. That reader reads the record again.
    fn moved(&self, id: JobId, payload: Payload) -> Result<bool> {
        match self.load_record(id) {
            Ok((_, now)) => Ok(now != payload),
            Err(Error::NotFound(_)) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// [`fill`](Self::fill) for a reader without the lock (a list): a
    /// payload that a debounce moved meanwhile is read from the record
    /// that moved it, which replaces `job`.
    pub(super) fn fill_settled(&self, job: &mut Job, mut payload: Payload) -> Result<()> {
        let mut tries = 0;
        loop {
            match self.fill(job, payload) {
                Err(Error::Corrupt(_)) if tries < REREADS && self.moved(job.id, payload)? => {
                    tries += 1;
                    (*job, payload) = self.load_record(job.id)?;
                }
                read => return read,
            }
        }
    }

    /// Reads an opened payload file (`None`: there was none) on tokio's
    /// blocking pool, not on a runtime thread: it is at least
    /// `--payload-file-bytes` long and may have left the page cache.
    pub(super) async fn read_file(&self, id: JobId, file: Option<File>) -> Result<Option<Vec<u8>>> {
        let Some(file) = file else {
            return Ok(None);
        };
        let files = self.files.clone();
        tokio::task::spawn_blocking(move || files.read(id, file))
            .await
            .map_err(|e| Error::Io(format!("reading a payload file failed: {e}")))?
            .map(Some)
    }

    /// Reads a job's payload in, if it is apart or in a file.
    pub(super) fn fill(&self, job: &mut Job, payload: Payload) -> Result<()> {
        let (stored, len) = match payload {
            Payload::Inline | Payload::Apart(0) | Payload::File(0) => return Ok(()),
            Payload::Apart(len) => (
                self.payloads
                    .get(record_key(job.id))
                    .map_err(SledError::from)?
                    .map(|bytes| bytes.to_vec()),
                len,
            ),
            Payload::File(len) => {
                let file = self.files.open_file(job.id)?;
                (file.map(|f| self.files.read(job.id, f)).transpose()?, len)
            }
        };
        self.place(job, stored, len)
    }

    /// Puts a payload read from apart (`None`: not found) into its job,
    /// whose record says it has `len` bytes.
    pub(super) fn place(&self, job: &mut Job, stored: Option<Vec<u8>>, len: u64) -> Result<()> {
        match stored {
            Some(bytes) if bytes.len() as u64 == len => {
                job.payload = bytes;
                Ok(())
            }
            Some(bytes) => Err(Error::Corrupt(format!(
                "job {} has a payload of {} bytes, its record says {len}",
                job.id,
                bytes.len()
            ))),
            // Deleted or purged since its record was read (reads do not
            // hold the lock): gone, not corrupt.
            None if !self
                .jobs
                .contains_key(record_key(job.id))
                .map_err(SledError::from)? =>
            {
                Err(Error::NotFound(job.id))
            }
            None => Err(Error::Corrupt(format!(
                "job {} has no payload, its record says {len} bytes",
                job.id
            ))),
        }
    }

    /// Stores a payload apart, before the record that refers to it.
    pub(super) fn put_payload(&self, id: JobId, payload: &[u8]) -> Result<()> {
        if !payload.is_empty() {
            self.payloads
                .insert(record_key(id), payload)
                .map_err(SledError::from)?;
        }
        Ok(())
    }

    /// Removes the payloads of jobs whose records are gone.
    pub(super) fn remove_payloads(&self, ids: impl IntoIterator<Item = JobId>) -> Result<()> {
        remove_keyed(&self.payloads, ids)
    }

    /// Removes the payload files of removed records once the removals are
    /// durable (before, a crash could bring a record back without its
    /// file), in a task of its own: neither the caller's reply nor its
    /// cancellation waits for it. Files the task does not get to (a failed
    /// round, a stop) are orphans, which the next start removes.
    pub(super) fn remove_files_when_durable(&self, ids: Vec<JobId>) {
        if ids.is_empty() {
            return;
        }
        let durable = self.flusher.durable();
        let files = self.files.clone();
        tokio::spawn(async move {
            if durable.await.is_ok() {
                let _ = tokio::task::spawn_blocking(move || files.remove(ids)).await;
            }
        });
    }
}
