//! The dequeue: the first due PENDING job of the first queue that has one,
//! locked with `FOR UPDATE SKIP LOCKED` so concurrent takers (on any
//! server) each get a different job without waiting on each other.
//!
//! The query filters on exactly the predicate of the partial index
//! `jobq_jobs_due_by_priority (queue, priority DESC, run_at, id) WHERE
//! status = 'pending'` and orders by its columns (DESIGN.md §1 rule 5), so
//! the index hands rows out in order and the first due, unlocked one ends
//! the scan. Within a priority the due jobs come first (they have the
//! earliest `run_at`), so the only entries a take steps over are jobs of a
//! higher priority that are not due yet; `run_at` is in the index, so it
//! steps over them without reading their rows. The primary key offers no such order: a
//! plan over it would have to visit every row, DONE ones included, so the
//! planner does not pick it however the statistics of DONE rows grow (the
//! bench test `pg_dequeue_plan` checks this with EXPLAIN after ANALYZE).

use std::{collections::HashSet, time::SystemTime};

use super::{error::PgError, queries, row::COLUMNS, write, Pg};
use crate::{machine::Event, store::Change};

/// The dequeue statement for one queue (`$1`) at `$2` (or the database's
/// `now()`).
pub const DEQUEUE: &str = "FROM jobq_jobs WHERE status = 'pending' AND queue = $1 \
     AND run_at <= coalesce($2::timestamptz, now()) \
     ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED";

/// Takes the first due job, as [`crate::store::Backend::take`].
pub async fn take(
    pg: &Pg,
    queues: &[String],
    take: Event,
    streamed: bool,
    now: SystemTime,
) -> Result<Option<Change>, PgError> {
    let mut client = pg.client().await?;
    let tx = client.transaction().await?;
    let sync_off = async {
        tx.batch_execute("SET LOCAL synchronous_commit = off")
            .await
            .map_err(PgError::from)
    };
    let db_now = queries::now(&tx, pg.now_param(now));
    // Pipelined with the two above: one round trip for all three.
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
    let (_, now, paused) = futures::try_join!(sync_off, db_now, paused)?;
    let stmt = tx
        .prepare_cached(&format!("SELECT {COLUMNS}, lease_server {DEQUEUE}"))
        .await?;
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
