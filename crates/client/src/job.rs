//! One leased job's life inside the worker: wait for a slot, run the
//! handler (catching panics), then ack or fail it, unless the lease was lost.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures::FutureExt;
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::handler::{panic_message, BoxedHandler, HandlerResult};
use crate::metrics::{Lost, Outcome};
use crate::shared::Shared;
use crate::{HandlerError, JobContext};

/// How long one ack or fail may wait for its answer before it is tried
/// again.
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs `ctx`'s job to the end and takes it out of the in-flight book.
/// Runs inside the job's tracing span.
pub(crate) async fn run(shared: Arc<Shared>, ctx: JobContext) {
    let handler = shared
        .cfg
        .handlers
        .get(ctx.kind())
        .or(shared.cfg.fallback.as_ref());
    let outcome = match handler.cloned() {
        // Not fatal: another worker of the same queue may have the handler
        // (e.g. during a rolling deploy), and attempts still bound the retries.
        None => Some(Err(HandlerError::retry(format!(
            "no handler for kind {:?}",
            ctx.kind()
        )))),
        Some(handler) => execute(&shared, handler, &ctx).await,
    };
    match outcome {
        Some(outcome) => settle(&shared, &ctx, outcome).await,
        None if shared.stopping() => give_back(&shared, &ctx).await,
        None => shared
            .cfg
            .metrics
            .job(label(&shared, &ctx), Outcome::Abandoned),
    }
    shared.forget(&ctx);
}

/// How long a give-back at the drain deadline may wait for its answer.
const GIVE_BACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The drain deadline cut the handler off: puts the job back at once (a
/// snooze of zero), so it is due for another worker without spending an
/// attempt. One try: if it does not get through, the server reclaims the
/// job when the stream closes (which does spend one).
async fn give_back(shared: &Shared, ctx: &JobContext) {
    let call = shared.cfg.client.fail(
        ctx.id(),
        ctx.lease_id(),
        "given back: the worker's drain deadline passed",
        crate::FailOptions::snooze(std::time::Duration::ZERO),
    );
    let outcome = match tokio::time::timeout(GIVE_BACK_TIMEOUT, call).await {
        Ok(Ok(_)) => {
            info!("given back at the drain deadline; no attempt spent");
            Outcome::GivenBack
        }
        Ok(Err(err)) => {
            warn!(cause = %err, "could not give the job back; the server will reclaim it");
            Outcome::Abandoned
        }
        Err(_) => {
            warn!("no answer to the give-back; the server will reclaim the job");
            Outcome::Abandoned
        }
    };
    shared.cfg.metrics.job(label(shared, ctx), outcome);
}

/// The `kind` label: a kind with its own handler, else `other`.
fn label<'a>(shared: &Shared, ctx: &'a JobContext) -> &'a str {
    if shared.cfg.handlers.contains_key(ctx.kind()) {
        ctx.kind()
    } else {
        "other"
    }
}

