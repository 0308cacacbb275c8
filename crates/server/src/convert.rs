//! Domain types to wire types (`jobq::pb`), in one file.
//!
//! Wire to domain goes through [`crate::validate`], because every incoming
//! value has to be checked before it becomes a domain value.

use std::time::{Duration, SystemTime};

use jobq::pb;

use crate::{
    job::{Attempt, Job, Leased, Outcome, Status},
    policy::{QueuePolicy, Rate},
    schedule::{Schedule, Timetable},
    store::QueueStats,
};

/// A wall-clock time as a protobuf `Timestamp`.
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

/// A length of time as a protobuf `Duration`.
pub fn duration(d: Duration) -> prost_types::Duration {
    // Every duration the server produces is far below i64 seconds.
    prost_types::Duration::try_from(d).unwrap_or(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 0,
    })
}

impl From<Status> for pb::JobStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Pending => pb::JobStatus::Pending,
            Status::Running => pb::JobStatus::Running,
            Status::Done => pb::JobStatus::Done,
            Status::Failed => pb::JobStatus::Failed,
        }
    }
}

impl From<Outcome> for pb::AttemptOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Acked => pb::AttemptOutcome::Acked,
            Outcome::Failed => pb::AttemptOutcome::Failed,
            Outcome::LeaseExpired => pb::AttemptOutcome::LeaseExpired,
            Outcome::WorkerDisconnected => pb::AttemptOutcome::WorkerDisconnected,
            Outcome::Revoked => pb::AttemptOutcome::Revoked,
            Outcome::Snoozed => pb::AttemptOutcome::Snoozed,
        }
    }
}

impl From<Attempt> for pb::Attempt {
    fn from(a: Attempt) -> Self {
        pb::Attempt {
            worker_id: a.worker_id,
            started_at: Some(timestamp(a.started_at)),
            ended_at: a.ended_at.map(timestamp),
            outcome: a
                .outcome
                .map_or(pb::AttemptOutcome::Unspecified, pb::AttemptOutcome::from)
                as i32,
            error: a.error.unwrap_or_default(),
        }
    }
}

impl From<Job> for pb::Job {
    fn from(job: Job) -> Self {
        let progress = job.progress_now().map(|p| pb::Progress {
            percent: p.percent,
            message: p.message.clone(),
            reported_at: Some(timestamp(p.reported_at)),
        });
        let (taken_at, lease_expires_at, worker_id) = match job.lease {
            Some(lease) => (
                Some(timestamp(lease.taken_at)),
                Some(timestamp(lease.expires_at)),
                lease.worker_id,
            ),
            None => (None, None, String::new()),
        };
        pb::Job {
            id: job.id.to_string(),
            queue: job.queue,
            kind: job.kind,
            payload: job.payload,
            key: job.key.unwrap_or_default(),
            status: pb::JobStatus::from(job.status) as i32,
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            priority: job.priority,
            enqueued_at: Some(timestamp(job.enqueued_at)),
            run_at: Some(timestamp(job.run_at)),
            taken_at,
            lease_expires_at,
            finished_at: job.finished_at.map(timestamp),
            worker_id,
            last_error: job.last_error.unwrap_or_default(),
            history: job.history.into_iter().map(pb::Attempt::from).collect(),
            metadata: job.metadata.into_iter().collect(),
            result: job.result.unwrap_or_default(),
            group: job.group.unwrap_or_default(),
            snoozes: job.snoozes,
            max_snoozes: job.max_snoozes,
            progress,
        }
    }
}

/// What an enqueue did, on the wire.
pub fn enqueue_outcome(e: &crate::store::Enqueued) -> pb::EnqueueOutcome {
    match (e.created, e.replaced) {
        (true, _) => pb::EnqueueOutcome::Created,
        (false, true) => pb::EnqueueOutcome::Replaced,
        (false, false) => pb::EnqueueOutcome::Existing,
    }
}

/// The job as a write's reply (Ack, Fail, Retry) carries it: no payload,
/// and only the latest attempt of its history. A reply never echoes the
/// request's bytes, so it cannot be too big to send once the change is
/// durable; GetJob has the whole job.
pub fn receipt(mut job: Job) -> pb::Job {
    job.payload = Vec::new();
    job.result = None;
    // Not read by every store's write path: a reply never shows it.
    job.progress = None;
    let keep = job.history.len().saturating_sub(1);
    job.history.drain(..keep);
    job.into()
}

