//! Retention: deletes old DONE and FAILED jobs (and, for an operator's
//! purge of PENDING jobs, one queue's PENDING ones) in short transactions
//! of at most [`PURGE_CHUNK`] rows each, skipping rows another transaction
//! holds, so a purge never holds long locks and a take never waits for it. Attempts go with their job (`ON
//! DELETE CASCADE`), and a deleted job frees its key. Which jobs go is
//! decided by [`Retention::purgeable`], the rule every store shares; the
//! SQL only narrows the candidates.
//!
//! A step's scan covers at most [`PURGE_ID_WINDOW`] ids; the next step
//! starts at the first job past them (so ids already purged cost nothing),
//! and a pass stops at a job enqueued well after both cutoffs
//! ([`Retention::past_every_cutoff`]): a pass reads about the jobs old
//! enough to be purged, not the rest of the table. (Unbounded, the scan for
//! the last chunk walked every later row in one statement: 1.3 s and 309k
//! buffers at 10M jobs, every pass, on every server.)

use std::time::SystemTime;

use super::{error::PgError, row, Pg};
use crate::{job::JobId, store::rules::Retention};

/// Rows deleted per purge step, at most.
const PURGE_CHUNK: i64 = 1000;

/// Ids one step's scan covers, at most (ids come from a sequence, so
/// about as many rows).
const PURGE_ID_WINDOW: i64 = 50_000;

/// One purge step, as [`crate::store::Backend::purge_chunk`].
pub async fn purge_chunk(
    pg: &Pg,
    after: Option<JobId>,
    retention: Retention,
) -> Result<(u64, Option<JobId>), PgError> {
    if let (Some(queue), Some(through)) = (&retention.queue, retention.pending_through) {
        return pending_chunk(pg, after, queue, through, &retention).await;
    }
    let mut client = pg.client().await?;
    let tx = client.transaction().await?;
    let after = after.map_or(0, |id| row::to_db(id.0));
    let until = after.saturating_add(PURGE_ID_WINDOW);
    let latest = retention.done_before.max(retention.failed_before);
    let select = tx
        .prepare_cached(&format!(
            "SELECT {} FROM jobq_jobs WHERE id > $1 AND id <= $5 \
             AND status IN ('done', 'failed') \
             AND finished_at < $2 AND ($4::text IS NULL OR queue = $4) \
             ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED",
            *row::CHANGE_COLUMNS
        ))
        .await?;
    let rows = tx
        .query(
            &select,
            &[&after, &latest, &PURGE_CHUNK, &retention.queue, &until],
        )
        .await?;
    let mut doomed = Vec::new();
    let mut last = None;
    for r in &rows {
        let job = row::job_of(r)?;
        last = Some(job.id);
        if retention.purgeable(&job) {
            doomed.push(row::to_db(job.id.0));
        }
    }
    let deleted = if doomed.is_empty() {
        0
    } else {
        tx.execute("DELETE FROM jobq_jobs WHERE id = ANY($1)", &[&doomed])
            .await?
    };
    let next = if i64::try_from(rows.len()).unwrap_or(0) == PURGE_CHUNK {
        last
    } else {
        // The window is done: on to the next job past it (over ids
        // already purged or never used), unless there is none or it was
        // enqueued after every cutoff.
        let following = tx
            .prepare_cached(
                "SELECT id, enqueued_at FROM jobq_jobs WHERE id > $1 ORDER BY id LIMIT 1",
            )
            .await?;
        match tx.query_opt(&following, &[&until]).await? {
            Some(r) if !retention.enqueued_past_every_cutoff(r.try_get::<_, SystemTime>(1)?) => {
                let id: i64 = r.try_get(0)?;
                Some(JobId(row::from_db(id - 1)))
            }
            _ => None,
        }
    };
    tx.commit().await?;
    Ok((deleted, next))
}

/// One step of a purge of `queue`'s PENDING jobs up to id `through`, by
/// the (queue, status, id) index: only that queue's PENDING rows are read.
/// A row a take (or a cancel, a delete) holds is skipped: it is leaving
/// PENDING, or gone.
async fn pending_chunk(
    pg: &Pg,
    after: Option<JobId>,
    queue: &str,
    through: JobId,
    retention: &Retention,
) -> Result<(u64, Option<JobId>), PgError> {
    let mut client = pg.client().await?;
    let tx = client.transaction().await?;
    let after = after.map_or(0, |id| row::to_db(id.0));
    let through = row::to_db(through.0);
    let select = tx
        .prepare_cached(&format!(
            "SELECT {} FROM jobq_jobs WHERE queue = $1 AND status = 'pending' \
             AND id > $2 AND id <= $3 ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED",
            *row::CHANGE_COLUMNS
        ))
        .await?;
    let rows = tx
        .query(&select, &[&queue, &after, &through, &PURGE_CHUNK])
        .await?;
    let mut doomed = Vec::new();
    let mut last = None;
    for r in &rows {
        let job = row::job_of(r)?;
        last = Some(job.id);
        if retention.purgeable(&job) {
            doomed.push(row::to_db(job.id.0));
        }
    }
    let deleted = if doomed.is_empty() {
        0
    } else {
        tx.execute("DELETE FROM jobq_jobs WHERE id = ANY($1)", &[&doomed])
            .await?
    };
    tx.commit().await?;
    let next = if i64::try_from(rows.len()).unwrap_or(0) == PURGE_CHUNK {
        last
    } else {
        None
    };
    Ok((deleted, next))
}

/// The highest id among `queue`'s PENDING jobs, as
/// [`crate::store::Backend::last_pending`].
pub async fn last_pending(pg: &Pg, queue: &str) -> Result<Option<JobId>, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached("SELECT max(id) FROM jobq_jobs WHERE queue = $1 AND status = 'pending'")
        .await?;
    let last: Option<i64> = client.query_one(&stmt, &[&queue]).await?.try_get(0)?;
    Ok(last.map(|id| JobId(row::from_db(id))))
}
