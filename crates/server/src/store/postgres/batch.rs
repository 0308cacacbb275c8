//! Group commit for the PostgreSQL store: concurrent calls that arrive
//! while a transaction is in flight go together in the next one, so N
//! acks (or N enqueues) cost one commit (one WAL flush) and one round of
//! statements instead of N.
//!
//! The contract allows it for the two calls batched ([`Op`]):
//! - transitions ([`crate::store::Backend::apply`]: acks, fails,
//!   heartbeats, reclaims) already take many events, applied in order, each
//!   with its own result; a batch of callers is one such call whose events
//!   are theirs in arrival order, so each caller sees exactly what running
//!   alone after the earlier ones would show. Rows are locked in id order,
//!   so batches never deadlock each other.
//! - enqueues ([`crate::store::Backend::insert`]) likewise take many jobs
//!   with one result each; a key repeated by two callers of one batch is
//!   found by the second insert (`ON CONFLICT DO NOTHING` sees the first
//!   row in the same transaction), which returns the first's job, as if
//!   they had run one after the other.
//!
//! At most `lanes` transactions of a kind run at once; a caller that finds
//! a lane free and nobody queued goes at once, alone, in its own task (no
//! added latency when idle: no hop through the batching task).
//!
//! A row's failure fails its own caller only. When a shared transaction
//! fails and surely committed nothing ([`PgError::rolled_back`]: a
//! constraint or value one row broke, a key freed by a delete in between,
//! a deadlock), each of its callers runs again alone, in arrival order, in
//! a transaction of its own: the one whose row fails gets its own error,
//! naming only its own data, and the others their results. When the
//! connection broke instead (a commit may have been applied, so running
//! again could apply it twice), or the database timed out or ran short
//! (which running each caller again would only repeat), every caller gets
//! that failure, which names no caller's data.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::SystemTime,
};

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{error::PgError, insert, Core};
use crate::{
    error::Result,
    job::{JobId, NewJob},
    machine::Event,
    store::{Change, Enqueued},
};

/// A kind of call that can share a transaction with others of its kind.
pub trait Op: Send + Sync + 'static {
    /// One entry of a call (cloned to run a caller again alone).
    type Item: Clone + Send + 'static;
    /// Its result.
    type Out: Send + 'static;
    /// Runs entries in one transaction: one result per entry, in order.
    fn run(
        core: Arc<Core>,
        items: Vec<Self::Item>,
        now: SystemTime,
    ) -> impl std::future::Future<Output = std::result::Result<Vec<Self::Out>, PgError>> + Send;
}

/// Transitions.
pub struct Apply;

impl Op for Apply {
    type Item = (JobId, Event);
    type Out = Result<Change>;

    async fn run(
        core: Arc<Core>,
        items: Vec<Self::Item>,
        now: SystemTime,
    ) -> std::result::Result<Vec<Self::Out>, PgError> {
        core.apply_events(items, now).await
    }
}

/// Enqueues.
pub struct Insert;

impl Op for Insert {
    type Item = NewJob;
    type Out = Enqueued;

    async fn run(
        core: Arc<Core>,
        items: Vec<Self::Item>,
        now: SystemTime,
    ) -> std::result::Result<Vec<Self::Out>, PgError> {
        insert::insert(&core, items, now).await
    }
}

/// What a caller gets back.
type Reply<O> = std::result::Result<Vec<<O as Op>::Out>, PgError>;

/// One caller's entries, waiting for a transaction.
pub struct Request<O: Op> {
    items: Vec<O::Item>,
    now: SystemTime,
    reply: oneshot::Sender<Reply<O>>,
}

/// The queue in front of one kind of transaction.
pub struct Batcher<O: Op> {
    tx: mpsc::UnboundedSender<Request<O>>,
    /// Calls sent and not yet in a transaction.
    queued: Arc<AtomicUsize>,
    /// The transactions in flight, one permit each.
    lanes: Arc<Semaphore>,
    pg: std::sync::Weak<Core>,
}

