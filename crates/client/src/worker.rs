//! [`Worker`]: holds a Lease stream, runs handlers, reconnects, drains.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use jobq::pb::{self, lease_event::Event};
use tokio::task::{JoinError, JoinSet};
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::backoff::Backoff;
use crate::builder::{WorkerBuilder, WorkerTarget};
use crate::shared::Shared;
use crate::{heartbeat, job, JobContext, Result};

/// After the drain empties, how long to keep reading the stream for a job the
/// server pushed just before it saw the drain flag (which would otherwise be
/// reclaimed, costing an attempt, when the stream closes).
const DRAIN_SETTLE: Duration = Duration::from_millis(100);
/// How long a Lease stream must stay open to count as the end of an
/// outage for `give_up_after`, though it delivered nothing.
const STREAM_SETTLED: Duration = Duration::from_secs(5);

/// How long, beyond their `cancel_grace`, cancelled handlers' tasks get to
/// end after the drain deadline before they are aborted: time for a
/// give-back (at most 2 s) to get its answer.
const ABORT_GRACE: Duration = Duration::from_secs(3);

type LeaseStream = tonic::Streaming<pb::LeaseEvent>;

/// Runs job handlers for jobs leased from a jobq server.
///
/// ```no_run
/// use std::time::Duration;
/// use jobq_client::{HandlerError, JobContext, Worker};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn demo() -> jobq_client::Result<()> {
/// let shutdown = CancellationToken::new();
/// Worker::builder("http://127.0.0.1:50051")
///     .queues(["emails"])
///     .capacity(4)
///     .lease(Duration::from_secs(30))
///     .shutdown(shutdown.clone())
///     .handler("send-email", |ctx: JobContext| async move {
///         let email: serde_json::Value = ctx.json()?;
///         println!("sending {email} for {:?}", ctx.key());
///         Ok::<(), HandlerError>(())
///     })
///     .build()
///     .run()
///     .await
/// # }
/// ```
///
/// What it does, in order of a job's life:
/// - holds one `Lease` stream of `capacity`, reopening it with jittered
///   exponential backoff (100 ms doubling to 5 s) when it ends or fails;
///   in-flight handlers keep running meanwhile and still ack over unary
///   calls, since their leases may have survived (a server restart keeps
///   them);
/// - runs each leased job's handler as its own task, at most `capacity` at
///   a time, in a tracing span `job` with `job.id`, `job.kind`,
///   `job.attempt`, `job.queue`;
/// - heartbeats all in-flight leases in one call per tick; a lease reported
///   lost, or revoked on the stream, cancels its handler (which keeps
///   running for `cancel_grace`, then is dropped) and is neither acked nor
///   failed;
/// - acks on `Ok`, fails on `Err` (with the [`HandlerError`](crate::HandlerError)'s
///   retry delay or fatal flag) and on panic (`handler panicked: ...`);
///   ABORTED replies (the lease was lost meanwhile) are logged, not retried;
/// - on shutdown, tells the server it is draining (no more jobs), lets
///   in-flight handlers finish for up to `drain_timeout` and settles them,
///   cancels the rest (each gets `cancel_grace`, then its job is given back
///   without spending an attempt), closes the stream and
///   returns.
pub struct Worker {
    builder: WorkerBuilder,
    worker_id: Arc<str>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("builder", &self.builder)
            .finish()
    }
}

impl Worker {
    /// Starts building a worker on a [`Client`](crate::Client) or a server URL.
    pub fn builder(target: impl Into<WorkerTarget>) -> WorkerBuilder {
        WorkerBuilder::new(target.into())
    }

    pub(crate) fn from_builder(mut builder: WorkerBuilder) -> Self {
        let worker_id = builder.resolved_worker_id();
        Self { builder, worker_id }
    }

