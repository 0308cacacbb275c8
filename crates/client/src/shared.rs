//! The state a [`Worker`](crate::Worker)'s stream loop, heartbeat task and
//! job tasks share: the in-flight book, the capacity's permits, the drain
//! flag and the current stream's token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::builder::Config;
use crate::inflight::InFlight;
use crate::JobContext;

/// State shared by the stream loop, the heartbeat task and the job tasks.
pub(crate) struct Shared {
    pub(crate) cfg: Config,
    /// Leases to heartbeat, and their handlers' cancel tokens.
    inflight: Mutex<InFlight>,
    /// `capacity` permits: one per running handler.
    pub(crate) slots: Arc<Semaphore>,
    /// Parent of every job's cancel token; fired at the drain deadline.
    hard_stop: CancellationToken,
    /// Set at shutdown; heartbeats then carry `draining`.
    pub(crate) draining: AtomicBool,
    /// Fired at shutdown, for handlers ([`JobContext::draining`]).
    drain: CancellationToken,
    /// The current Lease stream's token; heartbeats present it, so that
    /// `draining` applies to this worker's stream and no other.
    stream_token: Mutex<String>,
}

impl Shared {
    /// The state of a worker that has not opened a stream yet.
    pub(crate) fn new(cfg: Config) -> Shared {
        Shared {
            slots: Arc::new(Semaphore::new(cfg.capacity as usize)),
            inflight: Mutex::default(),
            hard_stop: CancellationToken::new(),
            draining: AtomicBool::new(false),
            drain: CancellationToken::new(),
            stream_token: Mutex::default(),
            cfg,
        }
    }

    /// The in-flight book. A poisoned lock is recovered: the book holds no
    /// invariant a panicking holder could have half-updated.
    pub(crate) fn book(&self) -> MutexGuard<'_, InFlight> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stream_token(&self) -> String {
        self.stream_token
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn forget(&self, ctx: &JobContext) {
        self.book().remove(ctx.id(), ctx.lease_id());
    }

    /// Stores the token of the stream just opened.
    pub(crate) fn set_stream_token(&self, token: String) {
        *self.stream_token.lock().unwrap_or_else(|p| p.into_inner()) = token;
    }

    /// A new job's cancel token: fired by a revoke, or by
    /// [`Shared::stop_handlers`].
    pub(crate) fn job_cancel_token(&self) -> CancellationToken {
        self.hard_stop.child_token()
    }

    /// Shutdown was asked for: heartbeats say so, handlers are told.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.drain.cancel();
    }

    /// A token fired when the worker starts draining.
    pub(crate) fn drain_token(&self) -> CancellationToken {
        self.drain.clone()
    }

    /// Whether the drain deadline passed ([`Shared::stop_handlers`]).
    pub(crate) fn stopping(&self) -> bool {
        self.hard_stop.is_cancelled()
    }

    /// Cancels every running handler (the drain deadline passed).
    pub(crate) fn stop_handlers(&self) {
        self.hard_stop.cancel();
    }
}
