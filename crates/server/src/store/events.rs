//! What the store tells the rest of the server, and when.
//!
//! - **Lease ended** ([`LeaseEnded`]): published the moment a change that
//!   ends a lease is applied (ack, fail, reclaim, expiry, give-back), to
//!   every registered [`Listener`], synchronously. Not from an RPC handler's
//!   continuation: a client that cancels its Ack must not leak the stream
//!   slot the ack frees. Published before the change is durable, so the
//!   next push overlaps the ack's fsync; a crash in between only means a
//!   redelivery, which at-least-once allows.
//! - **Changes** (a watch counter): bumped only after the change is durable,
//!   so no worker is handed a job whose enqueue could still be lost.
//! - **Lease changes** (a watch counter): bumped when a lease may now expire
//!   sooner than the reaper's timer, so it re-arms.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, RwLock, Weak,
};

use tokio::sync::watch;

use crate::job::{Job, JobId, LeaseId, Outcome, Status};
use crate::liveness::Liveness;

/// A lease ended: its job left RUNNING (or was leased again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEnded {
    /// The job.
    pub job: JobId,
    /// The lease that ended.
    pub lease: LeaseId,
    /// The job's queue.
    pub queue: String,
    /// How the attempt ended; `None` when the take was undone (the job never
    /// reached its worker, and no attempt was counted).
    pub outcome: Option<Outcome>,
    /// The job's status after the change.
    pub status: Status,
    /// The lease did not end for its job: the worker that holds it declared
    /// it on a stream of another server, which holds it from now on (the
    /// job stays RUNNING under it). Only the stream it left is affected.
    pub moved: bool,
}

impl LeaseEnded {
    /// The lease-ended event of a change from `old` to `new`, if it ended
    /// `old`'s lease.
    pub fn of(old: &Job, new: &Job) -> Option<LeaseEnded> {
        let lease = old.lease.as_ref()?;
        if new.lease_id() == Some(lease.id) {
            return None;
        }
        let outcome = new
            .history
            .iter()
            .rev()
            .find(|a| a.lease_id == lease.id)
            .and_then(|a| a.outcome);
        Some(LeaseEnded {
            job: old.id,
            lease: lease.id,
            queue: old.queue.clone(),
            outcome,
            status: new.status,
            moved: false,
        })
    }
}

/// A change the store applied, for observers that count facts where they
/// happen (metrics): published once per change, when it is applied.
#[derive(Debug, Clone, Copy)]
pub enum Fact<'a> {
    /// A job was created by an enqueue.
    Created(&'a Job),
    /// A job changed.
    Changed {
        /// As it was.
        old: &'a Job,
        /// As it is now.
        new: &'a Job,
    },
}