    /// The id this worker leases under (generated if none was set).
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Runs until the shutdown token is cancelled and the drain is over.
    /// Server outages are retried for ever, not returned, unless
    /// [`give_up_after`](crate::WorkerBuilder::give_up_after) is set: then
    /// [`Error::Unreachable`](crate::Error::Unreachable) after the running
    /// jobs are drained.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for unusable options,
    /// [`Error::Connect`](crate::Error::Connect) for a malformed URL, and
    /// [`Error::Status`](crate::Error::Status) when the server refuses the
    /// first Lease stream for good (`UNAUTHENTICATED`, `PERMISSION_DENIED`,
    /// `INVALID_ARGUMENT`, `UNIMPLEMENTED`: a bad token, a token without the
    /// `consume` role, a capacity or lease outside the server's limits), all
    /// before any job is taken. Once a stream has opened, every error is
    /// retried: a token reload or a rolling restart may fix it.
    pub async fn run(self) -> Result<()> {
        let cfg = self.builder.into_config()?;
        let shared = Arc::new(Shared::new(cfg));
        let span = info_span!(
            "worker",
            worker.id = %shared.cfg.worker_id,
            server = shared.cfg.server.as_deref(),
        );
        // Aborted however `run` ends (returns, is dropped, panics): a
        // watcher left behind would exit the process on a later signal.
        let _signals = shared
            .cfg
            .handle_signals
            .then(|| AbortOnDrop(crate::signals::watch(shared.cfg.shutdown.clone())));
        async move {
            let stop_heartbeats = CancellationToken::new();
            // Aborted if `run` is dropped or panics: left running, it would
            // keep the leases of aborted jobs alive with nothing running them.
            let mut heartbeats = AbortOnDrop(tokio::spawn(
                heartbeat::run(Arc::clone(&shared), stop_heartbeats.clone()).in_current_span(),
            ));
            let mut tasks = JoinSet::new();
            // Given up (`give_up_after`): the jobs still running are
            // drained as at shutdown, then the error is returned.
            let (stream, gave_up) = match serve(&shared, &mut tasks).await {
                Ok(stream) => (stream, None),
                Err(err @ crate::Error::Unreachable { .. }) => (None, Some(err)),
                Err(err) => return Err(err),
            };
            drain(&shared, stream, &mut tasks).await;
            stop_heartbeats.cancel();
            if let Err(err) = (&mut heartbeats.0).await {
                error!(cause = %err, "heartbeat task failed");
            }
            info!("worker stopped");
            gave_up.map_or(Ok(()), Err)
        }
        .instrument(span)
        .await
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Takes jobs until shutdown; returns the open stream, if any, so the drain
/// can keep it (closing it would make the server reclaim in-flight jobs).
/// Fails when the very first stream is refused for good, or with
/// [`Error::Unreachable`](crate::Error::Unreachable) after `give_up_after`
/// without a stream.
async fn serve(shared: &Arc<Shared>, tasks: &mut JoinSet<()>) -> Result<Option<LeaseStream>> {
    let shutdown = shared.cfg.shutdown.clone();
    let mut backoff = Backoff::default();
    let mut stream: Option<LeaseStream> = None;
    let mut ever_opened = false;
    let mut down = Down::default();
    // When the current stream opened: one that stayed up a while ended an
    // outage even if it delivered nothing (an idle queue).
    let mut opened_at = Instant::now();
    loop {
        if stream.is_none() {
            let opened = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(None),
                opened = open(shared) => opened,
            };
            match opened {
                Err(err) if !ever_opened && refused_for_good(&err) => {
                    error!(cause = %err, "the server refused the lease stream");
                    return Err(err);
                }
                Ok(s) => {
                    ever_opened = true;
                    opened_at = Instant::now();
                    // The backoff resets only on the first event (below): a
                    // stream that opens and fails at once must not be
                    // retried in a tight loop.
                    info!(in_flight = shared.book().len(), "lease stream open");
                    if let Some(hook) = &shared.cfg.on_ready {
                        hook();
                    }
                    stream = Some(s);
                }
                Err(err) => {
                    down.failed(shared, &err)?;
                    let delay = backoff.next_delay();
                    warn!(cause = %err, retry_in = ?delay, "could not open lease stream");
                    if !pause(delay, &shutdown, tasks).await {
                        return Ok(None);
                    }
                }
            }
            continue;
        }
        let step = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(stream),
            msg = next_event(&mut stream) => Some(msg),
            Some(joined) = tasks.join_next() => {
                log_join(joined);
                None
            }
        };
        let (ended, err) = match step {
            None => continue,
            Some(Ok(Some(event))) => {
                // Like the backoff, only a stream that delivers something
                // ends an outage: one that opens and fails at once does not.
                backoff.reset();
                down.clear();
                on_event(shared, event, tasks);
                continue;
            }
            Some(Ok(None)) => (
                "lease stream ended by the server".to_owned(),
                crate::Error::Status(tonic::Status::unavailable(
                    "lease stream ended by the server",
                )),
            ),
            Some(Err(status)) => (
                format!(
                    "lease stream failed: {:?}: {}",
                    status.code(),
                    status.message()
                ),
                crate::Error::Status(status),
            ),
        };
        stream = None;
        if opened_at.elapsed() >= STREAM_SETTLED {
            down.clear();
        }
        down.failed(shared, &err)?;
        // Ask the server now rather than at the next tick whether the jobs
        // still running here were reclaimed with the stream (then their
        // handlers stop before another worker runs them for long), or keep
        // them within its --disconnect-grace.
        if shared.book().len() > 0 {
            let shared = Arc::clone(shared);
            tokio::spawn(async move { heartbeat::beat(&shared).await }.in_current_span());
        }
        let delay = backoff.next_delay();
        warn!(in_flight = shared.book().len(), retry_in = ?delay, "{ended}; reconnecting");
        if !pause(delay, &shutdown, tasks).await {
            return Ok(None);
        }
    }
}

