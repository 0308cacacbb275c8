//! [`Jobs`]: the [`Store`] contract over any [`Backend`], with every rule
//! that does not depend on the engine written once.

use std::{
    future::Future,
    sync::{Arc, OnceLock},
    time::{Duration, SystemTime},
};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::error;

use super::{
    backend::{Backend, Change},
    cluster::Cluster,
    events::{Fact, LeaseEnded, Listener, Observer, Remote, Signals},
    rules::{self, Retention},
    Enqueued, Extended, FailReport, ListFilter, Page, QueueStats, Store,
};
use crate::{
    config::{DEFAULT_MAX_PAUSED_QUEUES, DEFAULT_MAX_QUEUE_POLICIES},
    error::{Error, Result},
    job::{Job, JobId, LeaseId, Leased, NewJob, Outcome, Report, Status},
    liveness::Liveness,
    machine::{Backoff, Event},
    policy::QueuePolicy,
    schedule::Schedule,
};

/// Fail-stop state, shared with the tasks that finish a commit.
#[derive(Default)]
struct Stop {
    cause: OnceLock<Arc<str>>,
    token: CancellationToken,
}

impl Stop {
    /// Stops the store for good: no further take, push, ack or read. The
    /// server watches the token, reports NOT_SERVING and exits.
    fn stop(&self, cause: &str) -> Error {
        if self.cause.set(Arc::from(cause)).is_ok() {
            error!(
                %cause,
                "fail-stop: a change could not be made durable; serving nothing more and exiting so that a restart recovers from what is on disk"
            );
            self.token.cancel();
        }
        Error::FailStopped(
            self.cause
                .get()
                .cloned()
                .unwrap_or_else(|| Arc::from(cause)),
        )
    }
}

/// The store: a [`Backend`] plus the engine-independent rules (module docs
/// of [`super`]).
pub struct Jobs<B> {
    backend: Arc<B>,
    backoff: Backoff,
    signals: Arc<Signals>,
    stop: Arc<Stop>,
    /// Schedule creates and deletes hold it alone, a schedule's tick
    /// shared (see [`Store::fire_schedule`]).
    schedule_gate: Arc<tokio::sync::RwLock<()>>,
    /// Wake waiters when a change that makes a job due is applied, not
    /// once it is durable (`--deliver-before-fsync`).
    early_wake: bool,
    /// Most paused queues (`--max-paused-queues`).
    max_paused: usize,
    /// Most queues with a policy (`--max-queue-policies`).
    max_policies: usize,
}

impl<B> Clone for Jobs<B> {
    /// Another handle on the same store (for a task of its own).
    fn clone(&self) -> Jobs<B> {
        Jobs {
            backend: Arc::clone(&self.backend),
            backoff: self.backoff,
            signals: Arc::clone(&self.signals),
            stop: Arc::clone(&self.stop),
            schedule_gate: Arc::clone(&self.schedule_gate),
            early_wake: self.early_wake,
            max_paused: self.max_paused,
            max_policies: self.max_policies,
        }
    }
}

impl<B: Backend> Jobs<B> {
    /// The store over `backend`, failing jobs back off by `backoff`.
    pub fn new(backend: B, backoff: Backoff) -> Jobs<B> {
        let signals = Arc::new(Signals::default());
        backend.attach(Remote::new(&signals));
        Jobs {
            backend: Arc::new(backend),
            backoff,
            signals,
            stop: Arc::new(Stop::default()),
            schedule_gate: Arc::default(),
            early_wake: false,
            max_paused: DEFAULT_MAX_PAUSED_QUEUES,
            max_policies: DEFAULT_MAX_QUEUE_POLICIES,
        }
    }

    /// At most `most` queues with a policy: setting one more is
    /// [`Error::ResourceExhausted`] (`--max-queue-policies`).
    #[must_use]
    pub fn max_queue_policies(mut self, most: usize) -> Jobs<B> {
        self.max_policies = most;
        self
    }

