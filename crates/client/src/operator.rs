//! The operator's calls on [`Client`]: cancel, pause and resume, delete and
//! purge. Each needs a token with the `admin` role on the job's queue.

use std::time::SystemTime;

use crate::{trace, Client, Error, Result};
use jobq::pb;

impl Client {
    /// Cancels a PENDING or RUNNING job: it becomes FAILED with
    /// `last_error = "cancelled: <reason>"`. A RUNNING job's holder is sent
    /// `revoked` on its Lease stream and its ack is refused. Returns the job.
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` when the job is DONE or FAILED, `NOT_FOUND`
    /// when there is no such job.
    pub async fn cancel_job(
        &self,
        id: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<pb::Job> {
        let req = pb::CancelJobRequest {
            id: id.into(),
            reason: reason.into(),
        };
        let resp = self
            .inner()
            .cancel_job(trace::request(req))
            .await?
            .into_inner();
        resp.job.ok_or(Error::MissingField("job"))
    }

    /// Pauses `queue`: nothing is taken from it until
    /// [`resume_queue`](Self::resume_queue); enqueues are still accepted and
    /// running jobs finish. Persisted by the server; idempotent.
    pub async fn pause_queue(&self, queue: impl Into<String>) -> Result<()> {
        let req = pb::PauseQueueRequest {
            queue: queue.into(),
        };
        self.inner().pause_queue(trace::request(req)).await?;
        Ok(())
    }

    /// Deletes a PENDING, DONE or FAILED job for good (its key is free
    /// again).
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` for a RUNNING job (cancel it first),
    /// `NOT_FOUND` for an unknown one.
    pub async fn delete_job(&self, id: impl Into<String>) -> Result<()> {
        let req = pb::DeleteJobRequest { id: id.into() };
        self.inner().delete_job(trace::request(req)).await?;
        Ok(())
    }

    /// Deletes the jobs of `queue` with `status` (DONE or FAILED; `None`:
    /// both) that finished before `finished_before` (`None`: now); returns
    /// how many. Never PENDING or RUNNING jobs.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for another status or a bad queue name.
    pub async fn purge_jobs(
        &self,
        queue: impl Into<String>,
        status: Option<pb::JobStatus>,
        finished_before: Option<SystemTime>,
    ) -> Result<u64> {
        let req = pb::PurgeJobsRequest {
            queue: queue.into(),
            status: status.unwrap_or(pb::JobStatus::Unspecified) as i32,
            finished_before: finished_before.map(Into::into),
        };
        let resp = self.inner().purge_jobs(trace::request(req)).await?;
        Ok(resp.into_inner().deleted)
    }

    /// Resumes a paused `queue`; idempotent.
    pub async fn resume_queue(&self, queue: impl Into<String>) -> Result<()> {
        let req = pb::ResumeQueueRequest {
            queue: queue.into(),
        };
        self.inner().resume_queue(trace::request(req)).await?;
        Ok(())
    }
}
