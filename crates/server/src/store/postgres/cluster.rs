//! The servers sharing one database: each registers in `jobq_servers` and
//! heartbeats there. The leases that a server's Lease streams hold carry
//! its id (`jobq_jobs.lease_server`); when a server stops heartbeating for
//! `--server-timeout` (it was killed, or cut off from the database), its
//! streams are gone with it, and every other server reclaims those leases
//! as worker disconnected, as the dead server would have done when the
//! streams ended. Several servers may try the same reclaim: the row lock
//! and the lease id fence it, and the refused ones are counted
//! ([`super::Pg`]'s `fenced_reclaims`). The server that declares another
//! dead also ends that one's database sessions ([`end_dead_sessions`]).
//!
//! A server that shuts down gracefully keeps its streams' leases valid
//! (a shutdown is no worker death): it clears their server id, so they
//! only expire, and leaves the registry.
//!
//! [`Pg`]'s [`Cluster`] is made of these, with the other servers' events
//! ([`listen`]).

use std::{
    sync::{atomic::Ordering, Arc},
    time::{Duration, SystemTime},
};

use tokio_postgres::types::ToSql;

use super::{error::PgError, listen, operator, queries, row, tx::Open, write, Pg};
use crate::{
    error::Result,
    job::{JobId, LeaseId, Outcome, Status},
    machine::Event,
    store::{Change, Cluster, LeaseEnded},
};

/// Most orphaned leases reclaimed in one transaction.
const RECLAIM_CHUNK: i64 = 1000;

/// Registered servers silent for this many timeouts are removed.
const FORGET_AFTER_TIMEOUTS: f64 = 10.0;

/// Registers this server (again, if it was forgotten) and records that it
/// is alive; forgets servers long dead. On a connection of its own, not
/// the pool's (see [`Pg`]'s `heartbeats`). The time it writes is this
/// server's reading of the database's clock (see [`super::clock`]).
/// Returns how many registered servers were silent for `--server-timeout`
/// (read in the same round trip): one more than last time may have died
/// with wake-ups it had not sent yet (see [`super::listen`]).
pub async fn heartbeat(pg: &Pg) -> Result<u64, PgError> {
    let client = pg.heartbeats.get().await?;
    let beat = client
        .prepare_cached(
            // clock_timestamp(): when the row is written, not when the
            // statement began (a stall before it must not date it back).
            "INSERT INTO jobq_servers (id, heartbeat_at) VALUES ($1, clock_timestamp()) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = clock_timestamp() \
             RETURNING heartbeat_at",
        )
        .await?;
    let forget = client
        .prepare_cached(
            "DELETE FROM jobq_servers WHERE heartbeat_at < now() - make_interval(secs => $1)",
        )
        .await?;
    let silent = client
        .prepare_cached(
            "SELECT count(*) FROM jobq_servers \
             WHERE id <> $1 AND heartbeat_at <= now() - make_interval(secs => $2)",
        )
        .await?;
    let long_dead = pg.server_timeout.as_secs_f64() * FORGET_AFTER_TIMEOUTS;
    let timeout = pg.server_timeout.as_secs_f64();
    let (me, dead): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 1]) = ([&pg.me], [&long_dead]);
    let quiet: [&(dyn ToSql + Sync); 2] = [&pg.me, &timeout];
    let (row, _, silent) = futures::try_join!(
        client.query_one(&beat, &me),
        client.execute(&forget, &dead),
        client.query_one(&silent, &quiet)
    )?;
    pg.observed_clock(row.try_get(0)?, std::time::Instant::now());
    Ok(u64::try_from(silent.try_get::<_, i64>(0)?).unwrap_or(0))
}

/// Ends the database sessions of the registered servers that were not
/// heard from within `--server-timeout` (found by their
/// `application_name`, see [`super::application_name`]), so that a
/// vanished or frozen server's sessions go now rather than when TCP gives
/// up on them: its LISTEN stops holding back the shared notification
/// queue, and its open transaction's row locks are released before its
/// leases are reclaimed. Only sessions of this server's own role (ending
/// another's needs a privilege a jobq role need not have). A server that
/// comes back reconnects, and heartbeats again. Returns how many ended.
async fn end_dead_sessions(pg: &Pg) -> Result<u64, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) \
             FROM pg_stat_activity a JOIN jobq_servers s \
               ON a.application_name LIKE $3 || s.id || ' %' \
             WHERE s.id <> $1 AND s.heartbeat_at <= now() - make_interval(secs => $2) \
               AND a.usesysid = (SELECT oid FROM pg_roles WHERE rolname = current_user) \
               AND a.pid <> pg_backend_pid()",
        )
        .await?;
    let timeout = pg.server_timeout.as_secs_f64();
    let ended: i64 = client
        .query_one(&stmt, &[&pg.me, &timeout, &super::SESSION_PREFIX])
        .await?
        .try_get(0)?;
    Ok(u64::try_from(ended).unwrap_or(0))
}