    /// At most `most` queues paused at once: pausing one more is
    /// [`Error::ResourceExhausted`] (`--max-paused-queues`).
    #[must_use]
    pub fn max_paused_queues(mut self, most: usize) -> Jobs<B> {
        self.max_paused = most;
        self
    }

    /// With `on`, waiters are woken as soon as a change that makes a job
    /// due is applied, before it is durable: a worker may then run a job
    /// whose enqueue (or retry) a crash undoes. Without, only once durable
    /// (docs/src/design.md §5, notify-after-durable), the default.
    #[must_use]
    pub fn deliver_before_durable(mut self, on: bool) -> Jobs<B> {
        self.early_wake = on;
        self
    }

    /// Inserts de-duplicated jobs, publishes them and waits until they are
    /// durable; one result per job of the caller's batch.
    async fn insert_deduped(
        &self,
        deduped: rules::Deduped,
        now: SystemTime,
    ) -> Result<Vec<Enqueued>> {
        let rules::Deduped { unique, slots } = deduped;
        let mut stored = self.written(self.backend.insert(unique, now).await)?;
        // A created or replaced job may be due now (a replaced one may be
        // due sooner than it was).
        let mut created: Vec<String> = stored
            .iter()
            .filter(|e| e.created || e.replaced)
            .map(|e| e.job.queue.clone())
            .collect();
        created.sort_unstable();
        created.dedup();
        self.signals.facts(stored.iter().flat_map(|e| {
            let changed = e.changed.iter().map(|c| Fact::Changed {
                old: &c.old,
                new: &c.new,
            });
            changed.chain(e.created.then_some(Fact::Created(&e.job)))
        }));
        for e in &mut stored {
            e.job.payload = Vec::new();
        }
        // Also for an existing job: its own enqueue may still be in flight.
        self.commit(&[], created).await?;
        slots
            .into_iter()
            .map(|(at, occurrence)| {
                let e = stored.get(at).ok_or_else(|| {
                    Error::Corrupt("the store returned too few enqueue results".into())
                })?;
                let (created, replaced) = match occurrence {
                    rules::Occurrence::First => (e.created, e.replaced),
                    rules::Occurrence::Again => (false, false),
                    rules::Occurrence::Replaced => (false, e.created || e.replaced),
                };
                Ok(Enqueued {
                    job: e.job.clone(),
                    created,
                    replaced,
                    changed: None,
                })
            })
            .collect()
    }

    /// Takes a due job; `streamed` as in [`Backend::take`].
    async fn take_as(
        &self,
        queues: &[String],
        worker_id: &str,
        owner: Option<&str>,
        lease: Duration,
        streamed: bool,
        now: SystemTime,
    ) -> Result<Option<Leased>> {
        self.check()?;
        if !self.signals.is_registered() {
            return Err(Error::Unavailable(
                "this server cannot heartbeat to the database; reconnect to another server".into(),
            ));
        }
        rules::later(now, lease, "lease")?;
        let event = Event::Take {
            lease_id: rules::fresh_lease_id(),
            worker_id: worker_id.to_owned(),
            owner: owner.map(str::to_owned),
            lease,
        };
        let Some(change) = self.written(self.backend.take(queues, event, streamed, now).await)?
        else {
            return Ok(None);
        };
        self.signals.facts(std::iter::once(Fact::Changed {
            old: &change.old,
            new: &change.new,
        }));
        if let Some(expires) = change.new.lease_expires_at() {
            self.signals.lease_expires(rules::epoch_ms(expires));
        }
        // The lease reaches the disk with the round the backend asked for
        // when it wrote the take (about one fsync later), but the job is
        // handed out without waiting for it. A crash in that window only
        // loses the take: the job is PENDING again after the restart and is
        // delivered again, which at-least-once allows, and the first
        // holder's ack is refused as stale. Every ack waits for a round
        // that covers its take, so a DONE job never comes back. Not waiting
        // halves the cost of every delivery.
        let id = change.new.id;
        Leased::of(change.new)
            .map(Some)
            .ok_or_else(|| Error::Corrupt(format!("job {id} was taken without a lease")))
    }

