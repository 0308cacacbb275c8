//! Group commit for the PostgreSQL store: concurrent transitions (acks,
//! fails, heartbeats, reclaims) that arrive while a transaction is in
//! flight are applied together in the next one, so N acks cost one commit
//! (one WAL flush) and one lock-and-write round instead of N.
//!
//! The contract allows it: [`crate::store::Backend::apply`] already takes
//! many events, applied in order, each with its own result; a batch of
//! callers is one such call whose events are theirs in arrival order, so
//! each caller sees exactly what running its call alone after the earlier
//! ones would show. Rows are locked in id order, so batches never deadlock
//! each other. At most `lanes` transactions run at once; a caller that finds
//! a lane free goes at once, alone (no added latency when idle).

use std::{sync::Arc, time::SystemTime};

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{error::PgError, Core};
use crate::{error::Result, job::JobId, machine::Event, store::Change};

/// What a caller gets back.
type Reply = std::result::Result<Vec<Result<Change>>, PgError>;

/// One caller's transitions, waiting for a transaction.
pub struct Request {
    events: Vec<(JobId, Event)>,
    now: SystemTime,
    reply: oneshot::Sender<Reply>,
}

/// The queue in front of the transactions.
pub struct Batcher {
    tx: mpsc::UnboundedSender<Request>,
}

impl Batcher {
    /// Starts the batching task for `pg` (held weakly: the task ends with
    /// the backend). `max_events` bounds one transaction; `lanes` bounds
    /// the transactions in flight.
    pub fn start(pg: std::sync::Weak<Core>, max_events: usize, lanes: usize) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(pg, rx, max_events.max(1), lanes.max(1)));
        Batcher { tx }
    }

    /// Applies `events` in the next transaction.
    pub async fn apply(&self, events: Vec<(JobId, Event)>, now: SystemTime) -> Reply {
        let (reply, rx) = oneshot::channel();
        let request = Request { events, now, reply };
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

async fn run(
    pg: std::sync::Weak<Core>,
    mut rx: mpsc::UnboundedReceiver<Request>,
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
        let mut size = batch[0].events.len();
        while size < max_events {
            match rx.try_recv() {
                Ok(next) => {
                    size += next.events.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let Some(pg) = pg.upgrade() else { return };
        tokio::spawn(async move {
            let _permit = permit;
            commit(&pg, batch).await;
        });
    }
}

/// Runs one batch in one transaction and answers each caller.
async fn commit(pg: &Core, batch: Vec<Request>) {
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
        let _ = r.reply.send(pg.apply_events(r.events, r.now).await);
        return;
    }
    pg.count_batch(batch.len());
    let sizes: Vec<usize> = batch.iter().map(|r| r.events.len()).collect();
    let mut events = Vec::with_capacity(sizes.iter().sum());
    let mut replies = Vec::with_capacity(batch.len());
    for r in batch {
        events.extend(r.events);
        replies.push(r.reply);
    }
    match pg.apply_events(events, now).await {
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
