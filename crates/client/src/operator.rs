//! The operator's calls on [`Client`]: cancel, pause and resume, queue
//! policies, delete and purge, schedules. Each needs a token with the `admin` role on the job's
//! (or schedule's) queue; listing schedules needs `read`.

use std::time::SystemTime;

use crate::{Client, Error, Result, Schedule};
use jobq::pb;

impl Client {
    /// Cancels a PENDING or RUNNING job: it becomes FAILED with
    /// `last_error = "cancelled: <reason>"`. A RUNNING job's holder is sent
    /// `revoked` on its Lease stream and its ack is refused. Returns the job.
    /// The reason is never refused: as a Fail's error, a NUL in it is kept
    /// as U+FFFD and the kept text is cut to the server's
    /// `--max-error-bytes`.
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
            .cancel_job(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        resp.job.ok_or(Error::MissingField("job"))
    }

    /// Pauses `queue`: nothing is taken from it until
    /// [`resume_queue`](Self::resume_queue); enqueues are still accepted and
    /// running jobs finish. Persisted by the server; idempotent.
    ///
    /// # Errors
    /// `RESOURCE_EXHAUSTED` when the server's `--max-paused-queues` queues
    /// are paused already and `queue` is not one of them.
    pub async fn pause_queue(&self, queue: impl Into<String>) -> Result<()> {
        let req = pb::PauseQueueRequest {
            queue: queue.into(),
        };
        self.inner()
            .pause_queue(self.request(req))
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    /// Sets how `queue`'s work is shaped: at most `max_running` of its
    /// jobs run at once over every server, and at most `group_max_running`
    /// of one group (1: each group's jobs one at a time, in enqueue
    /// order). A held job stays PENDING and keeps its place. An empty
    /// policy clears it. Persisted by the server.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a limit over 100,000, `RESOURCE_EXHAUSTED`
    /// when the server's `--max-queue-policies` queues have one already.
    pub async fn set_queue_policy(
        &self,
        queue: impl Into<String>,
        policy: crate::QueuePolicy,
    ) -> Result<()> {
        let req = pb::SetQueuePolicyRequest {
            queue: queue.into(),
            policy: Some(policy.into()),
        };
        self.inner()
            .set_queue_policy(self.request(req))
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    /// The policy of `queue` (empty when it has none).
    ///
    /// # Errors
    /// As any call: the server is out of reach, or the token may not read
    /// the queue.
    pub async fn queue_policy(&self, queue: impl Into<String>) -> Result<crate::QueuePolicy> {
        let req = pb::GetQueuePolicyRequest {
            queue: queue.into(),
        };
        let resp = self
            .inner()
            .get_queue_policy(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        Ok(resp.policy.map(Into::into).unwrap_or_default())
    }

    /// Deletes a PENDING, DONE or FAILED job for good (its key is free
    /// again).
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` for a RUNNING job (cancel it first),
    /// `NOT_FOUND` for an unknown one.
    pub async fn delete_job(&self, id: impl Into<String>) -> Result<()> {
        let req = pb::DeleteJobRequest { id: id.into() };
        self.inner()
            .delete_job(self.request(req))
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    /// Deletes the jobs of `queue` with `status` (DONE or FAILED; `None`:
    /// both) that finished before `finished_before` (`None`: now), or with
    /// `Some(JobStatus::Pending)` (and `finished_before` `None`) its
    /// PENDING jobs when the purge begins; returns how many. Never RUNNING
    /// jobs. Purged jobs free their keys.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for RUNNING, for PENDING with a
    /// `finished_before`, or a bad queue name.
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
        let resp = self
            .inner()
            .purge_jobs(self.request(req))
            .await
            .map_err(|s| self.error(s))?;
        Ok(resp.into_inner().deleted)
    }

    /// Resumes a paused `queue`; idempotent.
    pub async fn resume_queue(&self, queue: impl Into<String>) -> Result<()> {
        let req = pb::ResumeQueueRequest {
            queue: queue.into(),
        };
        self.inner()
            .resume_queue(self.request(req))
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    /// Creates a schedule, or replaces the one named `name`: every tick of
    /// `cron` (5 fields, or 6 with leading seconds), read in `timezone` (an
    /// IANA name; `None`: UTC), enqueues one job of `kind` with `payload`
    /// on `queue`, keyed `schedule:<name>:<tick time>`, so a tick is
    /// enqueued at most once across restarts and servers. `max_attempts`
    /// 0 means the server default. Returns it with its next run time.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a bad name, cron expression or time zone;
    /// `RESOURCE_EXHAUSTED` past the server's `--max-schedules`.
    #[allow(clippy::too_many_arguments)]
    pub async fn create_schedule(
        &self,
        name: impl Into<String>,
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: impl Into<Vec<u8>>,
        cron: impl Into<String>,
        timezone: Option<&str>,
        max_attempts: u32,
    ) -> Result<Schedule> {
        let req = pb::CreateScheduleRequest {
            name: name.into(),
            queue: queue.into(),
            kind: kind.into(),
            payload: payload.into(),
            cron: cron.into(),
            timezone: timezone.unwrap_or_default().to_owned(),
            max_attempts,
        };
        let resp = self
            .inner()
            .create_schedule(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        resp.schedule
            .map(Into::into)
            .ok_or(Error::MissingField("schedule"))
    }

    /// Deletes the schedule `name`: no further ticks (its jobs stay).
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown name.
    pub async fn delete_schedule(&self, name: impl Into<String>) -> Result<()> {
        let req = pb::DeleteScheduleRequest { name: name.into() };
        self.inner()
            .delete_schedule(self.request(req))
            .await
            .map_err(|s| self.error(s))?;
        Ok(())
    }

    /// Every schedule the caller may read, by name, with next run times.
    pub async fn list_schedules(&self) -> Result<Vec<Schedule>> {
        let req = pb::ListSchedulesRequest {};
        let resp = self
            .inner()
            .list_schedules(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        Ok(resp.schedules.into_iter().map(Into::into).collect())
    }
}