    /// Publishes reclaims that were applied, and names each job with the
    /// lease it lost.
    async fn reclaimed(&self, changed: Vec<Change>) -> Result<Vec<(Job, LeaseId)>> {
        self.commit(&changed, Vec::new()).await?;
        Ok(changed
            .into_iter()
            .filter_map(|c| {
                c.old
                    .lease_id()
                    .map(|lease| (without_payload(c.new), lease))
            })
            .collect())
    }

    /// Deletes the finished jobs `retention` names, one bounded chunk at a
    /// time (each its own short lock or transaction), each chunk durable
    /// before the next: a purge of a million jobs would otherwise pile its
    /// deletions into the commit rounds that takers' and producers' replies
    /// wait for (measured: enqueue → delivered p99 12 ms → 515 ms during a
    /// purge of 1M DONE jobs). Durable on return.
    async fn purge_where(&self, retention: Retention) -> Result<u64> {
        self.check()?;
        let mut purged = 0;
        let mut after = None;
        loop {
            let step = self.backend.purge_chunk(after, retention.clone()).await;
            let (n, next) = self.written(step)?;
            purged += n;
            if n > 0 {
                self.commit(&[], Vec::new()).await?;
            }
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
            // Let other tasks run between chunks of a long scan.
            tokio::task::yield_now().await;
        }
        Ok(purged)
    }

    /// How many reclaims were refused because another server had reclaimed
    /// the lease first (see [`Cluster::fenced_reclaims`]).
    pub fn fenced_reclaims(&self) -> u64 {
        self.backend.cluster().map_or(0, Cluster::fenced_reclaims)
    }

    /// The engine underneath.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Refuses everything once the store fail-stopped: what it holds in
    /// memory may include changes that never reached the disk.
    fn check(&self) -> Result<()> {
        match self.stop.cause.get() {
            Some(cause) => Err(Error::FailStopped(cause.clone())),
            None => Ok(()),
        }
    }

    /// A write that failed in the engine (an I/O error, a full disk) may
    /// have left it half done: fail-stop.
    fn written<T>(&self, result: Result<T>) -> Result<T> {
        match result {
            Err(err @ Error::Storage(_)) => Err(self.stop.stop(&err.to_string())),
            other => other,
        }
    }

    /// Applies one event to one job.
    async fn one(&self, id: JobId, event: Event, now: SystemTime) -> Result<Change> {
        self.check()?;
        let mut results = self.written(self.backend.apply(vec![(id, event)], now).await)?;
        match results.pop() {
            Some(result) if results.is_empty() => result,
            _ => Err(Error::Corrupt(
                "the store returned no result for one change".into(),
            )),
        }
    }

    /// Applies one event to one job and commits it; returns the job as
    /// changed, without its payload. Runs to the end even if the caller is
    /// dropped meanwhile, where the engine's apply may wait
    /// ([`Backend::apply_waits`]).
    async fn one_committed(&self, id: JobId, event: Event, now: SystemTime) -> Result<Job> {
        let this = self.clone();
        let work = async move {
            let change = match this.one(id, event, now).await {
                Ok(change) => change,
                Err(refused) if refused.is_refusal() => {
                    // The state that refused it may not be durable yet (a
                    // first Retry or Ack applied, its reply lost, its round
                    // still running): a refusal that reads "already done"
                    // must not be undone by a crash either.
                    this.backend
                        .durable()
                        .await
                        .map_err(|e| this.stop.stop(&e.to_string()))?;
                    return Err(refused);
                }
                Err(err) => return Err(err),
            };
            this.commit(std::slice::from_ref(&change), Vec::new())
                .await?;
            Ok(without_payload(change.new))
        };
        if self.backend.apply_waits() {
            to_the_end(work).await
        } else {
            work.await
        }
    }