/// Runs the handler in one of the worker's `capacity` slots. `None` when the
/// job was cancelled (lease lost, drain deadline) before it finished: the
/// handler's future is dropped and the job must not be acked or failed.
async fn execute(
    shared: &Shared,
    handler: BoxedHandler,
    ctx: &JobContext,
) -> Option<HandlerResult> {
    // Jobs can outnumber slots briefly after a reconnect (the new stream does
    // not know about the old one's jobs); the extras wait here, heartbeated.
    let _slot = tokio::select! {
        biased;
        _ = ctx.cancelled() => {
            warn!("lease lost before the handler started; not acking");
            return None;
        }
        slot = Arc::clone(&shared.slots).acquire_owned() => slot.ok()?,
    };
    let started = Instant::now();
    debug!("handler started");
    let mut run = AssertUnwindSafe(handler(ctx.clone())).catch_unwind();
    let result = tokio::select! {
        biased;
        _ = ctx.cancelled() => {
            let result = wind_down(shared, &mut run).await;
            // At the drain deadline the lease is still this worker's: a
            // handler that stopped within its grace has its result
            // reported (an ack, a fail, a snooze); one that did not is
            // given back. A lost or revoked lease reports nothing.
            match result {
                Some(result) if shared.stopping() => result,
                _ => {
                    warn!("handler cancelled: lease lost, job cancelled or drain deadline passed; not acking");
                    return None;
                }
            }
        }
        () = lease_ran_out(ctx) => {
            // Heartbeats could not reach the server (partition, server
            // down): past the deadline the server may have handed the job
            // to someone else, so stop at once (no grace) rather than run
            // it twice at once.
            warn!("lease deadline passed without a successful heartbeat; cancelling the handler");
            shared.cfg.metrics.lease_lost(Lost::Deadline);
            ctx.cancellation_token().cancel();
            return None;
        }
        result = &mut run => result,
    };
    shared
        .cfg
        .metrics
        .handler_ran(label(shared, ctx), started.elapsed());
    let elapsed_ms = started.elapsed().as_millis() as u64;
    Some(match result {
        Ok(Ok(())) => {
            debug!(elapsed_ms, "handler succeeded");
            Ok(())
        }
        Ok(Err(err)) => {
            debug!(elapsed_ms, error = %err, "handler failed");
            Err(err)
        }
        Err(payload) => {
            let message = panic_message(&*payload);
            error!(elapsed_ms, panic = %message, "handler panicked");
            Err(HandlerError::retry(format!("handler panicked: {message}")))
        }
    })
}

/// Lets a cancelled handler run for the worker's `cancel_grace`, so that
/// one that watches [`JobContext::cancelled`] can stop cleanly; then drops
/// it. Returns what it returned within the grace, if it did.
async fn wind_down<F: std::future::Future>(shared: &Shared, run: F) -> Option<F::Output> {
    let grace = shared.cfg.cancel_grace;
    if grace.is_zero() {
        return None;
    }
    match tokio::time::timeout(grace, run).await {
        Ok(result) => {
            debug!("cancelled handler stopped within its grace");
            Some(result)
        }
        Err(_) => {
            warn!(
                ?grace,
                "cancelled handler still running after its grace; dropping it"
            );
            None
        }
    }
}