/// A subscriber to every applied change. Runs inside the store's call:
/// quick, never blocking.
pub type Observer = Arc<dyn Fn(&Fact<'_>) + Send + Sync>;

/// A subscriber to lease-ended events. It runs inside the store's call, so
/// it must be quick and must not block (send on a channel, update a map).
pub type Listener = Arc<dyn Fn(&LeaseEnded) + Send + Sync>;

/// What a backend shared by several servers (PostgreSQL) passes on from
/// the others: their lease-ended events and wake-ups arrive here, and are
/// published to this server's listeners as if the change had been made
/// locally. Holds the signals weakly: a backend task outliving its store
/// publishes nothing.
#[derive(Clone)]
pub struct Remote {
    signals: Weak<Signals>,
}

impl Remote {
    pub(crate) fn new(signals: &Arc<Signals>) -> Remote {
        Remote {
            signals: Arc::downgrade(signals),
        }
    }

    /// Another server ended a lease (its change is committed).
    pub fn lease_ended(&self, ended: &LeaseEnded) {
        if let Some(signals) = self.signals.upgrade() {
            signals.lease_ended(std::slice::from_ref(ended));
        }
    }

    /// Another server made a job due, or may have (committed): waiters
    /// re-check.
    pub fn due(&self) {
        if let Some(signals) = self.signals.upgrade() {
            signals.bump_changes();
        }
    }

    /// A job of `queue` may be due (another server's change): wakes the
    /// waiters of that queue.
    pub fn due_in(&self, queue: &str) {
        if let Some(signals) = self.signals.upgrade() {
            signals.bump_due([queue]);
        }
    }

    /// A lease this server's backend just wrote expires at `at`: re-arm
    /// the reaper if that is sooner than its timer. For a change whose
    /// caller may not get to publish it (a take that then waits).
    pub fn lease_expires(&self, at: std::time::SystemTime) {
        if let Some(signals) = self.signals.upgrade() {
            signals.lease_expires(super::rules::epoch_ms(at));
        }
    }

    /// Lease-ended events of other servers may have been missed (the
    /// connection that hears them broke): the lease hub checks the leases
    /// its streams hold against the store.
    pub fn resync(&self) {
        if let Some(signals) = self.signals.upgrade() {
            signals.resyncs.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A lease may now expire sooner than the reaper's timer (another
    /// server took it): the reaper re-arms.
    pub fn rearm(&self) {
        if let Some(signals) = self.signals.upgrade() {
            signals
                .lease_changes
                .send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// Per-queue due counters, by a hash of the queue's name: a fixed number,
/// however many queue names come and go. Two queues that share one only
/// cost each other's waiters a needless look.
const DUE_BUCKETS: usize = 256;

fn due_bucket(queue: &str) -> usize {
    use std::hash::{Hash, Hasher};
    // Keyless, so the same queue lands in the same bucket every time.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    queue.hash(&mut h);
    (h.finish() % DUE_BUCKETS as u64) as usize
}

/// The store's outgoing signals.
pub(crate) struct Signals {
    /// Bumped whenever a job may have become due; waiters then compare
    /// [`Signals::due_version`] of their queues with what they last saw.
    changes: watch::Sender<u64>,
    /// Bumped for "any queue" (a resync, a reconnect).
    due_all: AtomicU64,
    /// Bumped for the queues in each bucket ([`due_bucket`]).
    due_buckets: Box<[AtomicU64]>,
    lease_changes: watch::Sender<u64>,
    resyncs: watch::Sender<u64>,
    /// Whether this server's own heartbeat to a shared store is fresh (see
    /// [`crate::store::Store::registered`]); always true otherwise.
    registered: watch::Sender<bool>,
    /// The deadline behind [`Signals::registered`], read at the moment a
    /// lease leaves for the wire (see [`Liveness`]).
    liveness: Liveness,
    listeners: RwLock<Vec<Listener>>,
    observers: RwLock<Vec<Observer>>,
    /// The earliest lease expiry the reaper may be sleeping towards, in ms
    /// since the epoch (`u64::MAX`: none); a lease expiring sooner re-arms
    /// it. Lowered here, raised by the reaper's own query.
    armed_ms: AtomicU64,
}

impl Default for Signals {
    fn default() -> Self {
        Signals {
            changes: watch::Sender::new(0),
            due_all: AtomicU64::new(0),
            due_buckets: (0..DUE_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            lease_changes: watch::Sender::new(0),
            resyncs: watch::Sender::new(0),
            registered: watch::Sender::new(true),
            liveness: Liveness::default(),
            listeners: RwLock::new(Vec::new()),
            observers: RwLock::new(Vec::new()),
            // Not armed yet: the first lease re-arms.
            armed_ms: AtomicU64::new(u64::MAX),
        }
    }
}

impl Signals {
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub(crate) fn lease_changes(&self) -> watch::Receiver<u64> {
        self.lease_changes.subscribe()
    }

    pub(crate) fn resyncs(&self) -> watch::Receiver<u64> {
        self.resyncs.subscribe()
    }

    pub(crate) fn registered(&self) -> watch::Receiver<bool> {
        self.registered.subscribe()
    }

    pub(crate) fn liveness(&self) -> Liveness {
        self.liveness.clone()
    }

    pub(crate) fn is_registered(&self) -> bool {
        *self.registered.borrow()
    }

    pub(crate) fn set_registered(&self, registered: bool) {
        self.registered
            .send_if_modified(|r| std::mem::replace(r, registered) != registered);
    }

    pub(crate) fn subscribe(&self, listener: Listener) {
        self.listeners
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(listener);
    }

    pub(crate) fn observe(&self, observer: Observer) {
        self.observers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(observer);
    }

    /// Tells the observers about applied changes.
    pub(crate) fn facts<'a>(&self, facts: impl Iterator<Item = Fact<'a>>) {
        let observers = self.observers.read().unwrap_or_else(|p| p.into_inner());
        if observers.is_empty() {
            return;
        }
        for fact in facts {
            for observer in observers.iter() {
                observer(&fact);
            }
        }
    }

    /// Wakes every waiter: a job of any queue may be due.
    pub(crate) fn bump_changes(&self) {
        self.due_all.fetch_add(1, Ordering::SeqCst);
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Wakes the waiters of `queues`: a job of theirs may be due. (Every
    /// waiter wakes, and the others find their version unchanged.)
    pub(crate) fn bump_due<'a>(&self, queues: impl IntoIterator<Item = &'a str>) {
        for queue in queues {
            self.due_buckets[due_bucket(queue)].fetch_add(1, Ordering::SeqCst);
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A number that moves whenever a job of one of `queues` may have
    /// become due: unchanged, a waiter of those queues has nothing new to
    /// look for (and, on PostgreSQL, saves a take's transaction).
    pub(crate) fn due_version(&self, queues: &[String]) -> u64 {
        queues
            .iter()
            .fold(self.due_all.load(Ordering::SeqCst), |v, q| {
                v.wrapping_add(self.due_buckets[due_bucket(q)].load(Ordering::SeqCst))
            })
    }

    /// The reaper is about to look up the earliest expiry: from now on,
    /// every new lease re-arms it until [`Signals::armed`] says what it
    /// found.
    pub(crate) fn arming(&self) {
        self.armed_ms.store(u64::MAX, Ordering::Release);
    }

    /// The reaper armed its timer for `at_ms` (a lease taken meanwhile may
    /// have lowered it already, and then bumped).
    pub(crate) fn armed(&self, at_ms: u64) {
        self.armed_ms.fetch_min(at_ms, Ordering::AcqRel);
    }

    /// A lease now expires at `at_ms`: re-arm the reaper if that is sooner
    /// than its timer.
    pub(crate) fn lease_expires(&self, at_ms: u64) {
        let armed = self.armed_ms.fetch_min(at_ms, Ordering::AcqRel);
        if at_ms < armed {
            self.lease_changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Publishes the lease-ended events of applied changes.
    pub(crate) fn lease_ended(&self, events: &[LeaseEnded]) {
        if events.is_empty() {
            return;
        }
        let listeners = self.listeners.read().unwrap_or_else(|p| p.into_inner());
        for event in events {
            for listener in listeners.iter() {
                listener(event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{due_bucket, Signals};

    fn queues(names: &[&str]) -> Vec<String> {
        names.iter().map(|&n| n.to_owned()).collect()
    }

    #[test]
    fn a_queues_version_moves_for_its_own_jobs_and_for_all_not_for_others() {
        let signals = Signals::default();
        // Two queues in two buckets, whatever the hasher makes of names.
        let a = "emails";
        let b = ["reports", "billing", "thumbnails", "webhooks"]
            .into_iter()
            .find(|q| due_bucket(q) != due_bucket(a))
            .expect("a queue in another bucket");
        let mut changes = signals.changes();
        changes.borrow_and_update();
        let of_a = signals.due_version(&queues(&[a]));
        let of_both = signals.due_version(&queues(&[a, b]));

        signals.bump_due([b]);
        assert!(changes.has_changed().unwrap(), "every waiter wakes");
        assert_eq!(signals.due_version(&queues(&[a])), of_a, "not a's");
        assert_ne!(signals.due_version(&queues(&[a, b])), of_both);

        signals.bump_due([a]);
        let of_a2 = signals.due_version(&queues(&[a]));
        assert_ne!(of_a2, of_a, "a's own");

        signals.bump_changes();
        assert_ne!(signals.due_version(&queues(&[a])), of_a2, "any queue");
    }
}
