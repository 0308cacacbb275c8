//! The client's own types for what the server returns: [`Job`] (with its
//! [`JobId`], [`Status`] and [`Attempt`]s), [`QueueStats`], and the results
//! of an enqueue ([`Enqueued`], [`Rejected`]). Each converts from its
//! `pb` message, and back with `into_proto`, for code that needs the wire
//! form.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use jobq::pb;

/// A job's id, as the server assigned it. Opaque: compare and print it,
/// pass it back; do not parse it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct JobId(String);

impl JobId {
    /// Wraps an id read from elsewhere (a log line, a command line).
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for JobId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<String> for JobId {
    fn from(id: String) -> Self {
        Self(id)
    }
}

impl From<&str> for JobId {
    fn from(id: &str) -> Self {
        Self(id.to_owned())
    }
}

impl From<JobId> for String {
    /// So a `JobId` goes wherever the client takes `impl Into<String>`.
    fn from(id: JobId) -> Self {
        id.0
    }
}

impl From<&JobId> for String {
    fn from(id: &JobId) -> Self {
        id.0.clone()
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Waiting to be taken (possibly not before its `run_at`).
    Pending,
    /// Leased to a worker.
    Running,
    /// Acknowledged. Final.
    Done,
    /// Attempts exhausted, fatal failure or cancelled: a dead letter until
    /// retried.
    Failed,
    /// A value this client does not know (a newer server).
    Unknown(i32),
}

impl Status {
    /// The wire value.
    pub fn to_proto(self) -> i32 {
        match self {
            Status::Pending => pb::JobStatus::Pending as i32,
            Status::Running => pb::JobStatus::Running as i32,
            Status::Done => pb::JobStatus::Done as i32,
            Status::Failed => pb::JobStatus::Failed as i32,
            Status::Unknown(v) => v,
        }
    }

    /// Whether the job will not change again unless someone retries it.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Done | Status::Failed)
    }
}

impl From<i32> for Status {
    fn from(v: i32) -> Self {
        match pb::JobStatus::try_from(v) {
            Ok(pb::JobStatus::Pending) => Status::Pending,
            Ok(pb::JobStatus::Running) => Status::Running,
            Ok(pb::JobStatus::Done) => Status::Done,
            Ok(pb::JobStatus::Failed) => Status::Failed,
            _ => Status::Unknown(v),
        }
    }
}

impl From<pb::JobStatus> for Status {
    fn from(s: pb::JobStatus) -> Self {
        Status::from(s as i32)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Pending => f.write_str("pending"),
            Status::Running => f.write_str("running"),
            Status::Done => f.write_str("done"),
            Status::Failed => f.write_str("failed"),
            Status::Unknown(v) => write!(f, "unknown({v})"),
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Still running (only the last attempt of a RUNNING job).
    Running,
    /// The worker acknowledged the job.
    Acked,
    /// The worker reported a failure.
    Failed,
    /// The lease ran out without an ack or heartbeat.
    LeaseExpired,
    /// The worker's Lease stream ended (process died, connection lost).
    WorkerDisconnected,
    /// An operator (CancelJob) or the server took the lease back.
    Revoked,
    /// The worker put the job back without counting the attempt (a snooze).
    Snoozed,
    /// A value this client does not know (a newer server).
    Unknown(i32),
}

impl Outcome {
    /// The wire value.
    pub fn to_proto(self) -> i32 {
        use pb::AttemptOutcome as O;
        match self {
            Outcome::Running => O::Unspecified as i32,
            Outcome::Acked => O::Acked as i32,
            Outcome::Failed => O::Failed as i32,
            Outcome::LeaseExpired => O::LeaseExpired as i32,
            Outcome::WorkerDisconnected => O::WorkerDisconnected as i32,
            Outcome::Revoked => O::Revoked as i32,
            Outcome::Snoozed => O::Snoozed as i32,
            Outcome::Unknown(v) => v,
        }
    }
}

impl From<i32> for Outcome {
    fn from(v: i32) -> Self {
        use pb::AttemptOutcome as O;
        match O::try_from(v) {
            Ok(O::Unspecified) => Outcome::Running,
            Ok(O::Acked) => Outcome::Acked,
            Ok(O::Failed) => Outcome::Failed,
            Ok(O::LeaseExpired) => Outcome::LeaseExpired,
            Ok(O::WorkerDisconnected) => Outcome::WorkerDisconnected,
            Ok(O::Revoked) => Outcome::Revoked,
            Ok(O::Snoozed) => Outcome::Snoozed,
            Err(_) => Outcome::Unknown(v),
        }
    }
}

/// One run of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The worker that ran it.
    pub worker_id: String,
    /// When its lease began.
    pub started_at: Option<SystemTime>,
    /// When it ended; `None` while it runs.
    pub ended_at: Option<SystemTime>,
    /// How it ended.
    pub outcome: Outcome,
    /// The error, for an attempt that ended badly.
    pub error: Option<String>,
}

impl Attempt {
    /// How long it ran, once it has ended.
    pub fn duration(&self) -> Option<Duration> {
        self.ended_at?.duration_since(self.started_at?).ok()
    }

