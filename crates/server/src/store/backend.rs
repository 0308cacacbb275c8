//! What a storage engine must provide. [`super::Jobs`] builds the whole
//! [`super::Store`] contract on top, so a backend holds no queue rules of
//! its own: it loads, calls [`crate::machine::apply`], writes and reindexes
//! — once, in [`Backend::apply`] — and answers queries.

use std::{future::Future, time::SystemTime};

use super::{
    cluster::Cluster, events::Remote, rules::Retention, Enqueued, ListFilter, Page, QueueStats,
};
use crate::{
    error::Result,
    job::{Job, JobId, LeaseId, NewJob},
    machine::Event,
    policy::QueuePolicy,
    schedule::Schedule,
};

/// One applied change: the job before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The job as it was loaded.
    pub old: Job,
    /// The job as it was written.
    pub new: Job,
}

/// A storage engine under [`super::Jobs`].
///
/// Writes (`insert`, `take`, `apply`, `purge_chunk`) need not be durable
/// when they return: [`Backend::durable`] waits for that, for every write
/// made before it was called. An engine that commits durably on each write
/// returns a ready future there.
pub trait Backend: Send + Sync + 'static {
    /// Adds jobs whose (queue, key) pairs are distinct within the batch;
    /// an entry whose key is held by a retained job gets that job back
    /// (`created = false`). One result per entry, in order.
    fn insert(
        &self,
        batch: Vec<NewJob>,
        now: SystemTime,
    ) -> impl Future<Output = Result<Vec<Enqueued>>> + Send;

    /// Whether [`Backend::insert`] of `batch` may wait (for a disk) before
    /// it makes its change, rather than make it on its first poll. [`super::Jobs`]
    /// then runs the enqueue in a task of its own, so that a caller who
    /// gives up (a client's deadline) does not cut it short: an enqueue
    /// still completes on the server. Default: no.
    fn insert_waits(&self, batch: &[NewJob]) -> bool {
        let _ = batch;
        false
    }

    /// Whether [`Backend::apply`] may wait (for a network round trip)
    /// before it makes its change. [`super::Jobs`] then runs an ack, fail,
    /// cancel, retry, reclaim or give-back in a task of its own: a caller
    /// who gives up after the change committed must not take with it the
    /// lease-ended event that frees the stream's slot and tells its worker.
    /// Default: no (the change is made on the first poll, and the event is
    /// published before the next await).
    fn apply_waits(&self) -> bool {
        false
    }

    /// Finds the first due job of the first unpaused queue that has one and applies
    /// `take` (an [`Event::Take`]) to it, atomically: two callers never
    /// take the same job. `streamed`: the lease goes to a Lease stream of
    /// this server, so a shared backend records the server as its holder
    /// (see [`Backend::orphaned`]). The take need not be durable when this
    /// returns, but the engine asks for it to become durable soon, and
    /// makes its lease reapable, as soon as it is written, since what
    /// follows may fail or be cancelled: sled asks its flusher and re-arms
    /// the reaper ([`Remote::lease_expires`]) before it reads a payload
    /// file; PostgreSQL commits before it returns, and every server
    /// heartbeat re-arms the reaper.
    fn take(
        &self,
        queues: &[String],
        take: Event,
        streamed: bool,
        now: SystemTime,
    ) -> impl Future<Output = Result<Option<Change>>> + Send;

    /// Loads each job, applies its event and writes the results, all at
    /// once. Events apply in order: a job named twice sees its first
    /// change. One result per event: a missing job or a refused transition
    /// is that entry's error and writes nothing for it; an `Err` of the
    /// whole call means nothing was written.
    fn apply(
        &self,
        events: Vec<(JobId, Event)>,
        now: SystemTime,
    ) -> impl Future<Output = Result<Vec<Result<Change>>>> + Send;

    /// Records that `queue` is paused (or no longer is). Idempotent.
    /// Pausing a queue not yet paused when `most` are is
    /// [`crate::Error::ResourceExhausted`] and changes nothing (decided
    /// atomically with the write: on a shared engine, across servers).
    /// [`Backend::take`] and [`Backend::next_run_at`] skip paused queues,
    /// reading the paused set at the time of the take (for a shared
    /// engine: as committed by any server). Resuming a queue on a shared
    /// engine tells the other servers that jobs may be due.
    fn set_paused(
        &self,
        queue: &str,
        paused: bool,
        most: usize,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Every paused queue, sorted by name.
    fn paused(&self) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// Records a queue's policy (an empty one clears it). A new policy
    /// when `most` queues have one is
    /// [`crate::Error::ResourceExhausted`] and changes nothing. From then
    /// on [`Backend::take`] leases no job the policy forbids, counting
    /// RUNNING jobs as committed by any server, and [`Backend::next_run_at`]
    /// leaves held jobs out.
    fn set_policy(
        &self,
        queue: &str,
        policy: QueuePolicy,
        most: usize,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Every queue's policy, sorted by queue name.
    fn policies(&self) -> impl Future<Output = Result<Vec<(String, QueuePolicy)>>> + Send;

    /// Whether a change of status of a job of `queue` may let a job its
    /// policy holds go (a slot freed, a sequence's head gone), so that it
    /// wakes the queue's waiters: at least whenever that is so; a shared
    /// engine answers from its copy of the policies (any policy: yes).
    fn limited(&self, queue: &str) -> bool;

    /// The leases that expire at or before `at`.
    fn expiring(
        &self,
        at: SystemTime,
    ) -> impl Future<Output = Result<Vec<(JobId, LeaseId)>>> + Send;

    /// The highest id among the PENDING jobs of `queue` (`None`: it has
    /// none): where a purge of its PENDING jobs stops, so that jobs
    /// enqueued while it runs stay.
    fn last_pending(&self, queue: &str) -> impl Future<Output = Result<Option<JobId>>> + Send;

    /// One bounded purge step over the jobs after `after`: deletes the
    /// purgeable ones (re-checked under the engine's own lock or
    /// transaction) and says where the next step starts (`None`: done).
    /// A step over PENDING jobs ([`Retention::pending_through`]) reads only
    /// that queue's PENDING jobs, and skips one a take or another change
    /// holds at that moment (it is leaving PENDING).
    fn purge_chunk(
        &self,
        after: Option<JobId>,
        retention: Retention,
    ) -> impl Future<Output = Result<(u64, Option<JobId>)>> + Send;

    /// Deletes one job if [`crate::machine::deletable`] allows it, checked
    /// under the engine's own lock or transaction (so a take cannot slip
    /// in between), with its history and its key.
    fn delete(&self, id: JobId) -> impl Future<Output = Result<()>> + Send;

    /// Stores a schedule, replacing one of the same name.
    fn put_schedule(&self, schedule: &Schedule) -> impl Future<Output = Result<()>> + Send;

    /// Deletes a schedule; returns it, or `None` if there was none.
    fn delete_schedule(&self, name: &str) -> impl Future<Output = Result<Option<Schedule>>> + Send;

    /// Every schedule, sorted by name.
    fn schedules(&self) -> impl Future<Output = Result<Vec<Schedule>>> + Send;

    /// One schedule by name, if there is one.
    fn schedule(&self, name: &str) -> impl Future<Output = Result<Option<Schedule>>> + Send;

    /// Records that a schedule's `tick` was enqueued: its `last_tick`
    /// becomes `tick` unless it is already as late, or the schedule of
    /// that name is gone or is another one (created at another time than
    /// `created_at`: replaced).
    fn schedule_ticked(
        &self,
        name: &str,
        created_at: SystemTime,
        tick: SystemTime,
    ) -> impl Future<Output = Result<()>> + Send;

    /// One job.
    fn get(&self, id: JobId) -> impl Future<Output = Result<Job>> + Send;

    /// One job without its payload, for checks of its queue or lease.
    fn peek(&self, id: JobId) -> impl Future<Output = Result<Job>> + Send;

    /// A page of jobs matching the filter, by ascending id.
    fn list(&self, filter: ListFilter) -> impl Future<Output = Result<Page>> + Send;

    /// Counts per queue (one queue, or all), sorted by queue name.
    fn stats(
        &self,
        queue: Option<&str>,
        now: SystemTime,
    ) -> impl Future<Output = Result<Vec<QueueStats>>> + Send;

    /// The earliest `run_at` among PENDING jobs of these queues, paused
    /// ones left out.
    fn next_run_at(
        &self,
        queues: &[String],
    ) -> impl Future<Output = Result<Option<SystemTime>>> + Send;

    /// The earliest lease expiry among RUNNING jobs.
    fn next_lease_expiry(&self) -> impl Future<Output = Result<Option<SystemTime>>> + Send;

    /// Resolves once every write made before this call is durable. The
    /// wait is registered when this is called, not when it is polled.
    ///
    /// # Errors
    /// Any error means a write may be lost: the caller fail-stops.
    fn durable(&self) -> impl Future<Output = Result<()>> + Send + 'static;

    /// The server stops: every write made so far becomes durable. A backend
    /// may also refuse writes from now on and save what speeds up its next
    /// start (sled does both, for its indexes).
    ///
    /// # Errors
    /// As [`Backend::durable`].
    fn close(&self) -> impl Future<Output = Result<()>> + Send {
        self.durable()
    }

    /// Called once by [`super::Jobs::new`]: where the engine passes on
    /// the events it learns of outside a call (a shared engine: the other
    /// servers' changes).
    fn attach(&self, remote: Remote) {
        let _ = remote;
    }

    /// What this engine does as one of several servers sharing it; an
    /// engine of its own says [`Alone`](super::cluster::Alone).
    type Cluster: Cluster;

    /// The cluster this server shares the engine with (PostgreSQL); `None`
    /// for an engine of its own. A shared engine keeps running while one
    /// server restarts, so a restart grants no lease grace.
    fn cluster(&self) -> Option<&Self::Cluster> {
        None
    }

    /// The time by the clock this engine's decisions are made on, for the
    /// decisions made before any call: which schedule tick is due, a
    /// schedule's creation time, a purge's cutoff. An engine of its own
    /// uses this machine's clock; a shared one, the clock every server
    /// shares (never ahead of it, so nothing is due early).
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}
