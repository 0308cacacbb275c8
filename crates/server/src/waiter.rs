//! Waiting for a due job without polling: a long-polling Dequeue sleeps
//! until the store says something changed, or until the earliest delayed
//! job of its queues becomes due, whichever comes first.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::retake_at,
    error::{Error, Result},
    job::Leased,
    store::Store,
    validate::TakeSpec,
};

/// Takes a due job for `spec`, waiting up to `wait` for one to become due.
/// `Ok(None)` when the wait runs out.
///
/// # Errors
/// [`Error::ShuttingDown`] when `shutdown` fires while waiting; store errors.
pub async fn take_waiting<S: Store>(
    store: &S,
    spec: &TakeSpec,
    wait: Duration,
    shutdown: &CancellationToken,
) -> Result<Option<Leased>> {
    let deadline = Instant::now() + wait;
    let mut changes = store.changes();
    loop {
        // Mark the current version seen *before* looking, so a change that
        // lands between the look and the sleep still wakes us.
        changes.borrow_and_update();
        let seen = store.due_version(&spec.queues);
        if let Some(leased) = store
            .take(
                &spec.queues,
                &spec.worker_id,
                spec.owner.as_deref(),
                spec.lease,
                SystemTime::now(),
            )
            .await?
        {
            return Ok(Some(leased));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        let wake = store
            .next_run_at(&spec.queues)
            .await?
            .map_or(deadline, |t| retake_at(t).min(deadline));
        // A change to other queues wakes us too, but leaves our queues'
        // version as it was: nothing new to look for, so wait on.
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Err(Error::ShuttingDown),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Err(Error::ShuttingDown);
                    }
                    if store.due_version(&spec.queues) == seen {
                        continue;
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
            break;
        }
    }
}
