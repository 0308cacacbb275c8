//! Where the result of a DONE job lives: the `results` tree, under the
//! job's record key, apart from the record, so that no other change
//! rewrites it and only a get reads it. Every ack writes it (or removes
//! it, for an ack without one) before the record that makes the job DONE,
//! in the same commit round, so the ack's reply waits for both; it is
//! removed after the record goes. A crash in between leaves at most a
//! result whose job is not DONE: a get of such a job does not read it,
//! the job's next ack replaces or removes it, and its deletion removes
//! it.

use super::{record_key, remove_keyed, Sled, SledError};
use crate::{
    error::Result,
    job::{Job, JobId, Status},
};

impl Sled {
    /// Stores a result, before the record that makes its job DONE. An
    /// empty one is none.
    pub(super) fn put_result(&self, id: JobId, result: &[u8]) -> Result<()> {
        if !result.is_empty() {
            self.results
                .insert(record_key(id), result)
                .map_err(SledError::from)?;
        }
        Ok(())
    }

    /// Removes a result an earlier ack left, if there is one: a read, and
    /// a write only when there is (a plain ack writes nothing here).
    pub(super) fn clear_result(&self, id: JobId) -> Result<()> {
        if self
            .results
            .contains_key(record_key(id))
            .map_err(SledError::from)?
        {
            self.remove_results([id])?;
        }
        Ok(())
    }

    /// Reads a DONE job's result in.
    pub(super) fn fill_result(&self, job: &mut Job) -> Result<()> {
        if job.status == Status::Done {
            job.result = self
                .results
                .get(record_key(job.id))
                .map_err(SledError::from)?
                .map(|bytes| bytes.to_vec());
        }
        Ok(())
    }

    /// Removes the results of jobs whose records are gone.
    pub(super) fn remove_results(&self, ids: impl IntoIterator<Item = JobId>) -> Result<()> {
        remove_keyed(&self.results, ids)
    }
}