    /// The wire form.
    pub fn into_proto(self) -> pb::Attempt {
        pb::Attempt {
            worker_id: self.worker_id,
            started_at: self.started_at.map(Into::into),
            ended_at: self.ended_at.map(Into::into),
            outcome: self.outcome.to_proto(),
            error: self.error.unwrap_or_default(),
        }
    }
}

impl From<pb::Attempt> for Attempt {
    fn from(a: pb::Attempt) -> Self {
        Self {
            worker_id: a.worker_id,
            started_at: time(a.started_at),
            ended_at: time(a.ended_at),
            outcome: Outcome::from(a.outcome),
            error: non_empty(a.error),
        }
    }
}

/// A job and everything the queue remembers about it.
///
/// Replies to writes (enqueue, ack, fail) leave out the payload and most of
/// the history, as the wire contract says; [`Client::job`](crate::Client::job)
/// has the whole job.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Job {
    /// Assigned by the server; unique, never reused.
    pub id: JobId,
    /// The queue it waits in.
    pub queue: String,
    /// Which handler runs it.
    pub kind: String,
    /// Bytes for the handler.
    pub payload: Vec<u8>,
    /// The domain key (e.g. `order-4711`), if it was enqueued with one.
    pub key: Option<String>,
    /// Where it is in its life.
    pub status: Status,
    /// Runs that ended without an ack.
    pub attempts: u32,
    /// Attempts allowed before it is dead-lettered.
    pub max_attempts: u32,
    /// Delivery priority, -100..=100: among a queue's due jobs, higher
    /// goes first.
    pub priority: i32,
    /// When it was enqueued.
    pub enqueued_at: Option<SystemTime>,
    /// Not to be run before this time.
    pub run_at: Option<SystemTime>,
    /// When the current lease began (RUNNING only).
    pub taken_at: Option<SystemTime>,
    /// When the current lease ends unless extended (RUNNING only).
    pub lease_expires_at: Option<SystemTime>,
    /// When it became DONE or FAILED.
    pub finished_at: Option<SystemTime>,
    /// The worker holding it (RUNNING only).
    pub worker_id: Option<String>,
    /// Why the last attempt ended badly (`cancelled: <reason>` after a
    /// cancel).
    pub last_error: Option<String>,
    /// One entry per attempt, oldest first.
    pub history: Vec<Attempt>,
    /// What the producer attached at enqueue (trace context, request ids).
    pub metadata: HashMap<String, String>,
    /// What the worker stored with its ack (a DONE job's output). Only
    /// [`Client::job`](crate::Client::job) reads it; lists leave it out.
    pub result: Option<Vec<u8>>,
    /// The group it was enqueued in (a tenant, a customer), if any.
    pub group: Option<String>,
    /// Snoozes since enqueue (or the last retry): runs its handlers put
    /// back without counting them as attempts.
    pub snoozes: u32,
    /// Snoozes allowed; a snooze past them counts as a failed attempt.
    pub max_snoozes: u32,
    /// The latest progress its handler reported in the job's latest
    /// attempt ([`JobContext::progress`](crate::JobContext::progress)), if
    /// any. Kept after the job ends.
    pub progress: Option<Progress>,
}

