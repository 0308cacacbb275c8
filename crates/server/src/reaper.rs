//! The reaper: reclaims expired leases on time and purges old jobs.
//!
//! It sleeps until the nearest lease deadline (re-armed when a sooner one
//! appears), never on a fixed scan interval, so a 100 ms lease is reclaimed
//! about 100 ms after it was taken however many leases are out.

use std::{sync::Arc, time::Duration, time::SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{clock::instant_at, config::Config, leases::LeaseHub, store::Store};

/// How often old DONE and FAILED jobs are purged. Retention is measured in
/// days, so a coarse interval is precise enough.
const PURGE_EVERY: Duration = Duration::from_secs(600);

/// After a store error, wait this long before trying again.
const ERROR_BACKOFF: Duration = Duration::from_millis(500);

/// How long the reaper waits before it looks again at an expired lease it
/// could not reclaim twice in a row (its row held by another transaction).
const MISSED_PAUSE: Duration = Duration::from_millis(100);

/// Runs until `shutdown` fires; with a shared store, this server keeps
/// heartbeating until `left` fires (once it has left the registry: a
/// shutdown that waits for its streams must not look like a death, or the
/// others would reclaim the leases it keeps for its workers). Purging runs
/// in a task of its own, so a long scan of a large database never delays a
/// lease reclaim.
pub async fn run<S: Store>(
    store: Arc<S>,
    hub: Arc<LeaseHub<S>>,
    config: Arc<Config>,
    shutdown: CancellationToken,
    left: CancellationToken,
) {
    let cluster = store.shared().then(|| {
        tokio::spawn(cluster_loop(
            Arc::clone(&store),
            config.server_timeout,
            shutdown.clone(),
            left,
        ))
    });
    let purger = tokio::spawn(purge_loop(Arc::clone(&store), config, shutdown.clone()));
    reclaim_loop(&*store, &hub, &shutdown).await;
    let _ = purger.await;
    if let Some(cluster) = cluster {
        let _ = cluster.await;
    }
}

/// Reclaims expired leases on time, sleeping until the nearest deadline
/// and re-arming when a sooner one appears.
async fn reclaim_loop<S: Store>(store: &S, hub: &LeaseHub<S>, shutdown: &CancellationToken) {
    let mut lease_changes = store.lease_changes();
    let mut missed_before = false;
    loop {
        lease_changes.borrow_and_update();
        // The streams that held the leases hear of it from the store's
        // lease-ended events; a job its stream never sent is given back.
        let undelivered = |lease| hub.undelivered(lease);
        let none = match store.reclaim_expired(store.now(), &undelivered).await {
            Ok(reclaimed) => {
                let none = reclaimed.is_empty();
                for (job, _) in reclaimed {
                    info!(job.id = %job.id, queue = %job.queue, kind = %job.kind, attempts = job.attempts, status = %job.status, "reclaimed: lease expired");
                }
                none
            }
            Err(err) => {
                warn!(cause = %err, "reclaiming expired leases failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    () = tokio::time::sleep(ERROR_BACKOFF) => continue,
                }
            }
        };
        let mut wake = match store.next_lease_expiry().await {
            Ok(next) => next.map(instant_at),
            Err(err) => {
                warn!(cause = %err, "finding the next lease expiry failed; retrying");
                Some(tokio::time::Instant::now() + ERROR_BACKOFF)
            }
        };
        // A lease already expired that the pass did not reclaim: its row is
        // held by another transaction (another server's reaper, which is
        // reclaiming it, or one that is stuck), which the pass skips. Once
        // is a race with that transaction; twice in a row, look again after
        // a pause rather than at once, over and over, until it lets go.
        let now = tokio::time::Instant::now();
        let missed = none && wake.is_some_and(|at| at <= now);
        if missed && missed_before {
            wake = Some(now + MISSED_PAUSE);
        }
        missed_before = missed;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = lease_changes.changed() => {}
            () = sleep_until_opt(wake) => {}
        }
    }
}

