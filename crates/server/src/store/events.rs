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

/// The store's outgoing signals.
pub(crate) struct Signals {
    changes: watch::Sender<u64>,
    lease_changes: watch::Sender<u64>,
    resyncs: watch::Sender<u64>,
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
            lease_changes: watch::Sender::new(0),
            resyncs: watch::Sender::new(0),
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

    /// Wakes waiters: a job may be due.
    pub(crate) fn bump_changes(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
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