/// How far a job has come, as its handler reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// 0 to 100.
    pub percent: u32,
    /// What the handler said, e.g. "row 4,000 of 10,000".
    pub message: String,
    /// When the server took the report.
    pub reported_at: Option<SystemTime>,
}

impl Job {
    /// The result decoded from JSON (`None`: the job has none).
    ///
    /// # Errors
    /// When the result is not a `T`.
    pub fn result_json<T: serde::de::DeserializeOwned>(&self) -> Option<serde_json::Result<T>> {
        self.result.as_deref().map(serde_json::from_slice)
    }

    /// The payload decoded from JSON.
    ///
    /// # Errors
    /// When the payload is not a `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.payload)
    }

    /// The wire form. Fields this client does not model (from a newer
    /// proto) are not kept: use the `pb` methods of [`Client`](crate::Client)
    /// when you need them.
    // All fields are set today; the update keeps this compiling when the
    // proto grows one.
    #[allow(clippy::needless_update)]
    pub fn into_proto(self) -> pb::Job {
        pb::Job {
            id: self.id.0,
            queue: self.queue,
            kind: self.kind,
            payload: self.payload,
            key: self.key.unwrap_or_default(),
            status: self.status.to_proto(),
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            priority: self.priority,
            enqueued_at: self.enqueued_at.map(Into::into),
            run_at: self.run_at.map(Into::into),
            taken_at: self.taken_at.map(Into::into),
            lease_expires_at: self.lease_expires_at.map(Into::into),
            finished_at: self.finished_at.map(Into::into),
            worker_id: self.worker_id.unwrap_or_default(),
            last_error: self.last_error.unwrap_or_default(),
            history: self.history.into_iter().map(Attempt::into_proto).collect(),
            metadata: self.metadata,
            result: self.result.unwrap_or_default(),
            group: self.group.unwrap_or_default(),
            snoozes: self.snoozes,
            max_snoozes: self.max_snoozes,
            progress: self.progress.map(|p| pb::Progress {
                percent: p.percent,
                message: p.message,
                reported_at: p.reported_at.map(Into::into),
            }),
            ..Default::default()
        }
    }
}

impl From<pb::Job> for Job {
    fn from(j: pb::Job) -> Self {
        Self {
            id: JobId(j.id),
            queue: j.queue,
            kind: j.kind,
            payload: j.payload,
            key: non_empty(j.key),
            status: Status::from(j.status),
            attempts: j.attempts,
            max_attempts: j.max_attempts,
            priority: j.priority,
            enqueued_at: time(j.enqueued_at),
            run_at: time(j.run_at),
            taken_at: time(j.taken_at),
            lease_expires_at: time(j.lease_expires_at),
            finished_at: time(j.finished_at),
            worker_id: non_empty(j.worker_id),
            last_error: non_empty(j.last_error),
            history: j.history.into_iter().map(Attempt::from).collect(),
            metadata: j.metadata,
            result: Some(j.result).filter(|r| !r.is_empty()),
            group: non_empty(j.group),
            snoozes: j.snoozes,
            max_snoozes: j.max_snoozes,
            progress: j.progress.map(|p| Progress {
                percent: p.percent,
                message: p.message,
                reported_at: time(p.reported_at),
            }),
        }
    }
}

impl From<Job> for pb::Job {
    fn from(j: Job) -> Self {
        j.into_proto()
    }
}

/// What one enqueue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// The job: the new one, or the one that holds the key.
    pub job: Job,
    /// `false` when the key matched a job that holds it and nothing was
    /// added.
    pub created: bool,
    /// What the enqueue did: created a job, met one that holds the key,
    /// or replaced that one's payload ([`EnqueueOptions::replace`](crate::EnqueueOptions::replace)).
    pub outcome: EnqueueOutcome,
}

/// What one enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EnqueueOutcome {
    /// A new job.
    Created,
    /// A job held the key and is returned unchanged.
    Existing,
    /// A PENDING job held the key and took this enqueue's payload,
    /// metadata and due time.
    Replaced,
}