/// With a store shared by several servers: heartbeats every fifth of
/// `--server-timeout`, and reclaims the stream leases of servers that
/// stopped heartbeating (as worker disconnected). Each tick also re-arms
/// the reaper, since leases taken by other servers do not.
async fn cluster_loop<S: Store>(
    store: Arc<S>,
    timeout: Duration,
    shutdown: CancellationToken,
    left: CancellationToken,
) {
    let every = (timeout / 5).max(Duration::from_millis(50));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A server whose own heartbeats failed (the database was away) judges
    // no other until it has heartbeated for a whole timeout: after an
    // outage that silenced everyone, the others need a tick to catch up.
    let mut healthy_since = Some(tokio::time::Instant::now());
    // The last heartbeat that succeeded. Older than half the timeout, and
    // the others may soon take this server for dead: it takes nothing, and
    // its Lease streams end, until a heartbeat succeeds again.
    let half = timeout / 2;
    let mut beat = tokio::time::Instant::now();
    let liveness = store.liveness();
    liveness.renew(half, Duration::ZERO);
    loop {
        tokio::select! {
            _ = left.cancelled() => return,
            _ = tick.tick() => {}
        }
        let started = tokio::time::Instant::now();
        // Bounded by when the last beat grows stale (a tick at least), so
        // a black-holed connection still lets the verdict below change in
        // time. A beat dates from when it was sent: the row may have been
        // written any time after.
        let limit = (beat + half).saturating_duration_since(started).max(every);
        let result = match tokio::time::timeout(limit, store.heartbeat()).await {
            Ok(result) => result,
            Err(_) => Err(crate::Error::Unavailable("the heartbeat timed out".into())),
        };
        if result.is_ok() {
            beat = started;
            liveness.renew(half, started.elapsed());
        }
        let registered = beat.elapsed() < half;
        if registered != *store.registered().borrow() {
            if registered {
                info!("server heartbeat succeeds again; taking jobs again");
            } else {
                warn!("no server heartbeat for half of --server-timeout; taking nothing and ending Lease streams until one succeeds");
            }
            store.set_registered(registered);
        }
        if let Err(err) = result {
            warn!(cause = %err, "server heartbeat failed; retrying");
            healthy_since = None;
            continue;
        }
        // A heartbeat that waited on the database (a stalled WAL fsync, a
        // lock) long enough that the others' heartbeats, stalled alike, may
        // now look older than the timeout: judging them at once would take
        // that shared stall for their death and reclaim their live
        // streams' leases.
        if started.elapsed() + every > timeout {
            warn!(took = ?started.elapsed(), "server heartbeat was slow; judging no other server for a timeout");
            healthy_since = None;
            continue;
        }
        let since = *healthy_since.get_or_insert_with(tokio::time::Instant::now);
        // Shutting down: heartbeats only, until this server has left.
        if since.elapsed() < timeout || shutdown.is_cancelled() {
            continue;
        }
        match store.reclaim_orphaned(store.now()).await {
            Ok(reclaimed) => {
                for (job, lease) in reclaimed {
                    info!(job.id = %job.id, lease.id = %lease, attempts = job.attempts, status = %job.status, "reclaimed: its server stopped heartbeating (worker disconnected)");
                }
            }
            Err(err) => warn!(cause = %err, "reclaiming a dead server's leases failed; retrying"),
        }
    }
}

/// Purges old DONE and FAILED jobs at startup and every [`PURGE_EVERY`].
async fn purge_loop<S: Store>(store: Arc<S>, config: Arc<Config>, shutdown: CancellationToken) {
    loop {
        // A purge of a large database may take a while; shutdown does not
        // wait for it (what it deleted so far is flushed on the way out).
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = purge(&*store, &config) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = tokio::time::sleep(PURGE_EVERY) => {}
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Purges the DONE and FAILED jobs older than their retention by the
/// store's clock (on PostgreSQL the database's, never ahead of it): a
/// server whose own clock runs ahead purges no job younger than that.
async fn purge<S: Store>(store: &S, config: &Config) {
    let now = store.now();
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
