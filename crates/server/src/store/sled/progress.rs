//! Where a job's latest progress lives: the `progress` tree, under the
//! job's record key, apart from the record, so that a job's other changes
//! neither carry nor rewrite it, and the loads of a change (which read
//! records only) never see it. The heartbeat that reports it writes it in
//! the same commit round as the record it extends, so the heartbeat's reply
//! waits for both. It is removed before the record goes (a crash between
//! the two leaves a job without its progress, never progress without a
//! job).

use super::{record_key, remove_keyed, Sled, SledError};
use crate::{
    error::{Error, Result},
    job::{Job, JobId, Progress},
};

impl Sled {
    /// Stores a job's latest progress.
    pub(super) fn put_progress(&self, id: JobId, progress: &Progress) -> Result<()> {
        let bytes = postcard::to_allocvec(progress)
            .map_err(|e| Error::Corrupt(format!("encoding the progress of job {id}: {e}")))?;
        self.progress
            .insert(record_key(id), bytes)
            .map_err(SledError::from)?;
        Ok(())
    }

    /// Reads a job's latest progress in, if it has reported any. A report
    /// that does not decode is none (logged): it never makes its job
    /// unreadable.
    pub(super) fn fill_progress(&self, job: &mut Job) -> Result<()> {
        job.progress = match self
            .progress
            .get(record_key(job.id))
            .map_err(SledError::from)?
        {
            Some(bytes) => match postcard::from_bytes(&bytes) {
                Ok(progress) => Some(progress),
                Err(e) => {
                    tracing::warn!(job.id = %job.id, cause = %e, "undecodable progress report; shown as none");
                    None
                }
            },
            None => None,
        };
        Ok(())
    }

    /// Removes the progress of jobs whose records go next.
    pub(super) fn remove_progress(&self, ids: impl IntoIterator<Item = JobId>) -> Result<()> {
        remove_keyed(&self.progress, ids)
    }
}