impl EnqueueOutcome {
    /// From the wire (a server from before outcomes sends none: `created`
    /// says then).
    pub fn of(outcome: i32, created: bool) -> EnqueueOutcome {
        match pb::EnqueueOutcome::try_from(outcome) {
            Ok(pb::EnqueueOutcome::Replaced) => EnqueueOutcome::Replaced,
            Ok(pb::EnqueueOutcome::Existing) => EnqueueOutcome::Existing,
            Ok(pb::EnqueueOutcome::Created) => EnqueueOutcome::Created,
            _ if created => EnqueueOutcome::Created,
            _ => EnqueueOutcome::Existing,
        }
    }
}

/// Which jobs hold their key against a later enqueue of it
/// ([`EnqueueOptions::key_scope`](crate::EnqueueOptions::key_scope)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KeyScope {
    /// Every retained job, finished or not (the default).
    #[default]
    Retained,
    /// PENDING and RUNNING jobs: "unique until finished".
    Active,
}

/// Why the server refused one entry of a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rejected ({code:?}): {message}")]
pub struct Rejected {
    /// The gRPC code (e.g. `InvalidArgument`).
    pub code: tonic::Code,
    /// Why.
    pub message: String,
}

impl Enqueued {
    /// One entry of an `EnqueueBatch` reply.
    pub(crate) fn from_result(r: pb::EnqueueResult) -> Result<Self, Rejected> {
        match r.job {
            Some(job) if r.error_code == 0 => Ok(Enqueued {
                job: job.into(),
                created: r.created,
                outcome: EnqueueOutcome::of(r.outcome, r.created),
            }),
            _ => Err(Rejected {
                code: tonic::Code::from(r.error_code),
                message: r.error_message,
            }),
        }
    }
}

/// Counts for one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// The queue's name.
    pub queue: String,
    /// Jobs PENDING (due or not yet due).
    pub pending: u64,
    /// Jobs RUNNING.
    pub running: u64,
    /// Jobs DONE and still retained.
    pub done: u64,
    /// Jobs FAILED (dead letters).
    pub failed: u64,
    /// How long the oldest due PENDING job has waited; `None` when none is
    /// due.
    pub oldest_pending_age: Option<Duration>,
    /// Whether the queue is paused.
    pub paused: bool,
    /// The queue's policy (all zero: none).
    pub policy: QueuePolicy,
    /// Due PENDING jobs held back because the queue runs `max_running`.
    pub held_max_running: u64,
    /// Due PENDING jobs held back by `group_max_running`.
    pub held_group_max_running: u64,
    /// Due PENDING jobs held back because the rate limit has no token.
    pub held_rate: u64,
    /// Due PENDING jobs held back because their group's rate limit has no
    /// token.
    pub held_group_rate: u64,
}

/// How a queue's work is shaped; zero means no limit
/// ([`Client::set_queue_policy`](crate::Client::set_queue_policy)).
///
/// ```
/// use jobq_client::QueuePolicy;
///
/// // At most 10 at once, and each customer's jobs one at a time, in order.
/// let policy = QueuePolicy::new().max_running(10).group_max_running(1);
/// assert_eq!(policy.max_running, 10);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuePolicy {
    /// RUNNING jobs of the queue at once, over every server.
    pub max_running: u32,
    /// RUNNING jobs of one group at once; 1 runs each group's jobs one at
    /// a time, in enqueue order.
    pub group_max_running: u32,
    /// Takes of the queue's jobs per period, over every server.
    pub rate: Option<RateLimit>,
    /// Takes of one group's jobs per period, over every server.
    pub group_rate: Option<RateLimit>,
}

/// A token bucket: `limit` takes per `per`, at most `burst` at once
/// (0: `limit`).
///
/// ```
/// use std::time::Duration;
/// use jobq_client::{QueuePolicy, RateLimit};
///
/// // 100 a second, never more than 10 at once.
/// let policy = QueuePolicy::new().rate(RateLimit::new(100, Duration::from_secs(1)).burst(10));
/// assert_eq!(policy.rate.unwrap().limit, 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    /// Tokens per period (1..=1,000,000).
    pub limit: u32,
    /// The period (1 ms to 1 day).
    pub per: Duration,
    /// The bucket's size; 0 means `limit`.
    pub burst: u32,
}