/// Since when the worker has been without a Lease stream, for
/// `give_up_after` and `on_connection_error`.
#[derive(Default)]
struct Down {
    since: Option<Instant>,
}

impl Down {
    fn clear(&mut self) {
        self.since = None;
    }

    /// Records a failure: tells the hook, and gives up once the worker has
    /// been without a stream for `give_up_after`.
    fn failed(&mut self, shared: &Shared, err: &crate::Error) -> Result<()> {
        let since = *self.since.get_or_insert_with(Instant::now);
        let down_for = since.elapsed();
        if let Some(hook) = &shared.cfg.on_connection_error {
            hook(err, down_for);
        }
        match shared.cfg.give_up_after {
            Some(after) if down_for >= after => {
                error!(cause = %err, ?down_for, "no lease stream for too long; giving up");
                Err(crate::Error::Unreachable {
                    down_for,
                    last: err.to_string(),
                })
            }
            _ => Ok(()),
        }
    }
}

/// A deadline no drain reaches (about thirty years away).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(30 * 365 * 24 * 3600)
}

/// Errors that retrying the same Lease call cannot fix.
fn refused_for_good(err: &crate::Error) -> bool {
    matches!(
        err.code(),
        Some(
            tonic::Code::Unauthenticated
                | tonic::Code::PermissionDenied
                | tonic::Code::InvalidArgument
                | tonic::Code::Unimplemented
        )
    )
}

/// Stops taking jobs and lets in-flight ones finish, up to the deadline.
async fn drain(shared: &Arc<Shared>, mut stream: Option<LeaseStream>, tasks: &mut JoinSet<()>) {
    shared.start_draining();
    info!(in_flight = tasks.len(), "shutting down; draining");
    // Tell the server now rather than at the next tick; the stream stays open
    // so the jobs it holds are not reclaimed while they finish.
    if stream.is_some() || !tasks.is_empty() {
        heartbeat::beat(shared).await;
    }
    // Saturates: `Duration::MAX` means "wait for every handler".
    let deadline = Instant::now()
        .checked_add(shared.cfg.drain_timeout)
        .unwrap_or_else(far_future);
    loop {
        if tasks.is_empty() {
            let Some(s) = stream.as_mut() else { break };
            match timeout(DRAIN_SETTLE, s.message()).await {
                Ok(Ok(Some(event))) => on_event(shared, event, tasks),
                _ => break,
            }
            continue;
        }
        tokio::select! {
            biased;
            _ = sleep_until(deadline) => break,
            Some(joined) = tasks.join_next() => log_join(joined),
            msg = next_event(&mut stream) => match msg {
                Ok(Some(event)) => on_event(shared, event, tasks),
                // No reconnect while draining: in-flight jobs settle over
                // unary calls.
                Ok(None) | Err(_) => stream = None,
            },
        }
    }
    if !tasks.is_empty() {
        warn!(
            in_flight = tasks.len(),
            "drain deadline passed; cancelling handlers, then giving their jobs back"
        );
        shared.stop_handlers();
        let _ = timeout(shared.cfg.cancel_grace.saturating_add(ABORT_GRACE), async {
            while let Some(joined) = tasks.join_next().await {
                log_join(joined);
            }
        })
        .await;
        tasks.shutdown().await;
    }
    drop(stream);
}

