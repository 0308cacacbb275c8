//! The heartbeat task: one batched `Heartbeat` call per tick (one per
//! [`jobq::MAX_HEARTBEAT_LEASES`] leases) for every in-flight lease,
//! cancelling the handlers of leases the server says are lost.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::{interval_at, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::metrics::Lost;
use crate::shared::Shared;

/// Heartbeats every `heartbeat_every` until `stop` fires. Runs beside the
/// Lease stream, not on it, so leases stay extended while the stream is
/// reconnecting and while the worker drains.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let every = shared.cfg.heartbeat_every;
    let mut ticks = interval_at(Instant::now() + every, every);
    // A slow heartbeat must not be followed by a burst of catch-up calls.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => beat(&shared).await,
        }
    }
}

/// One heartbeat. Sent even with no leases while draining, because that call
/// is what tells the server to push nothing more to this worker's stream,
/// and while a stream is open, because it says the worker is alive.
pub(crate) async fn beat(shared: &Shared) {
    let all = shared.book().snapshot();
    let draining = shared.draining.load(Ordering::SeqCst);
    // Sent even with no leases while a stream is open: after a lease expired
    // unheartbeated (a frozen process), the server pushes that stream
    // nothing until its worker heartbeats again.
    if all.is_empty() && !draining && shared.stream_token().is_empty() {
        return;
    }
    if all.is_empty() {
        return beat_some(shared, Vec::new(), draining).await;
    }
    // The server's per-call limit, shared through the contract crate and
    // independent of any capacity: a worker can briefly hold more leases
    // than its capacity after a reconnect.
    for chunk in all.chunks(jobq::MAX_HEARTBEAT_LEASES) {
        beat_some(shared, chunk.to_vec(), draining).await;
    }
}

async fn beat_some(shared: &Shared, sent: Vec<jobq::pb::LeaseRef>, draining: bool) {
    let cfg = &shared.cfg;
    let sent_at = SystemTime::now();
    let call = cfg.client.heartbeat_with(
        cfg.worker_id.to_string(),
        sent.clone(),
        Some(cfg.lease),
        draining,
        shared.stream_token(),
    );
    // Bounded by the tick, so a black-holed server cannot stall the task.
    match tokio::time::timeout(cfg.heartbeat_every, call).await {
        Ok(Ok(lost)) => {
            let cancelled = shared
                .book()
                .apply_heartbeat(&sent, &lost, sent_at + cfg.lease);
            for (r, token) in cancelled {
                warn!(job.id = %r.job_id, lease.id = %r.lease_id, "lease lost; cancelling its handler");
                cfg.metrics.lease_lost(Lost::Heartbeat);
                token.cancel();
            }
            debug!(
                leases = sent.len(),
                lost = lost.len(),
                draining,
                "heartbeat"
            );
        }
        // The leases may well still be valid (the server is restarting, or a
        // packet was lost): keep the handlers running and try next tick.
        Ok(Err(err)) => warn!(cause = %err, leases = sent.len(), "heartbeat failed"),
        Err(_) => warn!(leases = sent.len(), "heartbeat timed out"),
    }
}