impl RateLimit {
    /// `limit` takes per `per`, as many at once as `limit`.
    pub fn new(limit: u32, per: Duration) -> Self {
        Self {
            limit,
            per,
            burst: 0,
        }
    }

    /// Sets the bucket's size: how many may go at once after a quiet spell.
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }
}

impl QueuePolicy {
    /// No limits (setting it clears a queue's policy).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `max_running`.
    pub fn max_running(mut self, n: u32) -> Self {
        self.max_running = n;
        self
    }

    /// Sets `group_max_running`.
    pub fn group_max_running(mut self, n: u32) -> Self {
        self.group_max_running = n;
        self
    }

    /// Sets the rate limit.
    pub fn rate(mut self, rate: RateLimit) -> Self {
        self.rate = Some(rate);
        self
    }

    /// Sets the rate limit of each group.
    pub fn group_rate(mut self, rate: RateLimit) -> Self {
        self.group_rate = Some(rate);
        self
    }

    /// Whether it limits nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl RateLimit {
    fn of(r: Option<pb::RateLimit>) -> Option<RateLimit> {
        r.filter(|r| r.limit > 0).map(|r| RateLimit {
            limit: r.limit,
            per: r
                .per
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default(),
            burst: r.burst,
        })
    }

    fn to_proto(self) -> pb::RateLimit {
        pb::RateLimit {
            limit: self.limit,
            per: prost_types::Duration::try_from(self.per).ok(),
            burst: self.burst,
        }
    }
}

impl From<pb::QueuePolicy> for QueuePolicy {
    fn from(p: pb::QueuePolicy) -> Self {
        Self {
            max_running: p.max_running,
            group_max_running: p.group_max_running,
            rate: RateLimit::of(p.rate),
            group_rate: RateLimit::of(p.group_rate),
        }
    }
}

impl From<QueuePolicy> for pb::QueuePolicy {
    fn from(p: QueuePolicy) -> Self {
        pb::QueuePolicy {
            max_running: p.max_running,
            group_max_running: p.group_max_running,
            rate: p.rate.map(RateLimit::to_proto),
            group_rate: p.group_rate.map(RateLimit::to_proto),
        }
    }
}

impl From<pb::QueueStats> for QueueStats {
    fn from(s: pb::QueueStats) -> Self {
        Self {
            queue: s.queue,
            pending: s.pending,
            running: s.running,
            done: s.done,
            failed: s.failed,
            oldest_pending_age: s
                .oldest_pending_age
                .and_then(|d| Duration::try_from(d).ok()),
            paused: s.paused,
            policy: s.policy.map(Into::into).unwrap_or_default(),
            held_max_running: s.held_max_running,
            held_group_max_running: s.held_group_max_running,
            held_rate: s.held_rate,
            held_group_rate: s.held_group_rate,
        }
    }
}

/// A schedule: one job enqueued on every tick of a cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Schedule {
    /// Its name; its jobs are keyed `schedule:<name>:<tick time>`.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// Their kind.
    pub kind: String,
    /// Their payload.
    pub payload: Vec<u8>,
    /// The cron expression (5 fields, or 6 with leading seconds).
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub timezone: String,
    /// Attempts each job gets.
    pub max_attempts: u32,
    /// When the next tick is due; `None` when the expression has no future
    /// tick.
    pub next_run_at: Option<SystemTime>,
    /// The latest tick enqueued; `None` before the first.
    pub last_run_at: Option<SystemTime>,
    /// When it was created or last replaced.
    pub created_at: Option<SystemTime>,
}

impl From<pb::Schedule> for Schedule {
    fn from(s: pb::Schedule) -> Self {
        Self {
            name: s.name,
            queue: s.queue,
            kind: s.kind,
            payload: s.payload,
            cron: s.cron,
            timezone: s.timezone,
            max_attempts: s.max_attempts,
            next_run_at: time(s.next_run_at),
            last_run_at: time(s.last_run_at),
            created_at: time(s.created_at),
        }
    }
}

