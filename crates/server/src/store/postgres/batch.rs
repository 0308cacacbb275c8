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
//! a lane free goes at once, alone (no added latency when idle).

use std::{sync::Arc, time::SystemTime};

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
    /// One entry of a call.
    type Item: Send + 'static;
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
}

impl<O: Op> Batcher<O> {
    /// Starts the batching task for `pg` (held weakly: the task ends with
    /// the backend). `max_events` bounds one transaction; `lanes` bounds
    /// the transactions in flight.
    pub fn start(pg: std::sync::Weak<Core>, max_events: usize, lanes: usize) -> Batcher<O> {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run::<O>(pg, rx, max_events.max(1), lanes.max(1)));
        Batcher { tx }
    }

    /// Runs `items` in the next transaction.
    pub async fn run(&self, items: Vec<O::Item>, now: SystemTime) -> Reply<O> {
        let (reply, rx) = oneshot::channel();
        let request = Request { items, now, reply };
        if self.tx.send(request).is_err() {
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
    max_events: usize,
    lanes: usize,
) {
    let lanes = Arc::new(Semaphore::new(lanes));
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
    for r in batch {
        items.extend(r.items);
        replies.push(r.reply);
    }
    match O::run(pg, items, now).await {
        Ok(results) => {
            let mut results = results.into_iter();
            for (reply, n) in replies.into_iter().zip(sizes) {
                let _ = reply.send(Ok(results.by_ref().take(n).collect()));
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