/// Acks (`Ok`) or fails (`Err`) the job. Transient errors (server down or
/// restarting) are retried with backoff, whatever the lease's deadline says:
/// the server keeps persisted leases across a restart and gives them a
/// grace, the job stays in the book (heartbeated, declared in `held` on a
/// reconnect), and a lease that was lost meanwhile is refused (ABORTED),
/// which is final. Retries stop when the worker stops hard.
async fn settle(shared: &Shared, ctx: &JobContext, mut outcome: HandlerResult) {
    let client = &shared.cfg.client;
    let mut backoff = Backoff::default();
    let mut first = true;
    // The handler's retry delay, until the server refuses it (over its
    // --max-delay): the fail is then sent again with the server's backoff,
    // rather than dropped and left to the lease's expiry.
    let mut options = outcome.as_ref().err().map(HandlerError::fail_options);
    loop {
        // The first call always goes out, even if the drain deadline has
        // fired meanwhile: the handler finished, and a stale lease is
        // refused by the server (ABORTED) anyway. Retries stop once the
        // lease is lost or the worker is stopping hard.
        if !first && ctx.is_cancelled() {
            warn!("lease lost or worker stopping before ack/fail; leaving the job to the server");
            shared
                .cfg
                .metrics
                .job(label(shared, ctx), Outcome::Abandoned);
            return;
        }
        let retry = !first;
        first = false;
        shared.book().settling(ctx.id(), ctx.lease_id());
        let call = async {
            match &outcome {
                Ok(()) => client
                    .ack_with_result(ctx.id(), ctx.lease_id(), ctx.result())
                    .await
                    .map(drop),
                Err(err) => client
                    .fail(
                        ctx.id(),
                        ctx.lease_id(),
                        err.message(),
                        options.unwrap_or_else(|| err.fail_options()),
                    )
                    .await
                    .map(drop),
            }
        };
        // A server that answers pings but not this call (a stuck store)
        // must not hold the job here for good: the try is abandoned and,
        // like any transient failure, made again.
        let result = match tokio::time::timeout(SETTLE_TIMEOUT, call).await {
            Ok(result) => result,
            Err(_) => Err(crate::Error::Status(tonic::Status::deadline_exceeded(
                format!("no answer to the ack/fail within {SETTLE_TIMEOUT:?}"),
            ))),
        };
        if result.is_ok() {
            // Out of the book at once: a heartbeat that crossed the ack
            // must not count this lease as lost.
            shared.forget(ctx);
        }
        match (result, &outcome) {
            (Ok(()), Ok(())) => {
                info!("acked");
                shared.cfg.metrics.job(label(shared, ctx), Outcome::Acked);
                return;
            }
            (Ok(()), Err(err)) => {
                warn!(error = %err, fatal = err.is_fatal(), "failed");
                let outcome = if err.is_fatal() {
                    Outcome::Fatal
                } else if options.as_ref().is_some_and(|o| o.snooze.is_some()) {
                    Outcome::Snoozed
                } else {
                    Outcome::Failed
                };
                shared.cfg.metrics.job(label(shared, ctx), outcome);
                return;
            }
            // A retried ack whose first try was applied (its reply lost):
            // the job is DONE under this very lease.
            (Err(err), Ok(())) if retry && err.code() == Some(tonic::Code::FailedPrecondition) => {
                shared.forget(ctx);
                info!("acked (an earlier try had reached the server)");
                shared.cfg.metrics.job(label(shared, ctx), Outcome::Acked);
                return;
            }
            // The result is over the server's --max-result-bytes: no retry
            // makes it smaller, so the job fails for good, saying why.
            (Err(err), Ok(())) if err.code() == Some(tonic::Code::InvalidArgument) => {
                warn!(cause = %err, "the server refused the job's result; failing the job");
                let refused = HandlerError::fatal(format!("the server refused the result: {err}"));
                options = Some(refused.fail_options());
                outcome = Err(refused);
            }
            (Err(err), Err(_))
                if err.code() == Some(tonic::Code::InvalidArgument)
                    && options
                        .as_ref()
                        .is_some_and(|o| o.retry_delay.is_some() || o.snooze.is_some()) =>
            {
                // Over the server's --max-delay: a retry with its backoff
                // (for a snooze, that spends the attempt) rather than a job
                // left to expire.
                warn!(cause = %err, "the server refused the retry delay or snooze; failing with its backoff instead");
                if let Some(options) = options.as_mut() {
                    options.retry_delay = None;
                    options.snooze = None;
                }
            }
            (Err(err), _) if err.code() == Some(tonic::Code::Aborted) => {
                warn!(cause = %err, "lease no longer held; ack/fail rejected, not retried");
                shared
                    .cfg
                    .metrics
                    .job(label(shared, ctx), Outcome::Rejected);
                shared.cfg.metrics.lease_lost(Lost::Aborted);
                return;
            }
            (Err(err), _) if err.is_transient() => {
                let delay = backoff.next_delay();
                warn!(cause = %err, retry_in = ?delay, "ack/fail did not reach the server; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = ctx.cancelled() => {}
                }
            }
            (Err(err), _) => {
                error!(cause = %err, "could not ack/fail; the server will reclaim the job");
                shared
                    .cfg
                    .metrics
                    .job(label(shared, ctx), Outcome::Rejected);
                return;
            }
        }
    }
}

/// Resolves once the job's lease deadline (moved forward by every
/// successful heartbeat) is in the past.
async fn lease_ran_out(ctx: &JobContext) {
    loop {
        let left = ctx
            .lease_expires_at()
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left).await;
    }
}
