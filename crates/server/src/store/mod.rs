//! The storage seam, in two layers.
//!
//! - [`Store`] is what the rest of the server uses: one async trait shaped
//!   by the transitions, so lease streams, the reaper and the gRPC glue never
//!   know which store they run on.
//! - [`Backend`] is what a storage engine provides: load, apply, write and
//!   reindex in one step ([`Backend::apply`]), pick the next due job, make
//!   writes durable, and answer queries. Implementations: [`sled::Sled`],
//!   [`postgres::Pg`].
//! - [`Cluster`] is what an engine shared by several servers adds: the
//!   servers' registry, the leases of servers that died, the other
//!   servers' events. Only PostgreSQL has one; sled's is [`Alone`].
//! - [`Jobs`] joins them: it implements [`Store`] over any backend and owns
//!   every rule that does not depend on the engine ([`rules`]): the backoff
//!   jitter draw, time-overflow checks, key de-duplication within a batch,
//!   the purge predicate, unguessable lease ids, "notify only after
//!   durable", the lease-ended events ([`events`]) and fail-stop.

mod backend;
mod cluster;
pub mod events;
mod jobs;
pub mod postgres;
pub mod rules;
pub mod sled;

use std::{future::Future, time::Duration, time::SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use backend::{Backend, Change};
pub use cluster::{Alone, Cluster};
pub use events::{Fact, LeaseEnded, Listener, Observer, Remote};
pub use jobs::Jobs;

use crate::{
    error::Result,
    job::{Job, JobId, LeaseId, Leased, NewJob, Outcome, Report, Status},
    liveness::Liveness,
    policy::QueuePolicy,
    schedule::Schedule,
};

/// The result of an enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// The new job, or the job that held the key (replaced, if
    /// `replaced`).
    pub job: Job,
    /// False when the key matched a job that holds it.
    pub created: bool,
    /// The job that held the key was PENDING and took this enqueue's
    /// payload, metadata and due time (`on_conflict = REPLACE`).
    pub replaced: bool,
    /// The other job this enqueue changed, before and after: the holder it
    /// replaced, or the one whose key it took over (a job that no longer
    /// held it under this enqueue's rules). For the change's observers;
    /// `None` when it changed none.
    pub changed: Option<Change>,
}

impl Enqueued {
    /// A job created by its enqueue.
    pub fn created(job: Job) -> Enqueued {
        Enqueued {
            job,
            created: true,
            replaced: false,
            changed: None,
        }
    }

    /// The job that held the key, unchanged.
    pub fn existing(job: Job) -> Enqueued {
        Enqueued {
            job,
            created: false,
            replaced: false,
            changed: None,
        }
    }
}

/// A worker's failure report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailReport {
    /// The lease presented.
    pub lease_id: LeaseId,
    /// Why it failed.
    pub error: String,
    /// The worker's own delay; `None` means the server's backoff.
    pub retry_delay: Option<Duration>,
    /// Do not retry.
    pub fatal: bool,
    /// Not a failure: back to PENDING after this delay, the attempt not
    /// counted (docs/src/design.md §1).
    pub snooze: Option<Duration>,
}

/// Filters and paging for [`Store::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// Only jobs with this key.
    pub key: Option<String>,
    /// Only jobs with ids greater than this (the page token).
    pub after: Option<JobId>,
    /// Most jobs to return (at least 1).
    pub limit: usize,
    /// Most bytes of stored jobs on a page (`--max-page-bytes`); a page
    /// always holds at least one job, so paging makes progress.
    pub max_bytes: usize,
    /// Leave payloads out (and out of the byte count).
    pub omit_payload: bool,
}

impl Default for ListFilter {
    /// Everything, one job per page, no byte bound, payloads included.
    fn default() -> Self {
        ListFilter {
            queue: None,
            status: None,
            key: None,
            after: None,
            limit: 1,
            max_bytes: usize::MAX,
            omit_payload: false,
        }
    }
}

/// One page of [`Store::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// The jobs, by ascending id.
    pub jobs: Vec<Job>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<JobId>,
}