    /// Publishes what `changes` mean and waits until they are durable:
    /// lease-ended events at once (they must not depend on the caller still
    /// waiting), wake-ups (for the queues of the changes that made a job
    /// due, and `made_due`: new jobs' queues, a resumed queue) only once
    /// durable (even if the caller stopped waiting) unless
    /// [`Jobs::deliver_before_durable`] says at once, and fail-stop if
    /// durability failed.
    async fn commit(&self, changes: &[Change], mut made_due: Vec<String>) -> Result<()> {
        self.signals.facts(changes.iter().map(|c| Fact::Changed {
            old: &c.old,
            new: &c.new,
        }));
        let ended: Vec<LeaseEnded> = changes
            .iter()
            .filter_map(|c| LeaseEnded::of(&c.old, &c.new))
            .collect();
        self.signals.lease_ended(&ended);
        for change in changes {
            if let Some(at) = change.new.lease_expires_at() {
                if change.old.lease_expires_at() != Some(at) {
                    self.signals.lease_expires(rules::epoch_ms(at));
                }
            }
        }
        let durable = self.backend.durable();
        for c in changes {
            if c.old == c.new || made_due.contains(&c.new.queue) {
                continue;
            }
            // A job made PENDING may be due; in a queue with a policy, a
            // job that stopped RUNNING freed a slot, and one that left
            // PENDING may have been the head of a sequence.
            let freed = c.old.status != c.new.status && self.backend.limited(&c.new.queue);
            if c.new.status == Status::Pending || freed {
                made_due.push(c.new.queue.clone());
            }
        }
        let wake = !made_due.is_empty();
        if !wake || self.early_wake {
            if wake {
                self.signals.bump_due(made_due.iter().map(String::as_str));
            }
            return durable.await.map_err(|e| self.stop.stop(&e.to_string()));
        }
        // A cancelled RPC drops this future; the job it made due must still
        // wake the waiters once it is durable, so that part runs on its own.
        let (signals, stop) = (Arc::clone(&self.signals), Arc::clone(&self.stop));
        let done = tokio::spawn(async move {
            match durable.await {
                Ok(()) => {
                    signals.bump_due(made_due.iter().map(String::as_str));
                    Ok(())
                }
                Err(e) => Err(stop.stop(&e.to_string())),
            }
        });
        done.await
            .map_err(|e| Error::Io(format!("a commit task failed: {e}")))?
    }

    /// Waits for the engine to report that it can no longer make writes
    /// durable (a failed background flush), and fail-stops. The server runs
    /// this for as long as it serves.
    pub async fn watch_engine(&self)
    where
        B: Broken,
    {
        let cause = self.backend.broken().await;
        self.stop.stop(&cause);
    }
}

/// An engine whose background durability can fail on its own (sled's
/// flusher), rather than only inside a caller's commit.
pub trait Broken {
    /// Resolves with the cause once the engine can no longer make writes
    /// durable; never resolves otherwise.
    fn broken(&self) -> impl std::future::Future<Output = String> + Send + 'static;
}

/// Runs `work` in a task of its own and waits for it: a caller dropped
/// meanwhile does not cut it short. A panic in it is the caller's.
async fn to_the_end<T: Send + 'static>(
    work: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(work).await {
        Ok(result) => result,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => Err(Error::Io(format!("a store task failed: {e}"))),
        },
    }
}

/// A changed job as [`Store`] returns it: without its payload.
fn without_payload(mut job: Job) -> Job {
    job.payload = Vec::new();
    job
}

impl<B: Backend> Store for Jobs<B> {
    async fn enqueue(&self, new: NewJob, now: SystemTime) -> Result<Enqueued> {
        let mut out = self.enqueue_batch(vec![new], now).await?;
        out.pop()
            .ok_or_else(|| Error::Corrupt("the store returned no result for an enqueue".into()))
    }

