//! The dequeue: the first due PENDING job of the first queue that has one,
//! locked with `FOR UPDATE SKIP LOCKED` so concurrent takers (on any
//! server) each get a different job without waiting on each other.
//!
//! Priority first (docs/src/design.md §1 rule 5), without letting jobs that are
//! not due yet make a take slow. The index is `jobq_jobs_due_by_priority
//! (queue, priority DESC, run_at, id) WHERE status = 'pending'`. A plain
//! `ORDER BY priority DESC, run_at, id` over it would step over every
//! not-yet-due job of a higher priority, one index entry each, before it
//! reached a due job of a lower one: 200,000 delayed jobs at priority 10
//! made each take read ~1,000 index pages (16 ms). So the statement skips
//! through the index: a recursive CTE finds the queue's highest pending
//! priority, and only if that priority has no due, unlocked job does it
//! look for the next lower priority (one index probe each, `priority <
//! p ORDER BY priority DESC LIMIT 1`). Per priority, `ORDER BY run_at, id`
//! is the index's own order, so the first due, unlocked row ends the
//! probe. A take costs a few index descents per priority that has pending
//! jobs but none due (at most 201), not per job: 16 pages and 0.16 ms in
//! the case above. The primary key offers no such order, so the planner
//! does not pick it however the statistics of DONE rows grow (the bench
//! test `pg_dequeue_plan` checks both with EXPLAIN).

use std::{collections::HashSet, sync::LazyLock, time::SystemTime};

use super::{error::PgError, operator, queries, row::COLUMNS, write, Pg};
use crate::{machine::Event, store::Change};

/// The dequeue statement for one queue (`$1`) at `$2` (or the database's
/// `now()`), selecting `columns` of the job it locks.
pub fn dequeue(columns: &str) -> String {
    format!(
        "WITH RECURSIVE prio(p) AS ( \
           (SELECT priority FROM jobq_jobs WHERE status = 'pending' AND queue = $1 \
            ORDER BY priority DESC LIMIT 1) \
           UNION ALL \
           SELECT (SELECT priority FROM jobq_jobs WHERE status = 'pending' AND queue = $1 \
                   AND priority < prio.p ORDER BY priority DESC LIMIT 1) \
           FROM prio WHERE prio.p IS NOT NULL) \
         SELECT j.* FROM prio CROSS JOIN LATERAL ( \
           SELECT {columns} FROM jobq_jobs WHERE status = 'pending' AND queue = $1 \
           AND priority = prio.p AND run_at <= coalesce($2::timestamptz, now()) \
           ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) j \
         LIMIT 1"
    )
}

/// [`dequeue`] of a whole job row, built once.
static DEQUEUE_ROW: LazyLock<String> =
    LazyLock::new(|| dequeue(&format!("{COLUMNS}, lease_server")));

/// Takes the first due job, as [`crate::store::Backend::take`].
pub async fn take(
    pg: &Pg,
    queues: &[String],
    take: Event,
    streamed: bool,
    now: SystemTime,
) -> Result<Option<Change>, PgError> {
    // Never closed: only dropped with the store.
    let _permit = pg
        .takes
        .acquire()
        .await
        .map_err(|_| PgError::Raced("the store is closing".into()))?;
    let mut client = pg.client().await?;
    let tx = client.transaction().await?;
    let sync_off = async {
        tx.batch_execute("SET LOCAL synchronous_commit = off")
            .await
            .map_err(PgError::from)
    };
    let db_now = queries::now(&tx, pg.now_param(now));
    // The queues' pause locks (shared), held until this commits, order the
    // take with PauseQueue (`operator::set_paused`): a statement of their
    // own, sent before the read of the paused queues (`try_join!` polls in
    // order, and a connection runs its statements in the order sent), so
    // that read starts after them.
    // In key order, as every take: then takes waiting behind pauses can
    // never wait on each other in a cycle (a pause holds nothing while it
    // waits).
    let mut keys: Vec<i32> = queues.iter().map(|q| operator::pause_lock_key(q)).collect();
    keys.sort_unstable();
    keys.dedup();
    let locked = async {
        let stmt = tx
            .prepare_cached(
                // unnest yields the array's elements in order.
                "SELECT count(pg_advisory_xact_lock_shared($1, k)) FROM unnest($2::int4[]) AS k",
            )
            .await?;
        tx.query_one(&stmt, &[&operator::PAUSE_LOCK, &keys])
            .await
            .map_err(PgError::from)
    };
    // Pipelined with the three above: one round trip for all four.
    let paused = async {
        let stmt = tx
            .prepare_cached("SELECT queue FROM jobq_paused WHERE queue = ANY($1)")
            .await?;
        let rows = tx.query(&stmt, &[&queues]).await?;
        rows.iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<Result<HashSet<String>, _>>()
            .map_err(PgError::from)
    };
    // A stream's take: only while this server's own heartbeat is fresh
    // (half of `--server-timeout`), read in this transaction, so that no
    // server the others may be about to judge dead hands out a lease they
    // would reclaim from a live worker.
    let registered = async {
        if !streamed {
            return Ok(true);
        }
        let stmt = tx
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM jobq_servers WHERE id = $1 \
                 AND heartbeat_at > now() - make_interval(secs => $2))",
            )
            .await?;
        let half = pg.server_timeout.as_secs_f64() / 2.0;
        let row = tx.query_one(&stmt, &[&pg.me, &half]).await?;
        row.try_get::<_, bool>(0).map_err(PgError::from)
    };
    let (_, now, _, paused, registered) =
        futures::try_join!(sync_off, db_now, locked, paused, registered)?;
    if !registered {
        return Err(PgError::Unregistered);
    }
    let stmt = tx.prepare_cached(&DEQUEUE_ROW).await?;
    let now_param = pg.now_param(now);
    for queue in queues.iter().filter(|q| !paused.contains(*q)) {
        let rows = tx.query(&stmt, &[queue, &now_param]).await?;
        if rows.is_empty() {
            continue;
        }
        let loaded = write::with_history(&tx, rows).await?;
        let Some(id) = loaded.first().map(|l| l.job.id) else {
            continue;
        };
        let (mut results, mut writes, _) = write::apply_all(loaded, vec![(id, take)], now);
        if streamed {
            for w in &mut writes {
                w.server = Some(pg.me.clone());
            }
        }
        write::write(&tx, &pg.me, &writes).await?;
        tx.commit().await?;
        return match results.pop() {
            Some(Ok(change)) => Ok(Some(change)),
            // The row was due under the same `now`: a refusal is a bug.
            Some(Err(e)) => Err(PgError::Schema(format!("a due job refused its take: {e}"))),
            None => Ok(None),
        };
    }
    tx.commit().await?;
    Ok(None)
}
