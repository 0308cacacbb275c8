//! The job and the values it carries, as the server's domain types.
//!
//! These are what the state machine and the stores work on; `convert.rs`
//! maps them to and from the wire types in `jobq::pb`.

use std::{fmt, str::FromStr, time::Duration, time::SystemTime};

use serde::{Deserialize, Serialize};

/// A job's id: a server-assigned number, unique and never reused.
///
/// On the wire it is the decimal string of the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An id that is not a decimal number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed id {0:?}: expected a decimal number")]
pub struct ParseIdError(pub String);

/// Parses the decimal form of an id: digits only (no sign, no spaces, no
/// leading zeros).
fn parse_id(s: &str) -> Result<u64, ParseIdError> {
    // Canonical form only ("7", not "007"), so an id always reads back as
    // it was written.
    let canonical = s == "0" || !s.starts_with('0');
    if s.is_empty() || s.len() > 20 || !canonical || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseIdError(s.chars().take(40).collect()));
    }
    s.parse().map_err(|_| ParseIdError(s.to_owned()))
}

impl FromStr for JobId {
    type Err = ParseIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_id(s).map(JobId)
    }
}

/// A lease's fencing token. Every lease gets a fresh one, so a worker whose
/// lease was taken away cannot complete a job that was leased again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for LeaseId {
    type Err = ParseIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_id(s).map(LeaseId)
    }
}

/// Where a job is in its life (docs/src/design.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Status {
    /// Waiting to be taken, not before `run_at`.
    Pending,
    /// Leased to a worker.
    Running,
    /// Acknowledged; final.
    Done,
    /// Attempts exhausted: a dead letter until retried.
    Failed,
}

impl Status {
    /// All statuses, in display order.
    pub const ALL: [Status; 4] = [
        Status::Pending,
        Status::Running,
        Status::Done,
        Status::Failed,
    ];

    /// The status's name as stored (PostgreSQL), notified and counted:
    /// `pending`, … The one place these names are written.
    pub fn label(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Done => "done",
            Status::Failed => "failed",
        }
    }

    /// The status a [`label`](Self::label) names.
    pub fn from_label(label: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.label() == label)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pending => "PENDING",
            Status::Running => "RUNNING",
            Status::Done => "DONE",
            Status::Failed => "FAILED",
        })
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// The worker acknowledged the job.
    Acked,
    /// The worker reported a failure.
    Failed,
    /// The lease ran out.
    LeaseExpired,
    /// The worker's Lease stream ended.
    WorkerDisconnected,
    /// The lease was taken back by an operator or the server.
    Revoked,
    /// The worker put the job back (a snooze): not a failure, and not
    /// counted as an attempt.
    Snoozed,
}

impl Outcome {
    /// The `last_error` text for outcomes the server decides on its own.
    pub fn reason(self) -> &'static str {
        match self {
            Outcome::Acked => "acked",
            Outcome::Failed => "failed",
            Outcome::LeaseExpired => "lease expired",
            Outcome::WorkerDisconnected => "worker disconnected",
            Outcome::Revoked => "revoked",
            Outcome::Snoozed => "snoozed",
        }
    }

    /// The outcome's name as stored (PostgreSQL) and notified:
    /// `lease_expired`, … The one place these names are written.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Acked => "acked",
            Outcome::Failed => "failed",
            Outcome::LeaseExpired => "lease_expired",
            Outcome::WorkerDisconnected => "worker_disconnected",
            Outcome::Revoked => "revoked",
            Outcome::Snoozed => "snoozed",
        }
    }

    /// The outcome a [`label`](Self::label) names.
    pub fn from_label(label: &str) -> Option<Outcome> {
        [
            Outcome::Acked,
            Outcome::Failed,
            Outcome::LeaseExpired,
            Outcome::WorkerDisconnected,
            Outcome::Revoked,
            Outcome::Snoozed,
        ]
        .into_iter()
        .find(|o| o.label() == label)
    }
}

/// One run of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The lease it ran under; lets the machine tell a repeated ack from a
    /// stale one.
    pub lease_id: LeaseId,
    /// The worker that ran it.
    pub worker_id: String,
    /// When the lease began.
    pub started_at: SystemTime,
    /// When the attempt ended; `None` while it runs.
    pub ended_at: Option<SystemTime>,
    /// How it ended; `None` while it runs.
    pub outcome: Option<Outcome>,
    /// The error of an attempt that ended badly.
    pub error: Option<String>,
}

/// The lease of a RUNNING job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The fencing token.
    pub id: LeaseId,
    /// Who holds it.
    pub worker_id: String,
    /// When it began.
    pub taken_at: SystemTime,
    /// When it ends unless extended.
    pub expires_at: SystemTime,
    /// Its length, reused by heartbeats that do not say how far to extend.
    pub duration: Duration,
    /// The name of the token that took it (`None` when tokens are off):
    /// only that token may ack, fail or extend it.
    #[serde(default)]
    pub owner: Option<String>,
}

