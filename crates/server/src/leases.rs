//! Lease streams: the server pushes jobs to workers (DESIGN.md §3).
//!
//! Each `Lease` call gets a task that takes due jobs while the stream holds
//! fewer than its capacity, and sleeps on the store's change signal (or the
//! next delayed job's due time) otherwise. Jobs pushed on a stream belong to
//! it: when the stream ends because the worker went away, they are
//! reclaimed (after `--disconnect-grace`) as "worker disconnected". A
//! server shutdown ends the streams but reclaims nothing: the persisted
//! leases stay valid until they expire.
//!
//! The [`LeaseHub`] is the registry that connects the streams to the rest
//! of the server: the service tells it when a lease ends by ack or fail
//! (the stream's slot frees), the reaper when a lease expired (the stream
//! is told `revoked`), and heartbeats when a worker is draining.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, SystemTime},
};

use jobq::pb::{self, lease_event::Event};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::{
    config::Config,
    job::{JobId, LeaseId, Outcome},
    store::Store,
    validate::TakeSpec,
    waiter::instant_at,
};

/// What a Lease RPC returns: the events of one stream.
pub type LeaseEvents = ReceiverStream<Result<pb::LeaseEvent, tonic::Status>>;

type StreamId = u64;

/// A message from the rest of the server to one stream's task.
#[derive(Debug)]
enum Notice {
    /// The lease ended by ack or fail: its slot is free.
    Released(LeaseId),
    /// The lease was taken away: tell the worker, free the slot.
    Revoked {
        job: JobId,
        lease: LeaseId,
        reason: &'static str,
    },
}

struct StreamEntry {
    worker_id: String,
    notices: mpsc::UnboundedSender<Notice>,
    /// Set by a heartbeat with `draining`: push nothing more.
    draining: watch::Sender<bool>,
}

#[derive(Default)]
struct Registry {
    /// Which stream holds each pushed lease.
    owners: HashMap<LeaseId, StreamId>,
    streams: HashMap<StreamId, StreamEntry>,
    /// Leases of streams that ended, waiting out `--disconnect-grace`; a
    /// heartbeat within the grace adopts them (they stay leased).
    orphans: HashSet<LeaseId>,
}

/// The registry of live Lease streams.
pub struct LeaseHub<S> {
    store: Arc<S>,
    config: Arc<Config>,
    shutdown: CancellationToken,
    registry: Mutex<Registry>,
    next_stream: AtomicU64,
}

/// How a stream's task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The worker closed the stream, died, or its connection broke.
    WorkerGone,
    /// The server is shutting down.
    Shutdown,
    /// The store failed; the worker is told and will reconnect.
    StoreFailed,
}