/// The servers that hold stream leases but were not heard from within
/// `--server-timeout`.
///
/// One index probe per server that holds stream leases (a loose index scan
/// of `lease_server`: there are as many as servers, however many leases),
/// less the live ones. An anti-join of every stream lease against the live
/// servers took about 100 ms at 50,000 leases, and every server runs this
/// about once a second.
async fn dead_servers(pg: &Pg) -> Result<Vec<String>, PgError> {
    let client = pg.client().await?;
    let dead = client
        .prepare_cached(
            "WITH RECURSIVE holders(server) AS ( \
                 SELECT min(lease_server) FROM jobq_jobs WHERE lease_server IS NOT NULL \
                 UNION ALL \
                 SELECT (SELECT min(lease_server) FROM jobq_jobs WHERE lease_server > h.server) \
                 FROM holders h WHERE h.server IS NOT NULL) \
             SELECT server FROM holders h WHERE server IS NOT NULL AND server <> $1 \
             AND NOT EXISTS (SELECT 1 FROM jobq_servers s WHERE s.id = h.server \
                             AND s.heartbeat_at > now() - make_interval(secs => $2))",
        )
        .await?;
    let timeout = pg.server_timeout.as_secs_f64();
    let rows = client.query(&dead, &[&pg.me, &timeout]).await?;
    Ok(rows
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?)
}

/// Reclaims the stream leases of dead servers (see [`dead_servers`]) as
/// worker disconnected, [`RECLAIM_CHUNK`] jobs a transaction, until none
/// is left.
///
/// Each chunk locks its rows with `SKIP LOCKED` on the condition that they
/// still belong to a dead server: PostgreSQL checks that condition again on
/// the locked row, so a lease that a reconnecting worker's new server
/// adopted meanwhile is left alone, and the servers that reclaim at once
/// split the rows instead of queueing for the same ones.
pub async fn reclaim_orphaned(pg: &Pg, now: SystemTime) -> Result<Vec<Change>, PgError> {
    match end_dead_sessions(pg).await {
        Ok(0) => {}
        Ok(ended) => tracing::info!(
            sessions = ended,
            "ended the database sessions of servers that stopped heartbeating"
        ),
        // The reclaim does not depend on it.
        Err(err) => tracing::warn!(cause = %err, "ending a dead server's database sessions failed"),
    }
    let dead = dead_servers(pg).await?;
    let mut changed = Vec::new();
    if dead.is_empty() {
        return Ok(changed);
    }
    let sql = format!(
        "SELECT {}, lease_server FROM jobq_jobs \
         WHERE lease_server = ANY($1) AND status = 'running' \
         ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
        *row::CHANGE_COLUMNS
    );
    loop {
        let tx = Open::new(pg.client().await?);
        let stmt = tx.prepare_cached(&sql).await?;
        let (_, rows) = futures::try_join!(tx.begin(), async {
            Ok(tx.query(&stmt, &[&dead, &RECLAIM_CHUNK]).await?)
        })?;
        let db_now = queries::now(tx.client(), pg.now_param(now)).await?;
        let locked = rows.len();
        let loaded = write::with_history(&tx, rows).await?;
        let events = loaded
            .iter()
            .filter_map(|l| {
                let lease_id = l.job.lease_id()?;
                let outcome = Outcome::WorkerDisconnected;
                Some((l.job.id, Event::Reclaim { lease_id, outcome }))
            })
            .collect();
        let (results, writes, _) = write::apply_all(loaded, events, db_now);
        let due = write::write(&tx, pg, &writes).await?;
        tx.commit().await?;
        pg.due(due);
        let before = changed.len();
        changed.extend(results.into_iter().filter_map(Result::ok));
        // A short chunk was the last; one that changed nothing would only
        // find the same rows again.
        if locked < RECLAIM_CHUNK as usize || changed.len() == before {
            return Ok(changed);
        }
    }
}