/// Opens a stream, declaring the leases still in flight (after a reconnect
/// or a server restart) so they count against the capacity.
async fn open(shared: &Shared) -> Result<LeaseStream> {
    let cfg = &shared.cfg;
    let held = shared.book().snapshot();
    let (stream, token) = cfg
        .client
        .lease_with_token(
            cfg.queues.iter().cloned(),
            cfg.worker_id.to_string(),
            cfg.capacity,
            Some(cfg.lease),
            held,
        )
        .await?;
    shared.set_stream_token(token);
    Ok(stream)
}

/// The next stream event; pending forever when there is no stream, so a
/// `select!` arm on it simply never fires.
async fn next_event(
    stream: &mut Option<LeaseStream>,
) -> std::result::Result<Option<pb::LeaseEvent>, tonic::Status> {
    match stream {
        Some(s) => s.message().await,
        None => std::future::pending().await,
    }
}

/// Sleeps `delay` while still reaping finished job tasks; `false` when
/// shutdown came first.
async fn pause(delay: Duration, shutdown: &CancellationToken, tasks: &mut JoinSet<()>) -> bool {
    let wake = sleep(delay);
    tokio::pin!(wake);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return false,
            _ = &mut wake => return true,
            Some(joined) = tasks.join_next() => log_join(joined),
        }
    }
}

fn on_event(shared: &Arc<Shared>, event: pb::LeaseEvent, tasks: &mut JoinSet<()>) {
    match event.event {
        Some(Event::Leased(leased)) => start(shared, leased, tasks),
        Some(Event::Revoked(revoked)) => {
            match shared.book().revoke(&revoked.job_id, &revoked.lease_id) {
                Some(token) => {
                    warn!(job.id = %revoked.job_id, reason = %revoked.reason, "lease revoked; cancelling its handler");
                    shared.cfg.metrics.lease_lost(crate::metrics::Lost::Revoked);
                    token.cancel();
                }
                None => debug!(job.id = %revoked.job_id, "revoked a lease not in flight"),
            }
        }
        None => debug!("lease event without a payload"),
    }
}

/// Books a leased job and spawns its task.
fn start(shared: &Arc<Shared>, leased: pb::LeasedJob, tasks: &mut JoinSet<()>) {
    let Some(job) = leased.job else {
        error!(lease.id = %leased.lease_id, "leased event without a job; ignoring");
        return;
    };
    // On this machine's clock, as heartbeats extend it: the lease's length
    // from the server's two timestamps (both on its clock), counted from
    // now. The server's expiry itself would be off by any clock skew.
    let granted = leased
        .lease_expires_at
        .zip(job.taken_at)
        .and_then(|(expires, taken)| {
            let expires = SystemTime::try_from(expires).ok()?;
            expires
                .duration_since(SystemTime::try_from(taken).ok()?)
                .ok()
        })
        .unwrap_or(shared.cfg.lease);
    let expires = SystemTime::now()
        .checked_add(granted)
        .unwrap_or_else(|| SystemTime::now() + shared.cfg.lease);
    let deadline = Arc::new(Mutex::new(expires));
    let unsent = Arc::new(Mutex::new(None));
    let cancel = shared.job_cancel_token();
    let stale = shared.book().insert(
        job.id.clone(),
        leased.lease_id.clone(),
        cancel.clone(),
        Arc::clone(&deadline),
        Arc::clone(&unsent),
    );
    if let Some(stale) = stale {
        warn!(job.id = %job.id, "job leased again; cancelling the run under its old lease");
        stale.cancel();
    }
    let ctx = JobContext::new(
        job,
        leased.lease_id,
        Arc::clone(&shared.cfg.worker_id),
        (deadline, unsent),
        cancel,
        shared.drain_token(),
    );
    let span = info_span!(
        "job",
        job.id = %ctx.id(),
        job.kind = %ctx.kind(),
        job.attempt = ctx.attempt(),
        job.queue = %ctx.queue(),
        trace_id = tracing::field::Empty,
    );
    // Logs name the producer's trace; the handler's span continues it.
    if let Some(trace) = crate::trace::trace_id(&ctx.job().metadata) {
        span.record("trace_id", trace);
    }
    crate::trace::continue_trace(&span, &ctx.job().metadata);
    tasks.spawn(job::run(Arc::clone(shared), ctx).instrument(span));
}

fn log_join(joined: std::result::Result<(), JoinError>) {
    if let Err(err) = joined {
        if err.is_panic() {
            // Handler panics are caught inside the task; this is our own bug.
            error!(cause = %err, "job task panicked");
        }
    }
}