    async fn enqueue_batch(&self, batch: Vec<NewJob>, now: SystemTime) -> Result<Vec<Enqueued>> {
        self.check()?;
        for new in &batch {
            rules::later(now, new.delay, "delay")?;
        }
        let deduped = rules::dedupe(batch);
        if self.backend.insert_waits(&deduped.unique) {
            // Run to the end even if this caller is dropped meanwhile.
            let this = self.clone();
            return to_the_end(async move { this.insert_deduped(deduped, now).await }).await;
        }
        self.insert_deduped(deduped, now).await
    }

    async fn take(
        &self,
        queues: &[String],
        worker_id: &str,
        owner: Option<&str>,
        lease: Duration,
        now: SystemTime,
    ) -> Result<Option<Leased>> {
        self.take_as(queues, worker_id, owner, lease, false, now)
            .await
    }

    async fn take_streamed(
        &self,
        queues: &[String],
        worker_id: &str,
        owner: Option<&str>,
        lease: Duration,
        now: SystemTime,
    ) -> Result<Option<Leased>> {
        self.take_as(queues, worker_id, owner, lease, true, now)
            .await
    }

    async fn ack_with(
        &self,
        id: JobId,
        lease_id: LeaseId,
        result: Option<Vec<u8>>,
        now: SystemTime,
    ) -> Result<Job> {
        self.one_committed(id, Event::Ack { lease_id, result }, now)
            .await
    }

    async fn fail(&self, id: JobId, report: FailReport, now: SystemTime) -> Result<Job> {
        if let Some(d) = report.retry_delay {
            rules::later(now, d, "retry delay")?;
        }
        if let Some(delay) = report.snooze {
            rules::later(now, delay, "snooze")?;
            let event = Event::Snooze {
                lease_id: report.lease_id,
                reason: report.error,
                delay,
            };
            return self.one_committed(id, event, now).await;
        }
        let event = Event::Fail {
            lease_id: report.lease_id,
            error: report.error,
            retry_delay: report.retry_delay,
            fatal: report.fatal,
            backoff: self.backoff,
            jitter: rules::jitter(),
        };
        self.one_committed(id, event, now).await
    }

    async fn retry(&self, id: JobId, now: SystemTime) -> Result<Job> {
        self.one_committed(id, Event::Retry, now).await
    }

    async fn cancel(&self, id: JobId, reason: String, now: SystemTime) -> Result<Job> {
        self.one_committed(id, Event::Cancel { reason }, now).await
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        self.check()?;
        self.written(
            self.backend
                .set_paused(queue, paused, self.max_paused)
                .await,
        )?;
        // A resume wakes the waiters once it is durable; a pause needs no
        // wake-up (a take re-checks the paused set every time).
        let resumed = if paused {
            Vec::new()
        } else {
            vec![queue.to_owned()]
        };
        self.commit(&[], resumed).await
    }

    async fn set_policy(&self, queue: &str, policy: QueuePolicy) -> Result<()> {
        self.check()?;
        policy.check()?;
        self.written(
            self.backend
                .set_policy(queue, policy, self.max_policies)
                .await,
        )?;
        // Any change may let a held job go: wake the queue's waiters once
        // it is durable (a tighter limit costs them one look).
        self.commit(&[], vec![queue.to_owned()]).await
    }

    async fn policy(&self, queue: &str) -> Result<QueuePolicy> {
        self.check()?;
        let policies = self.backend.policies().await?;
        Ok(policies
            .into_iter()
            .find(|(q, _)| q == queue)
            .map(|(_, p)| p)
            .unwrap_or_default())
    }