/// A job and everything the queue remembers about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Unique id; also the enqueue order.
    pub id: JobId,
    /// The queue it waits in.
    pub queue: String,
    /// Which handler runs it.
    pub kind: String,
    /// Handler input. Bytes, not a sequence of `u8`s to serde: postcard
    /// writes both alike (a length, then the bytes), but reads bytes in one
    /// copy instead of one call per byte.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Optional domain key, unique per queue among retained jobs.
    pub key: Option<String>,
    /// Current status.
    pub status: Status,
    /// Runs that ended without an ack.
    pub attempts: u32,
    /// Attempts allowed before FAILED.
    pub max_attempts: u32,
    /// Delivery priority, [`PRIORITY_MIN`]..=[`PRIORITY_MAX`]: among due
    /// jobs of a queue, higher first (docs/src/design.md §1 rule 5).
    pub priority: i32,
    /// When it was enqueued.
    pub enqueued_at: SystemTime,
    /// Not to be run before this time; after `priority` and before `id`,
    /// the delivery order.
    pub run_at: SystemTime,
    /// Set exactly while RUNNING.
    pub lease: Option<Lease>,
    /// When it became DONE or FAILED.
    pub finished_at: Option<SystemTime>,
    /// Why the last attempt ended badly.
    pub last_error: Option<String>,
    /// One entry per attempt, oldest first.
    pub history: Vec<Attempt>,
    /// What the producer attached: trace context, request ids, tags.
    pub metadata: Metadata,
    /// The partition within the queue (a tenant, a customer) that a queue
    /// policy's `group_max_running` limits; `None`: no group.
    pub group: Option<String>,
    /// Snoozes since enqueue (or the last operator retry): runs its worker
    /// put back without counting them as attempts.
    pub snoozes: u32,
    /// Snoozes allowed; a snooze past them counts as a failed attempt.
    pub max_snoozes: u32,
    /// What the worker's ack stored, DONE jobs only. Kept apart from the
    /// job's record (a sled tree, a PostgreSQL table of its own), so only
    /// a get reads it; `None` wherever it was not read (lists, takes, the
    /// loads of a change), and never part of a record's encoding.
    #[serde(skip)]
    pub result: Option<Vec<u8>>,
    /// The latest progress a worker reported with a heartbeat, under
    /// whichever lease: [`Job::progress_now`] is the one to show. Kept
    /// apart from a sled record (the `progress` tree), so never part of a
    /// record's encoding, and `None` in sled's loads of a change, which
    /// never clear it; in PostgreSQL's `extra` column, loaded with the row.
    #[serde(skip)]
    pub progress: Option<Progress>,
}

/// A running job's progress, as its worker reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// 0 to 100.
    pub percent: u32,
    /// What the worker says, at most `--max-progress-message-bytes`.
    pub message: String,
    /// When the report was applied.
    pub reported_at: SystemTime,
    /// The lease it was reported under.
    pub lease_id: LeaseId,
}

/// A progress report as a heartbeat carries it, before it is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// 0 to 100.
    pub percent: u32,
    /// What the worker says.
    pub message: String,
}

/// The snoozes a job may take when its enqueue does not say
/// (docs/src/design.md §1 rule 3).
pub const DEFAULT_MAX_SNOOZES: u32 = 100;

/// The lowest priority a job may have.
pub const PRIORITY_MIN: i32 = -100;

/// The highest priority a job may have.
pub const PRIORITY_MAX: i32 = 100;

/// A job's metadata: string keys to string values, in key order.
pub type Metadata = std::collections::BTreeMap<String, String>;

impl Job {
    /// The progress of its latest attempt: reported under that attempt's
    /// lease (a new attempt starts without one; a finished job keeps its
    /// last attempt's).
    pub fn progress_now(&self) -> Option<&Progress> {
        let latest = self.history.last()?.lease_id;
        self.progress.as_ref().filter(|p| p.lease_id == latest)
    }

    /// The lease's id, if the job is RUNNING.
    pub fn lease_id(&self) -> Option<LeaseId> {
        self.lease.as_ref().map(|l| l.id)
    }

    /// When the lease runs out, if the job is RUNNING.
    pub fn lease_expires_at(&self) -> Option<SystemTime> {
        self.lease.as_ref().map(|l| l.expires_at)
    }
}

/// A validated request to add a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// Optional domain key.
    pub key: Option<String>,
    /// Attempts allowed (already defaulted, at least 1).
    pub max_attempts: u32,
    /// How long to wait before the first run.
    pub delay: Duration,
    /// Delivery priority (already range-checked).
    pub priority: i32,
    /// What the producer attached (already size-checked).
    pub metadata: Metadata,
    /// The job's group (already name-checked).
    pub group: Option<String>,
    /// Snoozes allowed (already defaulted and range-checked).
    pub max_snoozes: u32,
    /// How its key meets a job that has it already (default: the job
    /// keeps it while retained, and is returned).
    pub unique: Uniqueness,
}

/// How long a job holds its key against a later enqueue of the same key,
/// and what that enqueue does to it (docs/src/shaping.md, "Uniqueness").
/// The later enqueue's rules judge the job that holds the key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Uniqueness {
    /// Which jobs hold a key.
    pub scope: KeyScope,
    /// Replace a PENDING holder's payload, metadata and due time instead
    /// of returning it unchanged (debounce).
    pub replace: bool,
    /// The key is held this long after its job's enqueue, whatever the
    /// job's state, and no longer (throttle).
    pub unique_for: Option<Duration>,
}

/// Which jobs hold their key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeyScope {
    /// Every retained job, finished or not.
    #[default]
    Retained,
    /// PENDING and RUNNING jobs only: a finished job frees its key.
    Active,
}

impl Uniqueness {
    /// Whether these are the default rules (a key held while retained,
    /// its job returned unchanged).
    pub fn is_default(&self) -> bool {
        *self == Uniqueness::default()
    }
}

/// A job leased to a worker: what Dequeue and the Lease stream hand out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    /// The job, RUNNING.
    pub job: Job,
    /// The lease's fencing token.
    pub lease_id: LeaseId,
    /// When the lease runs out unless extended.
    pub expires_at: SystemTime,
}

impl Leased {
    /// Builds the lease view of a RUNNING job. `None` if it holds no lease.
    pub fn of(job: Job) -> Option<Leased> {
        let lease = job.lease.as_ref()?;
        let (lease_id, expires_at) = (lease.id, lease.expires_at);
        Some(Leased {
            job,
            lease_id,
            expires_at,
        })
    }
}