fn time(ts: Option<prost_types::Timestamp>) -> Option<SystemTime> {
    ts.and_then(|ts| SystemTime::try_from(ts).ok())
}

fn non_empty(s: String) -> Option<String> {
    Some(s).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(seconds: i64, nanos: i32) -> Option<prost_types::Timestamp> {
        Some(prost_types::Timestamp { seconds, nanos })
    }

    #[test]
    #[allow(clippy::needless_update)] // robust to new proto fields
    fn a_job_converts_both_ways_without_loss() {
        let raw = pb::Job {
            id: "00000007".into(),
            queue: "emails".into(),
            kind: "send-email".into(),
            payload: b"{}".to_vec(),
            key: "order-4711".into(),
            status: pb::JobStatus::Running as i32,
            attempts: 1,
            max_attempts: 5,
            priority: -7,
            enqueued_at: ts(1_700_000_000, 5),
            run_at: ts(1_700_000_001, 0),
            taken_at: ts(1_700_000_002, 0),
            lease_expires_at: ts(1_700_000_032, 0),
            finished_at: None,
            worker_id: "w1".into(),
            last_error: "smtp 421".into(),
            history: vec![
                pb::Attempt {
                    worker_id: "w0".into(),
                    started_at: ts(1_700_000_001, 0),
                    ended_at: ts(1_700_000_001, 500_000_000),
                    outcome: pb::AttemptOutcome::Failed as i32,
                    error: "smtp 421".into(),
                },
                pb::Attempt {
                    worker_id: "w1".into(),
                    started_at: ts(1_700_000_002, 0),
                    ..Default::default()
                },
            ],
            metadata: [("tenant".to_owned(), "acme".to_owned())].into(),
            ..Default::default()
        };
        let job = Job::from(raw.clone());
        assert_eq!(job.id.as_str(), "00000007");
        assert_eq!(job.status, Status::Running);
        assert_eq!(job.priority, -7);
        assert_eq!(job.key.as_deref(), Some("order-4711"));
        assert_eq!(
            job.enqueued_at,
            Some(SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5))
        );
        assert_eq!(job.finished_at, None);
        assert_eq!(job.history[0].outcome, Outcome::Failed);
        assert_eq!(job.history[0].duration(), Some(Duration::from_millis(500)));
        assert_eq!(job.history[1].outcome, Outcome::Running);
        assert_eq!(job.history[1].ended_at, None);
        assert_eq!(job.history[1].error, None);
        assert_eq!(job.into_proto(), raw);
    }

    #[test]
    fn empty_strings_are_none_and_unknown_values_survive() {
        let job = Job::from(pb::Job {
            status: 42,
            ..Default::default()
        });
        assert_eq!(
            (
                job.key.clone(),
                job.worker_id.clone(),
                job.last_error.clone()
            ),
            (None, None, None)
        );
        assert_eq!(job.status, Status::Unknown(42));
        assert_eq!(job.into_proto().status, 42);
        assert_eq!(Status::from(pb::JobStatus::Done).to_string(), "done");
        assert!(Status::Failed.is_final() && !Status::Pending.is_final());
    }

    #[test]
    fn batch_results_split_into_ok_and_rejected() {
        let ok = Enqueued::from_result(pb::EnqueueResult {
            job: Some(pb::Job {
                id: "1".into(),
                ..Default::default()
            }),
            created: true,
            ..Default::default()
        })
        .unwrap();
        assert!(ok.created);
        assert_eq!(ok.job.id, JobId::from("1"));
        let bad = Enqueued::from_result(pb::EnqueueResult {
            error_code: 3,
            error_message: "bad queue".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(bad.code, tonic::Code::InvalidArgument);
        assert_eq!(bad.to_string(), "rejected (InvalidArgument): bad queue");
    }

    #[test]
    fn stats_carry_a_typed_age() {
        let s = QueueStats::from(pb::QueueStats {
            queue: "q".into(),
            pending: 3,
            oldest_pending_age: Some(prost_types::Duration {
                seconds: 2,
                nanos: 0,
            }),
            paused: true,
            ..Default::default()
        });
        assert_eq!(s.oldest_pending_age, Some(Duration::from_secs(2)));
        assert!(s.paused);
    }
}
