//! Stream takes that arrive together share one transaction: one `FOR UPDATE SKIP
//! LOCKED LIMIT n` for the n callers that want a job of the same queues,
//! instead of n transactions that each take one.
//!
//! Lease streams are woken together (a job became due, docs/src/design.md
//! §3): before, every woken stream ran a transaction of its own, one of
//! them found the job, and each of the others found nothing and then asked
//! for the next due time, another round trip. Now the takes queue here;
//! at most [`LANES`] transactions of takes run at once, and the takes that
//! arrived meanwhile go together in the next, grouped by their queues
//! (a take that finds a lane free goes at once, alone: no added latency
//! when idle). Each caller gets its own job (its own lease id, worker,
//! lease length), in the order the callers arrived and the jobs are due
//! (rule 5), or nothing when there were fewer due jobs than callers.
//!
//! A batch that comes up short also reads the queues' next due time in
//! the same transaction ([`super::queries::NEXT_RUN_AT`]); the callers
//! that got nothing ask for it next, and get that reading
//! ([`Recent`]) instead of a round trip of their own. That reading is
//! never staler than their take: a job made due after the take's snapshot
//! wakes them anew (its wake-up comes after its commit, and they watch for
//! wake-ups from before their take).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{error::PgError, take, Core};
use crate::{machine::Event, store::Change};

/// Take transactions in flight at once, per server.
pub const LANES: usize = 2;

/// Most takes in one transaction.
const MOST: usize = 64;

/// How long a short batch's reading of the next due time answers the
/// callers that got nothing.
const RECENT: Duration = Duration::from_millis(100);

/// One caller's take.
struct Request {
    queues: Vec<String>,
    event: Event,
    streamed: bool,
    now: SystemTime,
    reply: oneshot::Sender<Result<Option<Change>, PgError>>,
}

/// The queue in front of the take transactions.
pub struct Takes {
    tx: mpsc::UnboundedSender<Request>,
    /// Takes sent and not yet in a transaction.
    queued: Arc<AtomicUsize>,
    /// The take transactions in flight, one permit each.
    lanes: Arc<Semaphore>,
    pg: std::sync::Weak<Core>,
}

/// A reading of the next due time (`None`: no pending job), and when it
/// was made.
type Reading = (Instant, Option<SystemTime>);

/// Next due times read by short batches, by queues.
#[derive(Default)]
pub struct Recent(Mutex<HashMap<Vec<String>, Reading>>);

impl Recent {
    /// The reading for `queues`, if one was made within [`RECENT`].
    pub fn get(&self, queues: &[String]) -> Option<Option<SystemTime>> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(queues)
            .filter(|(at, _)| at.elapsed() < RECENT)
            .map(|(_, next)| *next)
    }

    /// Drops the reading for `queues`.
    pub fn forget(&self, queues: &[String]) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(queues);
    }

    fn put(&self, queues: &[String], next: Option<SystemTime>) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (at, _)| at.elapsed() < RECENT);
        map.insert(queues.to_vec(), (Instant::now(), next));
    }
}

impl Takes {
    /// Starts the batching task for `pg` (held weakly: the task ends with
    /// the backend).
    pub fn start(pg: std::sync::Weak<Core>) -> Takes {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let lanes = Arc::new(Semaphore::new(LANES));
        tokio::spawn(run(pg.clone(), rx, Arc::clone(&queued), Arc::clone(&lanes)));
        Takes {
            tx,
            queued,
            lanes,
            pg,
        }
    }

    /// Takes a job as [`crate::store::Backend::take`], in the next
    /// transaction of takes.
    pub async fn take(
        &self,
        queues: &[String],
        event: Event,
        streamed: bool,
        now: SystemTime,
    ) -> Result<Option<Change>, PgError> {
        if self.queued.load(Ordering::Relaxed) == 0 {
            if let (Ok(_permit), Some(pg)) = (self.lanes.try_acquire(), self.pg.upgrade()) {
                // A lane is free and nobody waits: alone, at once, in the
                // caller's task.
                let queues = queues.to_vec();
                let (mut changes, next) =
                    take::take_many(&pg, &queues, vec![event], streamed, now).await?;
                let change = changes.pop();
                if change.is_none() {
                    pg.recent.put(&queues, next);
                }
                return Ok(change);
            }
        }
        let (reply, rx) = oneshot::channel();
        let request = Request {
            queues: queues.to_vec(),
            event,
            streamed,
            now,
            reply,
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(request).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(PgError::Raced("the store is closing".into()));
        }
        rx.await
            .unwrap_or_else(|_| Err(PgError::Raced("a take transaction was dropped".into())))
    }
}

async fn run(
    pg: std::sync::Weak<Core>,
    mut rx: mpsc::UnboundedReceiver<Request>,
    queued: Arc<AtomicUsize>,
    lanes: Arc<Semaphore>,
) {
    while let Some(first) = rx.recv().await {
        // Wait for a free lane first: whatever queues meanwhile joins.
        let Ok(permit) = Arc::clone(&lanes).acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MOST {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        queued.fetch_sub(batch.len(), Ordering::Relaxed);
        // By queues (and kind of take), in arrival order.
        let mut groups: Vec<Vec<Request>> = Vec::new();
        for r in batch {
            match groups
                .iter_mut()
                .find(|g| g[0].queues == r.queues && g[0].streamed == r.streamed)
            {
                Some(g) => g.push(r),
                None => groups.push(vec![r]),
            }
        }
        let mut permit = Some(permit);
        for group in groups {
            let permit = match permit.take() {
                Some(p) => p,
                None => match Arc::clone(&lanes).acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let Some(pg) = pg.upgrade() else { return };
            tokio::spawn(async move {
                let _permit = permit;
                commit(&pg, group).await;
            });
        }
    }
}

/// Runs one group's takes in one transaction and answers each caller.
async fn commit(pg: &Core, group: Vec<Request>) {
    let queues = group[0].queues.clone();
    let streamed = group[0].streamed;
    let now = group
        .iter()
        .map(|r| r.now)
        .max()
        .unwrap_or_else(SystemTime::now);
    let (events, replies): (Vec<Event>, Vec<_>) =
        group.into_iter().map(|r| (r.event, r.reply)).unzip();
    let wanted = events.len();
    match take::take_many(pg, &queues, events, streamed, now).await {
        Ok((changes, next)) => {
            if changes.len() < wanted {
                pg.recent.put(&queues, next);
            }
            let mut changes = changes.into_iter();
            for reply in replies {
                let _ = reply.send(Ok(changes.next()));
            }
        }
        Err(err) => {
            let unregistered = matches!(err, PgError::Unregistered);
            let (message, transient) = (err.to_string(), err.transient());
            for reply in replies {
                let _ = reply.send(Err(if unregistered {
                    PgError::Unregistered
                } else {
                    PgError::Shared {
                        message: message.clone(),
                        transient,
                    }
                }));
            }
        }
    }
}
