//! The reaper: reclaims expired leases on time and purges old jobs.
//!
//! It sleeps until the nearest lease deadline (re-armed when a sooner one
//! appears), never on a fixed scan interval, so a 100 ms lease is reclaimed
//! about 100 ms after it was taken however many leases are out.

use std::{sync::Arc, time::Duration, time::SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{config::Config, job::Outcome, leases::LeaseHub, store::Store, waiter::instant_at};

/// How often old DONE and FAILED jobs are purged. Retention is measured in
/// days, so a coarse interval is precise enough.
const PURGE_EVERY: Duration = Duration::from_secs(600);

/// After a store error, wait this long before trying again.
const ERROR_BACKOFF: Duration = Duration::from_millis(500);

/// Runs until `shutdown` fires.
pub async fn run<S: Store>(
    store: Arc<S>,
    hub: Arc<LeaseHub<S>>,
    config: Arc<Config>,
    shutdown: CancellationToken,
) {
    let mut lease_changes = store.lease_changes();
    let mut next_purge = tokio::time::Instant::now();
    loop {
        lease_changes.borrow_and_update();
        let now = SystemTime::now();
        match store.reclaim_expired(now).await {
            Ok(reclaimed) => {
                for (job, lease) in reclaimed {
                    info!(job.id = %job.id, attempts = job.attempts, status = %job.status, "reclaimed: lease expired");
                    hub.revoked(job.id, lease, Outcome::LeaseExpired.reason());
                }
            }
            Err(err) => {
                warn!(cause = %err, "reclaiming expired leases failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    () = tokio::time::sleep(ERROR_BACKOFF) => continue,
                }
            }
        }
        if tokio::time::Instant::now() >= next_purge {
            purge(&*store, &config, now).await;
            next_purge = tokio::time::Instant::now() + PURGE_EVERY;
        }
        let wake = store
            .next_lease_expiry()
            .map_or(next_purge, |t| instant_at(t).min(next_purge));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = lease_changes.changed() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

async fn purge<S: Store>(store: &S, config: &Config, now: SystemTime) {
    let before = |keep: Duration| now.checked_sub(keep).unwrap_or(SystemTime::UNIX_EPOCH);
    match store
        .purge(before(config.retain_done), before(config.retain_failed))
        .await
    {
        Ok(0) => {}
        Ok(n) => info!(purged = n, "purged old DONE/FAILED jobs"),
        Err(err) => warn!(cause = %err, "purge failed; will retry"),
    }
}