/// A worker reconnected to this server and declared these leases: this
/// server's stream holds them now (fenced on the lease id, so a lease that
/// ended meanwhile is left alone). A lease that another server's stream
/// held is a lease-ended event there (`moved`), notified in the same
/// commit: that stream frees its slot and tells its worker.
pub async fn adopt(pg: &Pg, leases: &[(JobId, LeaseId)]) -> Result<(), PgError> {
    let mut client = pg.client().await?;
    let ids: Vec<i64> = leases.iter().map(|(id, _)| row::to_db(id.0)).collect();
    let lease_ids: Vec<i64> = leases.iter().map(|(_, l)| row::to_db(l.0)).collect();
    let tx = client.transaction().await?;
    let stmt = tx
        .prepare_cached(
            // Rows locked in id order, as every other multi-row writer
            // locks them: in join order, this could deadlock with them.
            "UPDATE jobq_jobs j SET lease_server = $1 \
             FROM (SELECT l.id, l.lease_server AS before FROM jobq_jobs l \
                   JOIN unnest($2::bigint[], $3::bigint[]) AS t(id, lease) \
                     ON l.id = t.id AND l.lease_id = t.lease \
                   WHERE l.status = 'running' ORDER BY l.id FOR UPDATE OF l) AS o \
             WHERE j.id = o.id \
             RETURNING j.id, j.lease_id, j.queue, o.before",
        )
        .await?;
    let rows = tx.query(&stmt, &[&pg.me, &ids, &lease_ids]).await?;
    let mut payloads = Vec::new();
    for r in &rows {
        let before: Option<String> = r.try_get(3)?;
        if before.as_ref().is_none_or(|b| *b == pg.me) {
            continue;
        }
        let moved = LeaseEnded {
            job: JobId(row::from_db(r.try_get(0)?)),
            lease: LeaseId(row::from_db(r.try_get(1)?)),
            queue: r.try_get(2)?,
            outcome: None,
            status: Status::Running,
            moved: true,
        };
        payloads.push(listen::encode(&pg.me, &moved));
    }
    if !payloads.is_empty() {
        tx.execute(
            "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS t(p)",
            &[&listen::LEASE_ENDED, &payloads],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Whether another server's stream holds the lease now (it adopted it).
pub async fn held_elsewhere(pg: &Pg, id: JobId, lease: LeaseId) -> Result<bool, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(
            "SELECT 1 FROM jobq_jobs WHERE id = $1 AND lease_id = $2 \
             AND lease_server IS NOT NULL AND lease_server <> $3",
        )
        .await?;
    let rows = client
        .query(&stmt, &[&row::to_db(id.0), &row::to_db(lease.0), &pg.me])
        .await?;
    Ok(!rows.is_empty())
}

/// A graceful stop: this server's stream leases become plain leases, and
/// it leaves the registry.
pub async fn leave(pg: &Pg) -> Result<(), PgError> {
    let mut client = pg.client().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "UPDATE jobq_jobs j SET lease_server = NULL \
         FROM (SELECT id FROM jobq_jobs WHERE lease_server = $1 ORDER BY id FOR UPDATE) AS o \
         WHERE j.id = o.id AND j.lease_server = $1",
        &[&pg.me],
    )
    .await?;
    tx.execute("DELETE FROM jobq_servers WHERE id = $1", &[&pg.me])
        .await?;
    tx.commit().await?;
    Ok(())
}

impl Cluster for Pg {
    async fn heartbeat(&self) -> Result<()> {
        let silent = heartbeat(self).await?;
        if silent > self.silent.swap(silent, Ordering::Relaxed) {
            // A server went silent: the wake-ups it had committed but not
            // sent yet are lost with it (see [`listen`]), so every waiter
            // looks again.
            if let Some(remote) = self.remote.get() {
                remote.due();
            }
        }
        // Policies set through other servers, for this server's wake-ups
        // and waits: best effort, off the heartbeat's own connection and
        // clock (takes read the table itself, and refresh the copy too).
        let core = Arc::clone(&self.core);
        tokio::spawn(async move {
            if let Err(err) = operator::policies(&core).await {
                tracing::debug!(cause = %err, "reading the queue policies failed; trying at the next heartbeat");
            }
        });
        // Other servers' leases do not re-arm this server's reaper; the
        // heartbeat does, so a lease whose server died is still reaped.
        if let Some(remote) = self.remote.get() {
            remote.rearm();
        }
        Ok(())
    }

    async fn reclaim_orphaned(&self, now: SystemTime) -> Result<Vec<Change>> {
        Ok(reclaim_orphaned(self, now).await?)
    }

    async fn adopt(&self, leases: &[(JobId, LeaseId)]) -> Result<()> {
        Ok(adopt(self, leases).await?)
    }

    async fn held_elsewhere(&self, id: JobId, lease: LeaseId) -> Result<bool> {
        Ok(held_elsewhere(self, id, lease).await?)
    }

    async fn leave(&self) -> Result<()> {
        // The wake-ups of what this server committed go out before it
        // leaves (a bounded wait: a broken LISTEN connection would hold
        // them until it reconnects).
        let (done, sent) = tokio::sync::oneshot::channel();
        if self.outbox.send(listen::Outgoing::Flush(done)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(1), sent).await;
        }
        Ok(leave(self).await?)
    }

    fn fenced_reclaims(&self) -> u64 {
        self.doubles.load(Ordering::Relaxed)
    }

    async fn notification_queue_usage(&self) -> Result<Option<f64>> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT pg_notification_queue_usage()")
            .await
            .map_err(PgError::from)?;
        let usage: f64 = client
            .query_one(&stmt, &[])
            .await
            .map_err(PgError::from)?
            .try_get(0)
            .map_err(PgError::from)?;
        Ok(Some(usage))
    }
}