impl<O: Op> Batcher<O> {
    /// Starts the batching task for `pg` (held weakly: the task ends with
    /// the backend). `max_events` bounds one transaction; `lanes` bounds
    /// the transactions in flight.
    pub fn start(pg: std::sync::Weak<Core>, max_events: usize, lanes: usize) -> Batcher<O> {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let lanes = Arc::new(Semaphore::new(lanes.max(1)));
        tokio::spawn(run::<O>(
            pg.clone(),
            rx,
            Arc::clone(&queued),
            max_events.max(1),
            Arc::clone(&lanes),
        ));
        Batcher {
            tx,
            queued,
            lanes,
            pg,
        }
    }

    /// How many calls wait for a transaction (every lane was busy).
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Runs `items` in the next transaction.
    pub async fn run(&self, items: Vec<O::Item>, now: SystemTime) -> Reply<O> {
        if self.queued.load(Ordering::Relaxed) == 0 {
            if let (Ok(_permit), Some(pg)) = (self.lanes.try_acquire(), self.pg.upgrade()) {
                // A lane is free and nobody waits: alone, at once.
                return O::run(pg, items, now).await;
            }
        }
        let (reply, rx) = oneshot::channel();
        let request = Request { items, now, reply };
        self.queued.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(request).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(PgError::Shared {
                message: "the store is closing".into(),
                transient: true,
            });
        }
        rx.await.unwrap_or_else(|_| {
            Err(PgError::Shared {
                message: "a group-commit transaction was dropped".into(),
                transient: true,
            })
        })
    }
}

async fn run<O: Op>(
    pg: std::sync::Weak<Core>,
    mut rx: mpsc::UnboundedReceiver<Request<O>>,
    queued: Arc<AtomicUsize>,
    max_events: usize,
    lanes: Arc<Semaphore>,
) {
    while let Some(first) = rx.recv().await {
        // Wait for a free lane first: whatever queues meanwhile joins this
        // batch.
        let Ok(permit) = Arc::clone(&lanes).acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        let mut size = batch[0].items.len();
        while size < max_events {
            match rx.try_recv() {
                Ok(next) => {
                    size += next.items.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        queued.fetch_sub(batch.len(), Ordering::Relaxed);
        let Some(pg) = pg.upgrade() else { return };
        tokio::spawn(async move {
            let _permit = permit;
            commit::<O>(pg, batch).await;
        });
    }
}

/// Runs one batch in one transaction and answers each caller.
async fn commit<O: Op>(pg: Arc<Core>, batch: Vec<Request<O>>) {
    // The latest `now` of the batch: with the database's clock it is
    // ignored; with the caller's (tests) every caller of a batch is
    // replaying its own time, so a batch of one keeps it exact.
    let now = batch
        .iter()
        .map(|r| r.now)
        .max()
        .unwrap_or_else(SystemTime::now);
    if batch.len() == 1 {
        let Some(r) = batch.into_iter().next() else {
            return;
        };
        let _ = r.reply.send(O::run(pg, r.items, r.now).await);
        return;
    }
    pg.count_batch(batch.len());
    let sizes: Vec<usize> = batch.iter().map(|r| r.items.len()).collect();
    let mut items = Vec::with_capacity(sizes.iter().sum());
    let mut replies = Vec::with_capacity(batch.len());
    // Each caller's own entries, kept to run it alone should the shared
    // transaction fail.
    let mut alone = Vec::with_capacity(batch.len());
    for r in batch {
        items.extend(r.items.iter().cloned());
        alone.push((r.items, r.now));
        replies.push(r.reply);
    }
    match O::run(Arc::clone(&pg), items, now).await {
        Ok(results) => {
            let mut results = results.into_iter();
            for (reply, n) in replies.into_iter().zip(sizes) {
                let _ = reply.send(Ok(results.by_ref().take(n).collect()));
            }
        }
        Err(err) if err.rolled_back() => {
            // Nothing was committed: each caller alone, so that one
            // caller's row fails that caller only.
            for (reply, (items, now)) in replies.into_iter().zip(alone) {
                let _ = reply.send(O::run(Arc::clone(&pg), items, now).await);
            }
        }
        Err(err) => {
            let (message, transient) = (err.to_string(), err.transient());
            for reply in replies {
                let _ = reply.send(Err(PgError::Shared {
                    message: message.clone(),
                    transient,
                }));
            }
        }
    }
}