    async fn extend(
        &self,
        leases: &[(JobId, LeaseId)],
        progress: &[Option<Report>],
        extend_by: Option<Duration>,
        now: SystemTime,
    ) -> Result<Vec<Extended>> {
        self.check()?;
        if let Some(d) = extend_by {
            rules::later(now, d, "extension")?;
        }
        let events = leases
            .iter()
            .enumerate()
            .map(|(i, &(id, lease_id))| {
                (
                    id,
                    Event::Extend {
                        lease_id,
                        extend_by,
                        progress: progress.get(i).cloned().flatten(),
                    },
                )
            })
            .collect();
        let results = self.written(self.backend.apply(events, now).await)?;
        let changed: Vec<Change> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().cloned())
            .collect();
        if !changed.is_empty() {
            // Its round also covers the state that refused the others.
            self.commit(&changed, Vec::new()).await?;
        } else if !results.is_empty() {
            // Every lease refused: the state that refused them (a reclaim
            // or cancel applied, its round still running) may not be
            // durable yet, and a worker told "lost" drops its job; a crash
            // must not bring that lease back.
            self.backend
                .durable()
                .await
                .map_err(|e| self.stop.stop(&e.to_string()))?;
        }
        Ok(results
            .into_iter()
            .map(|r| r.map(|c| without_payload(c.new)))
            .collect())
    }

    async fn reclaim(
        &self,
        id: JobId,
        lease_id: LeaseId,
        outcome: Outcome,
        now: SystemTime,
    ) -> Result<Job> {
        // A stream that ended here reclaims what it held, unless a worker
        // reconnected to another server meanwhile and that server's stream
        // adopted the lease (its connection here was half-open): reclaiming
        // it would make that worker's ack fail and run the job again.
        if outcome == Outcome::WorkerDisconnected
            && match self.backend.cluster() {
                Some(cluster) => cluster.held_elsewhere(id, lease_id).await?,
                None => false,
            }
        {
            return Err(Error::Transition(
                crate::machine::TransitionError::StaleLease { id, lease_id },
            ));
        }
        self.one_committed(id, Event::Reclaim { lease_id, outcome }, now)
            .await
    }

    async fn give_back(&self, id: JobId, lease_id: LeaseId, now: SystemTime) -> Result<Job> {
        let event = Event::Return {
            lease_id,
            if_expired: false,
        };
        self.one_committed(id, event, now).await
    }

    async fn reclaim_expired(
        &self,
        now: SystemTime,
        undelivered: &(dyn Fn(LeaseId) -> bool + Sync),
    ) -> Result<Vec<(Job, LeaseId)>> {
        self.check()?;
        let expired = self.backend.expiring(now).await?;
        if expired.is_empty() {
            return Ok(Vec::new());
        }
        let events = expired
            .iter()
            .map(|&(id, lease_id)| {
                let event = if undelivered(lease_id) {
                    Event::Return {
                        lease_id,
                        if_expired: true,
                    }
                } else {
                    Event::Reclaim {
                        lease_id,
                        outcome: Outcome::LeaseExpired,
                    }
                };
                (id, event)
            })
            .collect();
        let results = self.written(self.backend.apply(events, now).await)?;
        // An entry that fails was heartbeated, acked or failed since it was
        // listed: nothing to reclaim.
        let changed: Vec<Change> = results.into_iter().filter_map(Result::ok).collect();
        if changed.is_empty() {
            return Ok(Vec::new());
        }
        self.commit(&changed, Vec::new()).await?;
        Ok(changed
            .into_iter()
            .filter_map(|c| {
                c.old
                    .lease_id()
                    .map(|lease| (without_payload(c.new), lease))
            })
            .collect())
    }

    async fn restart_grace(&self, grace: Option<Duration>, now: SystemTime) -> Result<usize> {
        self.check()?;
        if self.backend.cluster().is_some() {
            // The other servers kept running (and reaping): this server's
            // restart paused no lease.
            return Ok(0);
        }
        if let Some(d) = grace {
            rules::later(now, d, "restart grace")?;
        }
        // Every lease out: none can outlast a grace of its own length by
        // more than that length, and the machine never shortens a lease.
        let all = self
            .backend
            .expiring(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(u32::MAX) * 64))
            .await?;
        if all.is_empty() {
            return Ok(0);
        }
        let events = all
            .iter()
            .map(|&(id, lease_id)| (id, Event::RestartGrace { lease_id, grace }))
            .collect();
        let results = self.written(self.backend.apply(events, now).await)?;
        let changed: Vec<Change> = results
            .into_iter()
            .filter_map(Result::ok)
            .filter(|c| c.old != c.new)
            .collect();
        self.commit(&changed, Vec::new()).await?;
        Ok(changed.len())
    }

    async fn purge(&self, done_before: SystemTime, failed_before: SystemTime) -> Result<u64> {
        self.purge_where(Retention {
            done_before,
            failed_before,
            queue: None,
            pending_through: None,
        })
        .await
    }

    async fn purge_jobs(
        &self,
        queue: &str,
        status: Option<Status>,
        finished_before: SystemTime,
    ) -> Result<u64> {
        let never = SystemTime::UNIX_EPOCH;
        let (done_before, failed_before) = match status {
            None => (finished_before, finished_before),
            Some(Status::Done) => (finished_before, never),
            Some(Status::Failed) => (never, finished_before),
            Some(Status::Pending) => {
                self.check()?;
                // The PENDING jobs there are now; those enqueued while the
                // purge runs stay (a purge under a steady stream of
                // enqueues ends).
                let Some(last) = self.backend.last_pending(queue).await? else {
                    return Ok(0);
                };
                let purged = self
                    .purge_where(Retention {
                        done_before: never,
                        failed_before: never,
                        queue: Some(queue.to_owned()),
                        pending_through: Some(last),
                    })
                    .await?;
                // A purged job may have held its group (a sequence's head).
                if self.backend.limited(queue) {
                    self.commit(&[], vec![queue.to_owned()]).await?;
                }
                return Ok(purged);
            }
            Some(Status::Running) => {
                return Err(Error::InvalidArgument(rules::RUNNING_PURGE.into()))
            }
        };
        self.purge_where(Retention {
            done_before,
            failed_before,
            queue: Some(queue.to_owned()),
            pending_through: None,
        })
        .await
    }

    async fn delete(&self, id: JobId) -> Result<()> {
        self.check()?;
        self.written(self.backend.delete(id).await)?;
        // A deleted job's freed key needs no wake-up, but a PENDING one
        // may have held its group (a sequence's head) in a queue with a
        // policy, whose name the delete does not return: every waiter
        // looks once (deletes are an operator's, and rare).
        self.commit(&[], Vec::new()).await?;
        self.signals.bump_changes();
        Ok(())
    }

    async fn put_schedule(
        &self,
        schedule: Schedule,
        room: impl FnOnce(&[Schedule]) -> Result<()> + Send,
    ) -> Result<()> {
        self.check()?;
        let _alone = self.schedule_gate.write().await;
        room(&self.backend.schedules().await?)?;
        self.written(self.backend.put_schedule(&schedule).await)?;
        self.commit(&[], Vec::new()).await
    }

    async fn delete_schedule(&self, name: &str) -> Result<Option<Schedule>> {
        self.check()?;
        let _alone = self.schedule_gate.write().await;
        let gone = self.written(self.backend.delete_schedule(name).await)?;
        self.commit(&[], Vec::new()).await?;
        Ok(gone)
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        self.check()?;
        self.backend.schedules().await
    }

    async fn schedule_ticked(&self, schedule: &Schedule, tick: SystemTime) -> Result<()> {
        self.check()?;
        self.written(
            self.backend
                .schedule_ticked(&schedule.name, schedule.created_at, tick)
                .await,
        )?;
        self.commit(&[], Vec::new()).await
    }

    async fn fire_schedule(
        &self,
        schedule: &Schedule,
        tick: SystemTime,
        job: NewJob,
    ) -> Result<Option<Enqueued>> {
        self.check()?;
        // Creates and deletes wait for the ticks under way, and a tick
        // after them finds the schedule changed.
        let _shared = self.schedule_gate.read().await;
        match self.backend.schedule(&schedule.name).await? {
            Some(current) if current.created_at == schedule.created_at => {}
            _ => return Ok(None),
        }
        let enqueued = self.enqueue(job, self.backend.now()).await?;
        self.schedule_ticked(schedule, tick).await?;
        Ok(Some(enqueued))
    }

    async fn heartbeat(&self) -> Result<()> {
        self.check()?;
        match self.backend.cluster() {
            Some(cluster) => cluster.heartbeat().await,
            None => Ok(()),
        }
    }

    async fn reclaim_orphaned(&self, now: SystemTime) -> Result<Vec<(Job, LeaseId)>> {
        self.check()?;
        let Some(cluster) = self.backend.cluster() else {
            return Ok(Vec::new());
        };
        let changed = self.written(cluster.reclaim_orphaned(now).await)?;
        self.reclaimed(changed).await
    }

    async fn adopt(&self, leases: &[(JobId, LeaseId)]) -> Result<()> {
        self.check()?;
        match self.backend.cluster() {
            Some(cluster) if !leases.is_empty() => cluster.adopt(leases).await,
            _ => Ok(()),
        }
    }

    async fn leave(&self) -> Result<()> {
        match self.backend.cluster() {
            Some(cluster) => cluster.leave().await,
            None => Ok(()),
        }
    }

    fn shared(&self) -> bool {
        self.backend.cluster().is_some()
    }

    fn now(&self) -> SystemTime {
        self.backend.now()
    }

    async fn notification_queue_usage(&self) -> Result<Option<f64>> {
        self.check()?;
        match self.backend.cluster() {
            Some(cluster) => cluster.notification_queue_usage().await,
            None => Ok(None),
        }
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.check()?;
        self.backend.get(id).await
    }

    async fn peek(&self, id: JobId) -> Result<Job> {
        self.check()?;
        self.backend.peek(id).await.map(without_payload)
    }

    async fn list(&self, filter: ListFilter) -> Result<Page> {
        self.check()?;
        self.backend.list(filter).await
    }

    async fn stats(&self, queue: Option<&str>, now: SystemTime) -> Result<Vec<QueueStats>> {
        self.check()?;
        let mut stats = self.backend.stats(queue, now).await?;
        let paused = self.backend.paused().await?;
        rules::mark_paused(&mut stats, &paused, queue);
        let policies = self.backend.policies().await?;
        rules::mark_policies(&mut stats, &policies, queue);
        Ok(stats)
    }

    async fn next_run_at(&self, queues: &[String]) -> Result<Option<SystemTime>> {
        self.check()?;
        self.backend.next_run_at(queues).await
    }

    async fn next_lease_expiry(&self) -> Result<Option<SystemTime>> {
        self.check()?;
        self.signals.arming();
        let next = self.backend.next_lease_expiry().await?;
        self.signals.armed(next.map_or(u64::MAX, rules::epoch_ms));
        Ok(next)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.signals.changes()
    }

    fn due_version(&self, queues: &[String]) -> u64 {
        self.signals.due_version(queues)
    }

    fn lease_changes(&self) -> watch::Receiver<u64> {
        self.signals.lease_changes()
    }

    fn resyncs(&self) -> watch::Receiver<u64> {
        self.signals.resyncs()
    }

    fn registered(&self) -> watch::Receiver<bool> {
        self.signals.registered()
    }

    fn set_registered(&self, registered: bool) {
        self.signals.set_registered(registered);
    }

    fn liveness(&self) -> Liveness {
        self.signals.liveness()
    }

    fn on_lease_ended(&self, listener: Listener) {
        self.signals.subscribe(listener);
    }

    fn observe(&self, observer: Observer) {
        self.signals.observe(observer);
    }

    fn fail_stopped(&self) -> CancellationToken {
        self.stop.token.clone()
    }

    fn fail_cause(&self) -> Option<String> {
        self.stop.cause.get().map(|c| c.to_string())
    }

    async fn flush(&self) -> Result<()> {
        self.check()?;
        self.backend
            .durable()
            .await
            .map_err(|e| self.stop.stop(&e.to_string()))
    }

    async fn close(&self) -> Result<()> {
        self.check()?;
        self.backend
            .close()
            .await
            .map_err(|e| self.stop.stop(&e.to_string()))
    }
}