impl<S: Store> LeaseHub<S> {
    /// A hub over `store`; `shutdown` ends every stream without reclaiming.
    pub fn new(store: Arc<S>, config: Arc<Config>, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(LeaseHub {
            store,
            config,
            shutdown,
            registry: Mutex::new(Registry::default()),
            next_stream: AtomicU64::new(1),
        })
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic elsewhere must not wedge every stream: the registry holds
        // no invariant that a half-finished update could break badly.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a stream for a validated Lease request and starts its task.
    /// `permit` counts the stream against `--max-waiters` while it lives.
    pub fn open(
        self: &Arc<Self>,
        spec: TakeSpec,
        capacity: usize,
        permit: OwnedSemaphorePermit,
    ) -> LeaseEvents {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        // Room for every lease the stream may hold plus their revocations.
        let (tx, rx) = mpsc::channel(capacity.saturating_mul(2).max(4));
        let (notices_tx, notices) = mpsc::unbounded_channel();
        let (draining_tx, draining) = watch::channel(false);
        self.registry().streams.insert(
            id,
            StreamEntry {
                worker_id: spec.worker_id.clone(),
                notices: notices_tx,
                draining: draining_tx,
            },
        );
        let span =
            tracing::info_span!("lease_stream", stream = id, worker.id = %spec.worker_id, capacity);
        let hub = Arc::clone(self);
        tokio::spawn(
            async move {
                let _permit = permit;
                hub.run_stream(id, spec, capacity, tx, notices, draining)
                    .await;
            }
            .instrument(span),
        );
        ReceiverStream::new(rx)
    }

    /// A lease ended by ack or fail: free its stream's slot.
    pub fn released(&self, lease: LeaseId) {
        let mut reg = self.registry();
        reg.orphans.remove(&lease);
        if let Some(stream) = reg.owners.remove(&lease) {
            if let Some(entry) = reg.streams.get(&stream) {
                let _ = entry.notices.send(Notice::Released(lease));
            }
        }
    }

    /// A lease was taken away (expired or revoked): tell its stream.
    pub fn revoked(&self, job: JobId, lease: LeaseId, reason: &'static str) {
        let mut reg = self.registry();
        reg.orphans.remove(&lease);
        if let Some(stream) = reg.owners.remove(&lease) {
            if let Some(entry) = reg.streams.get(&stream) {
                let _ = entry.notices.send(Notice::Revoked { job, lease, reason });
            }
        }
    }

    /// A heartbeat arrived for these leases: any that belonged to a stream
    /// that ended within the grace are kept (not reclaimed). With
    /// `draining`, the worker's streams push no more jobs.
    pub fn heartbeat(&self, worker_id: &str, leases: &[(JobId, LeaseId)], draining: bool) {
        let mut reg = self.registry();
        for (_, lease) in leases {
            reg.orphans.remove(lease);
        }
        if draining {
            for entry in reg.streams.values().filter(|e| e.worker_id == worker_id) {
                entry.draining.send_replace(true);
            }
        }
    }

    /// How many streams are open.
    pub fn open_streams(&self) -> usize {
        self.registry().streams.len()
    }

    async fn run_stream(
        self: Arc<Self>,
        id: StreamId,
        spec: TakeSpec,
        capacity: usize,
        tx: mpsc::Sender<Result<pb::LeaseEvent, tonic::Status>>,
        mut notices: mpsc::UnboundedReceiver<Notice>,
        mut draining: watch::Receiver<bool>,
    ) {
        debug!("lease stream opened");
        let mut held: HashMap<LeaseId, JobId> = HashMap::new();
        let mut changes = self.store.changes();
        let end = 'stream: loop {
            let hungry = held.len() < capacity && !*draining.borrow();
            if hungry {
                changes.borrow_and_update();
                match self
                    .store
                    .take(&spec.queues, &spec.worker_id, spec.lease, SystemTime::now())
                    .await
                {
                    Ok(Some(leased)) => {
                        let (job, lease) = (leased.job.id, leased.lease_id);
                        // Registered before it is sent, so an ack that races
                        // the send still finds its stream.
                        self.registry().owners.insert(lease, id);
                        held.insert(lease, job);
                        debug!(job.id = %job, lease.id = %lease, "pushed");
                        let event = pb::LeaseEvent {
                            event: Some(Event::Leased(leased.into())),
                        };
                        match self.send(&tx, event).await {
                            Sent::Ok => continue,
                            Sent::WorkerGone => break 'stream End::WorkerGone,
                            Sent::Shutdown => break 'stream End::Shutdown,
                        }
                    }
                    Ok(None) => {}
                    Err(err) => {
                        let _ = tx.send(Err(err.into())).await;
                        break 'stream End::StoreFailed;
                    }
                }
            }
            let wake = if hungry {
                self.store.next_run_at(&spec.queues).map(instant_at)
            } else {
                None
            };
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break 'stream End::Shutdown,
                () = tx.closed() => break 'stream End::WorkerGone,
                Some(notice) = notices.recv() => match notice {
                    Notice::Released(lease) => {
                        held.remove(&lease);
                    }
                    Notice::Revoked { job, lease, reason } => {
                        if held.remove(&lease).is_some() {
                            let revoked = pb::LeaseRevoked { job_id: job.to_string(), lease_id: lease.to_string(), reason: reason.to_owned() };
                            let event = pb::LeaseEvent { event: Some(Event::Revoked(revoked)) };
                            match self.send(&tx, event).await {
                                Sent::Ok => {}
                                Sent::WorkerGone => break 'stream End::WorkerGone,
                                Sent::Shutdown => break 'stream End::Shutdown,
                            }
                        }
                    }
                },
                changed = changes.changed(), if hungry => {
                    if changed.is_err() {
                        break 'stream End::Shutdown;
                    }
                }
                _ = draining.changed() => {}
                () = sleep_until_opt(wake), if wake.is_some() => {}
            }
        };
        {
            let mut reg = self.registry();
            reg.streams.remove(&id);
            for lease in held.keys() {
                reg.owners.remove(lease);
            }
        }
        match end {
            End::WorkerGone if !held.is_empty() => self.reclaim_orphans(held).await,
            End::WorkerGone => debug!("lease stream closed by the worker"),
            End::Shutdown => debug!(
                held = held.len(),
                "lease stream ended by shutdown; leases kept"
            ),
            End::StoreFailed => warn!(
                held = held.len(),
                "lease stream ended by a store failure; leases kept"
            ),
        }
    }

    /// Sends one event. A worker that stops reading blocks the send once
    /// the channel is full; shutdown must still end the stream (without
    /// reclaiming), so the wait also watches the shutdown token.
    async fn send(
        &self,
        tx: &mpsc::Sender<Result<pb::LeaseEvent, tonic::Status>>,
        event: pb::LeaseEvent,
    ) -> Sent {
        tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => Sent::Shutdown,
            sent = tx.send(Ok(event)) => if sent.is_ok() { Sent::Ok } else { Sent::WorkerGone },
        }
    }

    /// Reclaims the leases of a stream whose worker went away, after the
    /// disconnect grace, except those a heartbeat adopted meanwhile.
    async fn reclaim_orphans(&self, held: HashMap<LeaseId, JobId>) {
        let grace = self.config.disconnect_grace;
        let mut held: Vec<(LeaseId, JobId)> = held.into_iter().collect();
        if grace > Duration::ZERO {
            self.registry()
                .orphans
                .extend(held.iter().map(|(lease, _)| *lease));
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(grace) => {}
            }
            let mut reg = self.registry();
            held.retain(|(lease, _)| reg.orphans.remove(lease));
        }
        for (lease, job) in held {
            match self
                .store
                .reclaim(job, lease, Outcome::WorkerDisconnected, SystemTime::now())
                .await
            {
                Ok(after) => {
                    info!(job.id = %job, attempts = after.attempts, status = %after.status, "reclaimed: worker disconnected")
                }
                // Acked, failed or expired meanwhile: nothing to take back.
                Err(err) if err.code() != tonic::Code::Internal => {
                    debug!(job.id = %job, cause = %err, "nothing to reclaim")
                }
                Err(err) => {
                    warn!(job.id = %job, cause = %err, "reclaim after disconnect failed; the lease will expire")
                }
            }
        }
    }
}

/// How a send on a stream went.
enum Sent {
    Ok,
    WorkerGone,
    Shutdown,
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