/// Counts for one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// PENDING jobs.
    pub pending: u64,
    /// RUNNING jobs.
    pub running: u64,
    /// DONE jobs still retained.
    pub done: u64,
    /// FAILED jobs.
    pub failed: u64,
    /// Age of the oldest due PENDING job (now - run_at); `None` if none is due.
    pub oldest_pending_age: Option<Duration>,
    /// The queue is paused: nothing is taken from it.
    pub paused: bool,
    /// The queue's policy (empty: none).
    pub policy: QueuePolicy,
    /// Due PENDING jobs held back because the queue runs `max_running`.
    pub held_max_running: u64,
    /// Due PENDING jobs held back by `group_max_running`.
    pub held_group_max_running: u64,
    /// Due PENDING jobs held back because the rate limit has no token.
    pub held_rate: u64,
    /// Due PENDING jobs held back because their group's rate limit has
    /// no token.
    pub held_group_rate: u64,
}

/// The outcome of extending one lease in a heartbeat.
pub type Extended = Result<Job>;

/// Where jobs live, as the rest of the server sees it. Implemented once, by
/// [`Jobs`], over any [`Backend`].
///
/// Every method that changes a job goes through [`crate::machine::apply`];
/// methods that promise durability return only once the change is durable.
/// The job a change returns (enqueue, ack, fail, retry, cancel, a
/// heartbeat's extensions, reclaims, give-back) has an empty payload: no
/// change of status changes the payload, and the sled store keeps it apart
/// from the record a change rewrites. Take, get and list hand it out;
/// peek does not.
/// After a durability failure every method returns
/// [`crate::Error::FailStopped`] (fail-stop).
pub trait Store: Send + Sync + 'static {
    /// Adds a job, or returns (or replaces) the job that holds its (queue,
    /// key) under its rules ([`crate::job::Uniqueness`]). Durable on
    /// return.
    fn enqueue(
        &self,
        new: NewJob,
        now: SystemTime,
    ) -> impl Future<Output = Result<Enqueued>> + Send;

    /// Adds many jobs with one flush. Keys deduplicate within the batch and
    /// against the store. Durable on return.
    fn enqueue_batch(
        &self,
        batch: Vec<NewJob>,
        now: SystemTime,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;

    /// Leases the first due job of the first queue (in the given priority
    /// order) that has one, for `worker_id`, owned by the token `owner`.
    /// `Ok(None)` when nothing is due. Not waited on:
    /// the take is made durable by the next flush round (asked for here),
    /// and losing it in a crash only causes a redelivery.
    fn take(
        &self,
        queues: &[String],
        worker_id: &str,
        owner: Option<&str>,
        lease: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<Option<Leased>>> + Send;

    /// Like [`Store::take`], for a Lease stream of this server: the lease
    /// belongs to the stream, so if this server dies, the servers that
    /// share its store reclaim it (see [`Store::reclaim_orphaned`]).
    fn take_streamed(
        &self,
        queues: &[String],
        worker_id: &str,
        owner: Option<&str>,
        lease: Duration,
        now: SystemTime,
    ) -> impl Future<Output = Result<Option<Leased>>> + Send;

    /// RUNNING -> DONE for the lease holder. Durable on return.
    fn ack(
        &self,
        id: JobId,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> impl Future<Output = Result<Job>> + Send {
        self.ack_with(id, lease_id, None, now)
    }

    /// [`Store::ack`] that also stores the job's output, in the same
    /// commit, as `Job::result` (read back by [`Store::get`] only).
    fn ack_with(
        &self,
        id: JobId,
        lease_id: LeaseId,
        result: Option<Vec<u8>>,
        now: SystemTime,
    ) -> impl Future<Output = Result<Job>> + Send;

    /// RUNNING -> PENDING (backoff) or FAILED. Durable on return.
    fn fail(
        &self,
        id: JobId,
        report: FailReport,
        now: SystemTime,
    ) -> impl Future<Output = Result<Job>> + Send;

    /// FAILED -> PENDING with attempts reset. Durable on return.
    fn retry(&self, id: JobId, now: SystemTime) -> impl Future<Output = Result<Job>> + Send;

    /// PENDING or RUNNING -> FAILED with `last_error = "cancelled:
    /// <reason>"`; a RUNNING job's attempt ends REVOKED, and the lease-ended
    /// event tells its stream (`revoked`). Durable on return.
    fn cancel(
        &self,
        id: JobId,
        reason: String,
        now: SystemTime,
    ) -> impl Future<Output = Result<Job>> + Send;

    /// Pauses (`paused = true`) or resumes a queue. A paused queue hands
    /// out nothing ([`Store::take`] skips it, [`Store::next_run_at`]
    /// ignores it); enqueues and running jobs go on. Resuming wakes
    /// waiters. Durable on return, and survives a restart. Pausing one
    /// more queue than `--max-paused-queues` is
    /// [`crate::Error::ResourceExhausted`]; pausing a paused queue is
    /// always OK.
    fn set_paused(&self, queue: &str, paused: bool) -> impl Future<Output = Result<()>> + Send;

    /// Sets a queue's policy (an empty one clears it): a take never leases
    /// a job its limits forbid. Loosening it wakes waiters. Durable on
    /// return, and survives a restart. Setting one more policy than
    /// `--max-queue-policies` is [`crate::Error::ResourceExhausted`].
    fn set_policy(
        &self,
        queue: &str,
        policy: QueuePolicy,
    ) -> impl Future<Output = Result<()>> + Send;

    /// A queue's policy (empty: none).
    fn policy(&self, queue: &str) -> impl Future<Output = Result<QueuePolicy>> + Send;

    /// Extends each held lease; one result per lease, in order (an error
    /// means the lease is lost or unknown). `progress[i]`, where there is
    /// one, is the progress reported with `leases[i]`, kept by the same
    /// write. Durable on return.
    fn extend(
        &self,
        leases: &[(JobId, LeaseId)],
        progress: &[Option<Report>],
        extend_by: Option<Duration>,
        now: SystemTime,
    ) -> impl Future<Output = Result<Vec<Extended>>> + Send;

    /// Takes one lease back (stream ended, revoked, or expired); the run
    /// counts as an attempt. Durable on return.
    fn reclaim(
        &self,
        id: JobId,
        lease_id: LeaseId,
        outcome: Outcome,
        now: SystemTime,
    ) -> impl Future<Output = Result<Job>> + Send;

    /// Undoes a take whose job never reached the worker (the push failed,
    /// or the stream never read it): PENDING again, no attempt counted.
    /// Durable on return.
    fn give_back(
        &self,
        id: JobId,
        lease_id: LeaseId,
        now: SystemTime,
    ) -> impl Future<Output = Result<Job>> + Send;

    /// Reclaims every lease that expired at or before `now`, returning each
    /// reclaimed job with the lease it lost. `undelivered` names leases
    /// whose job never reached its worker: those are given back without
    /// counting an attempt. Durable on return.
    fn reclaim_expired(
        &self,
        now: SystemTime,
        undelivered: &(dyn Fn(LeaseId) -> bool + Sync),
    ) -> impl Future<Output = Result<Vec<(Job, LeaseId)>>> + Send;

    /// After a restart: every lease that ran out (or runs out within the
    /// grace) is extended to `now + grace` (`None`: each lease's own
    /// length), so workers can reconnect and heartbeat or ack. Returns how
    /// many leases were extended. Durable on return.
    fn restart_grace(
        &self,
        grace: Option<Duration>,
        now: SystemTime,
    ) -> impl Future<Output = Result<usize>> + Send;

    /// Deletes DONE jobs finished before `done_before` and FAILED jobs
    /// finished before `failed_before`; returns how many. Frees their keys.
    fn purge(
        &self,
        done_before: SystemTime,
        failed_before: SystemTime,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// An operator's purge: deletes the jobs of `queue` finished before
    /// `finished_before` whose status is `status` (DONE or FAILED; `None`:
    /// both), or with [`Status::Pending`] its PENDING jobs, due or
    /// delayed, that were there when the purge began (`finished_before`
    /// plays no part), in bounded chunks (each a short lock or
    /// transaction, durable before the next); returns how many. Never a
    /// RUNNING job. Frees their keys and payloads. Durable on return.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] for RUNNING.
    fn purge_jobs(
        &self,
        queue: &str,
        status: Option<Status>,
        finished_before: SystemTime,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes one PENDING, DONE or FAILED job for good, with its history;
    /// frees its key. Durable on return.
    ///
    /// # Errors
    /// FAILED_PRECONDITION for a RUNNING job ([`crate::machine::deletable`]),
    /// NOT_FOUND for an unknown one.
    fn delete(&self, id: JobId) -> impl Future<Output = Result<()>> + Send;

    /// Stores a schedule, replacing one of the same name, if `room`
    /// accepts it beside the schedules there are (which it is shown, with
    /// no other create or delete through this server in between; servers
    /// sharing a PostgreSQL store do not wait for each other). Durable on
    /// return.
    fn put_schedule(
        &self,
        schedule: Schedule,
        room: impl FnOnce(&[Schedule]) -> Result<()> + Send,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Deletes a schedule; returns it, or `None` if there was none.
    /// Durable on return.
    fn delete_schedule(&self, name: &str) -> impl Future<Output = Result<Option<Schedule>>> + Send;

    /// Every schedule, sorted by name.
    fn schedules(&self) -> impl Future<Output = Result<Vec<Schedule>>> + Send;

    /// Records that `schedule`'s `tick` was enqueued, or is to be skipped
    /// (`last_tick` only moves forward; nothing once the schedule is
    /// deleted or replaced). Durable on return.
    fn schedule_ticked(
        &self,
        schedule: &Schedule,
        tick: SystemTime,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Enqueues `job` for `schedule`'s `tick` and records the tick, unless
    /// the schedule was deleted or replaced since it was read: then
    /// `Ok(None)`. A delete or replace that has returned is never followed
    /// by a job of the old schedule from this server (another server
    /// sharing a PostgreSQL store may have one under way). Durable on
    /// return.
    fn fire_schedule(
        &self,
        schedule: &Schedule,
        tick: SystemTime,
        job: NewJob,
    ) -> impl Future<Output = Result<Option<Enqueued>>> + Send;

    /// Keeps this server registered as alive, for a store shared by
    /// several servers; nothing otherwise.
    fn heartbeat(&self) -> impl Future<Output = Result<()>> + Send;

    /// Reclaims, as worker disconnected, the stream leases of servers that
    /// stopped heartbeating (a shared store; nothing otherwise). Returns
    /// each reclaimed job with the lease it lost. Durable on return.
    fn reclaim_orphaned(
        &self,
        now: SystemTime,
    ) -> impl Future<Output = Result<Vec<(Job, LeaseId)>>> + Send;

    /// A Lease stream of this server adopted these leases (its worker
    /// reconnected, maybe from another server that died): for a shared
    /// store, they now belong to this server.
    fn adopt(&self, leases: &[(JobId, LeaseId)]) -> impl Future<Output = Result<()>> + Send;

    /// This server stops gracefully: its stream leases stay valid until
    /// they expire, and it leaves the registry of a shared store.
    fn leave(&self) -> impl Future<Output = Result<()>> + Send;

    /// Whether other servers share this store.
    fn shared(&self) -> bool;

    /// The time by the store's clock: this machine's for sled, the
    /// database's for PostgreSQL (never ahead of it), so that servers whose
    /// clocks disagree make the same decisions. Every decision made before
    /// a call reads it: which schedule tick is due and when, a schedule's
    /// creation time, the cutoffs of purges.
    fn now(&self) -> SystemTime;

    /// How full the notification queue of a shared store is, from 0 to 1
    /// (`None` for a store of its own).
    fn notification_queue_usage(&self) -> impl Future<Output = Result<Option<f64>>> + Send;

    /// One job.
    fn get(&self, id: JobId) -> impl Future<Output = Result<Job>> + Send;

    /// One job without its payload: for checks of its queue or lease
    /// (authorization, stream adoption), which need not read a payload
    /// stored apart.
    fn peek(&self, id: JobId) -> impl Future<Output = Result<Job>> + Send;

    /// A page of jobs matching the filter, by ascending id.
    fn list(&self, filter: ListFilter) -> impl Future<Output = Result<Page>> + Send;

    /// Counts per queue (one queue, or all), sorted by queue name.
    fn stats(
        &self,
        queue: Option<&str>,
        now: SystemTime,
    ) -> impl Future<Output = Result<Vec<QueueStats>>> + Send;

    /// The earliest `run_at` among PENDING jobs of these queues, for waiters
    /// that found nothing due and sleep until the next job becomes due.
    fn next_run_at(
        &self,
        queues: &[String],
    ) -> impl Future<Output = Result<Option<SystemTime>>> + Send;

    /// The earliest lease expiry among RUNNING jobs, for the reaper.
    fn next_lease_expiry(&self) -> impl Future<Output = Result<Option<SystemTime>>> + Send;

    /// Bumped whenever a job may have become takeable sooner than before
    /// (enqueue, retry, fail, reclaim), once the change is durable: waiters
    /// re-check on change.
    fn changes(&self) -> watch::Receiver<u64>;

    /// A number that moves whenever a job of one of `queues` may have
    /// become due (it moves before [`Store::changes`] is bumped): a waiter
    /// woken by a change to other queues finds it unchanged and need not
    /// look.
    fn due_version(&self, queues: &[String]) -> u64;

    /// Bumped whenever the earliest lease expiry may have moved earlier (a
    /// take or a heartbeat with a short lease): the reaper re-arms its
    /// timer.
    fn lease_changes(&self) -> watch::Receiver<u64>;

    /// Whether this server takes jobs for its Lease streams and Dequeue
    /// calls: with a shared store, only while its own heartbeat is younger
    /// than half of `--server-timeout` (else the others may take it for
    /// dead and reclaim from its streams' live workers what it hands out).
    /// Always true for a store of its own.
    fn registered(&self) -> watch::Receiver<bool>;

    /// The heartbeat loop's verdict for [`Store::registered`].
    fn set_registered(&self, registered: bool);

    /// The deadline behind [`Store::registered`], which a Lease stream
    /// checks as each leased job leaves (a thawed server may run its
    /// streams before its heartbeat loop); renewed by the heartbeat loop,
    /// never set for a store of its own.
    fn liveness(&self) -> Liveness;

    /// Bumped when lease-ended events may have been missed (a shared
    /// engine's notification connection broke and came back): whoever
    /// tracks leases checks them against the store.
    fn resyncs(&self) -> watch::Receiver<u64>;

    /// Registers a listener for lease-ended events (ack, fail, reclaim,
    /// expiry, give-back): called synchronously when the store applies the
    /// change, whoever asked for it and whether or not they still wait.
    fn on_lease_ended(&self, listener: Listener);

    /// Registers an observer of every applied change (enqueue, take, ack,
    /// fail, reclaim, retry, …), called synchronously when it is applied.
    fn observe(&self, observer: Observer);

    /// Cancelled when the store fail-stopped; [`Store::fail_cause`] says why.
    fn fail_stopped(&self) -> CancellationToken;

    /// Why the store fail-stopped, once it has.
    fn fail_cause(&self) -> Option<String>;

    /// Makes everything written so far durable.
    fn flush(&self) -> impl Future<Output = Result<()>> + Send;

    /// The server stops: makes everything durable, and lets the backend
    /// refuse later writes and save what speeds up the next start
    /// ([`Backend::close`]). Writes after it may fail with
    /// [`crate::Error::ShuttingDown`].
    fn close(&self) -> impl Future<Output = Result<()>> + Send;
}
