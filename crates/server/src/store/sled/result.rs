//! Where the result of a DONE job lives: the `results` tree, under the
//! job's record key, apart from the record, so that no other change
//! rewrites it and only a get reads it. It is written before the record
//! that makes the job DONE (in the same commit round, so the ack's reply
//! waits for both) and removed after the record goes: a crash in between
//! leaves at most a result whose job is not DONE, which a get ignores and
//! the job's deletion removes.

use super::{record_key, Sled, SledError};
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
        for id in ids {
            self.results
                .remove(record_key(id))
                .map_err(SledError::from)?;
        }
        Ok(())
    }
}