/// The job as an enqueue's reply (Enqueue, EnqueueBatch) carries it: no
/// payload and no history, so a batch's reply stays small however big its
/// jobs (or the existing jobs its keys name) are.
pub fn enqueue_receipt(mut job: Job) -> pb::Job {
    job.payload = Vec::new();
    job.history = Vec::new();
    job.progress = None;
    job.into()
}

/// A schedule on the wire, with its next tick after `now`.
pub fn schedule(s: Schedule, now: SystemTime) -> pb::Schedule {
    let next = Timetable::of(&s).ok().and_then(|t| t.next_after(now));
    pb::Schedule {
        name: s.name,
        queue: s.queue,
        kind: s.kind,
        payload: s.payload,
        cron: s.cron,
        timezone: s.timezone,
        max_attempts: s.max_attempts,
        next_run_at: next.map(timestamp),
        last_run_at: s.last_tick.map(timestamp),
        created_at: Some(timestamp(s.created_at)),
    }
}

impl From<Leased> for pb::LeasedJob {
    fn from(mut l: Leased) -> Self {
        // A new attempt has none yet.
        l.job.progress = None;
        pb::LeasedJob {
            lease_id: l.lease_id.to_string(),
            lease_expires_at: Some(timestamp(l.expires_at)),
            job: Some(l.job.into()),
        }
    }
}

impl From<QueueStats> for pb::QueueStats {
    fn from(s: QueueStats) -> Self {
        pb::QueueStats {
            queue: s.queue,
            pending: s.pending,
            running: s.running,
            done: s.done,
            failed: s.failed,
            oldest_pending_age: s.oldest_pending_age.map(duration),
            paused: s.paused,
            policy: Some(s.policy.into()),
            held_max_running: s.held_max_running,
            held_group_max_running: s.held_group_max_running,
            held_rate: s.held_rate,
            held_group_rate: s.held_group_rate,
        }
    }
}

fn rate_limit(r: Rate) -> pb::RateLimit {
    pb::RateLimit {
        limit: r.limit,
        per: Some(duration(r.per)),
        burst: r.burst,
    }
}

impl From<QueuePolicy> for pb::QueuePolicy {
    fn from(p: QueuePolicy) -> Self {
        pb::QueuePolicy {
            max_running: p.max_running,
            group_max_running: p.group_max_running,
            rate: p.rate.map(rate_limit),
            group_rate: p.group_rate.map(rate_limit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobId, Lease, LeaseId};

    #[test]
    fn a_running_job_carries_its_lease_on_the_wire() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let job = Job {
            id: JobId(7),
            queue: "emails".into(),
            kind: "send-email".into(),
            payload: b"{}".to_vec(),
            key: Some("order-4711".into()),
            status: Status::Running,
            attempts: 1,
            max_attempts: 3,
            priority: 7,
            enqueued_at: now,
            run_at: now,
            lease: Some(Lease {
                id: LeaseId(9),
                worker_id: "w1".into(),
                taken_at: now,
                expires_at: now + Duration::from_secs(30),
                duration: Duration::from_secs(30),
                owner: None,
            }),
            finished_at: None,
            last_error: Some("lease expired".into()),
            history: vec![],
            result: None,
            progress: None,
            group: Some("tenant-7".into()),
            snoozes: 2,
            max_snoozes: 5,
            metadata: [(
                "traceparent".into(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            )]
            .into(),
        };
        let wire = pb::LeasedJob::from(Leased::of(job).expect("running"));
        assert_eq!(wire.lease_id, "9");
        let job = wire.job.expect("job");
        assert_eq!(job.id, "7");
        assert_eq!(job.key, "order-4711");
        assert_eq!(job.group, "tenant-7");
        assert_eq!((job.snoozes, job.max_snoozes), (2, 5));
        assert_eq!(job.status, pb::JobStatus::Running as i32);
        assert_eq!(job.worker_id, "w1");
        assert_eq!(job.priority, 7);
        assert_eq!(job.lease_expires_at.map(|t| t.seconds), Some(1_700_000_030));
        assert_eq!(job.metadata.len(), 1, "metadata goes out as it came in");
    }
}
