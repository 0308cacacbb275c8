//! Reads: one job, pages, counts, and the deadlines the waiters and the
//! reaper sleep towards. None takes a lock.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::{
    error::PgError,
    row::{self, ATTEMPT_SELECT, COLUMNS},
    Clock, Pg,
};
use crate::{
    error::{Error, Result},
    job::{Job, JobId, LeaseId, Status},
    store::{ListFilter, Page, QueueStats},
};

/// Most leases one reaper pass reclaims; the rest are found on the next.
const EXPIRING_LIMIT: i64 = 1000;

/// `now`: the caller's (`Some`) or the database's.
pub async fn now(
    client: &impl GenericClient,
    now: Option<SystemTime>,
) -> Result<SystemTime, PgError> {
    let stmt = client
        .prepare_cached("SELECT coalesce($1::timestamptz, now())")
        .await?;
    Ok(client.query_one(&stmt, &[&now]).await?.try_get(0)?)
}

/// Fills in the history of jobs read with [`COLUMNS`].
async fn with_history(
    client: &impl GenericClient,
    mut jobs: Vec<Job>,
) -> Result<Vec<Job>, PgError> {
    if jobs.is_empty() {
        return Ok(jobs);
    }
    let ids: Vec<i64> = jobs.iter().map(|j| row::to_db(j.id.0)).collect();
    let stmt = client.prepare_cached(ATTEMPT_SELECT).await?;
    let mut by_job: HashMap<JobId, Vec<_>> = HashMap::new();
    for a in client.query(&stmt, &[&ids]).await? {
        let (id, attempt) = row::attempt_of(&a)?;
        by_job.entry(id).or_default().push(attempt);
    }
    for job in &mut jobs {
        job.history = by_job.remove(&job.id).unwrap_or_default();
    }
    Ok(jobs)
}

/// One job, with its payload or (for checks) without.
pub async fn get(pg: &Pg, id: JobId, payload: bool) -> Result<Job> {
    let client = pg.client().await?;
    // A get reads the result too (after the job's columns); a peek neither
    // it nor the payload.
    let sql = if payload {
        format!(
            "SELECT {COLUMNS}, (SELECT r.result FROM jobq_results r WHERE r.job_id = jobq_jobs.id) \
             FROM jobq_jobs WHERE id = $1"
        )
    } else {
        format!(
            "SELECT {} FROM jobq_jobs WHERE id = $1",
            row::CHANGE_COLUMNS.as_str()
        )
    };
    let stmt = client.prepare_cached(&sql).await.map_err(PgError::from)?;
    let rows = client
        .query(&stmt, &[&row::to_db(id.0)])
        .await
        .map_err(PgError::from)?;
    let jobs = rows
        .iter()
        .map(|r| {
            let mut job = row::job_of(r)?;
            if payload && job.status == Status::Done {
                job.result = r.try_get(row::AFTER_COLUMNS)?;
            }
            Ok(job)
        })
        .collect::<Result<Vec<_>, PgError>>()?;
    with_history(&client, jobs)
        .await?
        .pop()
        .ok_or(Error::NotFound(id))
}

/// Which of ListJobs' filters are given.
#[derive(Debug, Clone, Copy)]
pub struct ListFilters {
    /// By queue.
    pub queue: bool,
    /// By this status.
    pub status: Option<Status>,
    /// By key.
    pub key: bool,
}

/// The WHERE clause of a listing: `id > $1`, then `queue = $4` and
/// `key = $5` (`$4` without a queue) for those given, and the status as a
/// literal. A status parameter would make the plan generic after five
/// runs, and a generic plan cannot tell a status no job has (read from
/// `jobq_jobs_status` or `jobq_jobs_queue_status`) from one nearly every
/// job has (a walk in id order stops after a page): it walks in id order
/// either way, over every job when none matches. With the literal, each
/// status is a statement of its own, planned from the column's statistics.
/// `$2` and `$3` are the statement's own (limit or last id, omit payload).
pub fn list_where(filters: ListFilters) -> String {
    let mut clauses = vec!["id > $1".to_owned()];
    let mut n = 3;
    if filters.queue {
        n += 1;
        clauses.push(format!("queue = ${n}"));
    }
    if let Some(status) = filters.status {
        clauses.push(format!("status = '{}'", status.label()));
    }
    if filters.key {
        n += 1;
        clauses.push(format!("key = ${n}"));
    }
    clauses.join(" AND ")
}

/// A listing's first statement: the ids and sizes of up to `$2` jobs after
/// `$1` (`$3`: payloads left out), filtered by [`list_where`].
pub fn list_sizes(filters: ListFilters) -> String {
    format!(
        "SELECT id, (CASE WHEN $3 THEN 0 ELSE octet_length(payload) END)::bigint \
         + octet_length(queue) + octet_length(kind) + coalesce(octet_length(key), 0) \
         + coalesce(octet_length(last_error), 0) + octet_length(extra::text) + 128 \
         FROM jobq_jobs WHERE {} ORDER BY id LIMIT $2",
        list_where(filters)
    )
}

/// The size of each listed job's history (`$1`: the job ids), as the
/// page will carry it.
const HISTORY_SIZES: &str = "SELECT job_id, \
     sum(octet_length(worker_id) + coalesce(octet_length(error), 0) + 64)::bigint \
     FROM jobq_attempts WHERE job_id = ANY($1) GROUP BY job_id";

/// A listing's parameters: `$1` to `$3`, then the filters given.
fn list_params<'a>(
    after: &'a i64,
    second: &'a (dyn ToSql + Sync),
    omit_payload: &'a bool,
    given: &[&'a (dyn ToSql + Sync)],
) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![after, second, omit_payload];
    params.extend_from_slice(given);
    params
}

/// A page of jobs by ascending id: at most `limit` jobs and about
/// `max_bytes` of them (at least one, so paging moves on), payloads left
/// out with `omit_payload`. The sizes are read first, so a page is never
/// built bigger than its bound in memory.
pub async fn list(pg: &Pg, filter: &ListFilter) -> Result<Page, PgError> {
    let client = pg.client().await?;
    let limit = filter.limit.max(1);
    let after = filter.after.map_or(0, |id| row::to_db(id.0));
    if filter.after.is_some_and(|id| row::to_db(id.0) < 0) {
        // Past every id the sequence hands out.
        return Ok(Page::default());
    }
    let filters = ListFilters {
        queue: filter.queue.is_some(),
        status: filter.status,
        key: filter.key.is_some(),
    };
    // $4 and $5: as `list_where` numbers them.
    let given: Vec<&(dyn ToSql + Sync)> = [&filter.queue, &filter.key]
        .into_iter()
        .filter(|f| f.is_some())
        .map(|f| f as &(dyn ToSql + Sync))
        .collect();
    let params = |second| list_params(&after, second, &filter.omit_payload, &given);
    let sizes = client.prepare_cached(&list_sizes(filters)).await?;
    let limit_plus_one = i64::try_from(limit + 1).unwrap_or(i64::MAX);
    let rows = client.query(&sizes, &params(&limit_plus_one)).await?;
    // The page carries each job's history too (up to `--max-attempts`
    // entries, each with an error of up to `--max-error-bytes`): sized
    // apart, from the attempts' primary key.
    let ids: Vec<i64> = rows
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    let history = client.prepare_cached(HISTORY_SIZES).await?;
    let history: HashMap<i64, i64> = client
        .query(&history, &[&ids])
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    let (mut last, mut taken, mut bytes, mut full) = (None, 0usize, 0usize, false);
    let mut page_ids: Vec<i64> = Vec::new();
    for r in &rows {
        let id: i64 = r.try_get(0)?;
        let size = r
            .try_get::<_, i64>(1)?
            .saturating_add(history.get(&id).copied().unwrap_or(0));
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if taken == limit || (taken > 0 && bytes.saturating_add(size) > filter.max_bytes) {
            full = true;
            break;
        }
        bytes = bytes.saturating_add(size);
        taken += 1;
        last = Some(id);
        page_ids.push(id);
    }
    let Some(last) = last else {
        return Ok(Page::default());
    };
    let columns = COLUMNS.replacen(
        ", payload,",
        ", CASE WHEN $3 THEN ''::bytea ELSE payload END AS payload,",
        1,
    );
    // The jobs the first statement sized, those of them that still match
    // (a job that started to match since is not added: the page stays
    // within its bounds). The next page starts after the last one sized,
    // even if it no longer matches: a page that came back short or empty
    // this way is not the last one.
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {columns} FROM jobq_jobs WHERE {} AND id = ANY($2) ORDER BY id",
            list_where(filters)
        ))
        .await?;
    let rows = client.query(&stmt, &params(&page_ids)).await?;
    let jobs = rows
        .iter()
        .map(row::job_of)
        .collect::<Result<Vec<_>, _>>()?;
    let jobs = with_history(&client, jobs).await?;
    let next = full.then(|| JobId(row::from_db(last)));
    Ok(Page { jobs, next })
}

/// Counts per queue and status (`$1`: one queue, or NULL for all): the
/// folded counts plus the deltas not folded yet, read in one snapshot
/// (see `schema.rs`, version 7).
const COUNTS: &str = "SELECT queue, status, sum(n)::bigint FROM ( \
       SELECT queue, status, n FROM jobq_counts WHERE ($1::text IS NULL OR queue = $1) \
       UNION ALL \
       SELECT queue, status, delta FROM jobq_count_deltas WHERE ($1::text IS NULL OR queue = $1)) c \
     GROUP BY queue, status HAVING sum(n) <> 0 ORDER BY queue";

/// The earliest `run_at` among PENDING jobs of each queue in `$1` (paused
/// or not), skipping through the due index as [`NEXT_RUN_AT`] does, and
/// `$2` (or the database's `now()`).
const EARLIEST: &str = "WITH RECURSIVE prio(q, p) AS ( \
       SELECT q, (SELECT priority FROM jobq_jobs WHERE status = 'pending' AND queue = q \
                  ORDER BY priority DESC LIMIT 1) \
       FROM unnest($1::text[]) AS q \
       UNION ALL \
       SELECT prio.q, (SELECT priority FROM jobq_jobs WHERE status = 'pending' \
                       AND queue = prio.q AND priority < prio.p \
                       ORDER BY priority DESC LIMIT 1) \
       FROM prio WHERE prio.p IS NOT NULL) \
     SELECT q, min((SELECT run_at FROM jobq_jobs WHERE status = 'pending' \
                    AND queue = prio.q AND priority = prio.p ORDER BY run_at LIMIT 1)), \
            coalesce($2::timestamptz, now()) \
     FROM prio WHERE prio.p IS NOT NULL GROUP BY q";

/// Counts per queue, sorted by queue name: from the counts the trigger
/// keeps (a few rows per queue, however many jobs are retained), and the
/// oldest due job's age from the due index (a few probes per queue).
pub async fn stats(
    pg: &Pg,
    queue: Option<&str>,
    now: SystemTime,
) -> Result<Vec<QueueStats>, PgError> {
    let client = pg.client().await?;
    let stmt = client.prepare_cached(COUNTS).await?;
    let rows = client.query(&stmt, &[&queue]).await?;
    let mut out: Vec<QueueStats> = Vec::new();
    for r in rows {
        let name: String = r.try_get(0)?;
        let status: String = r.try_get(1)?;
        let count = u64::try_from(r.try_get::<_, i64>(2)?).unwrap_or(0);
        if out.last().is_none_or(|s| s.queue != name) {
            out.push(QueueStats {
                queue: name,
                ..QueueStats::default()
            });
        }
        let Some(s) = out.last_mut() else { continue };
        match row::status_of(&status)? {
            Status::Pending => s.pending = count,
            Status::Running => s.running = count,
            Status::Done => s.done = count,
            Status::Failed => s.failed = count,
        }
    }
    let pending: Vec<&str> = out
        .iter()
        .filter(|s| s.pending > 0)
        .map(|s| s.queue.as_str())
        .collect();
    if !pending.is_empty() {
        let stmt = client.prepare_cached(EARLIEST).await?;
        let earliest: HashMap<String, (Option<SystemTime>, SystemTime)> = client
            .query(&stmt, &[&pending, &pg.now_param(now)])
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, (r.try_get(1)?, r.try_get(2)?))))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        for s in &mut out {
            if let Some((Some(at), now)) = earliest.get(&s.queue) {
                // Only a due job has an age: one due later has none yet.
                s.oldest_pending_age =
                    (at <= now).then(|| now.duration_since(*at).unwrap_or(Duration::ZERO));
            }
        }
    }
    for s in &mut out {
        if let Some(policy) = pg.limits.get(&s.queue).filter(|_| s.pending > 0) {
            super::limited::held(&client, s, policy).await?;
        }
    }
    if let (Some(queue), true) = (queue, out.is_empty()) {
        // A queue asked for by name is reported even when empty.
        out.push(QueueStats {
            queue: queue.to_owned(),
            ..QueueStats::default()
        });
    }
    Ok(out)
}

/// Folds the count deltas into `jobq_counts` (see `schema.rs`, version 7),
/// unless another server is folding them now. Deltas committed while it
/// runs stay for the next fold.
pub async fn fold_counts(pg: &super::Core) -> Result<(), PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(
            "WITH gone AS (DELETE FROM jobq_count_deltas \
                 WHERE pg_try_advisory_xact_lock($1) RETURNING queue, status, delta) \
             INSERT INTO jobq_counts (queue, status, n) \
             SELECT queue, status, sum(delta) FROM gone GROUP BY queue, status ORDER BY queue, status \
             ON CONFLICT (queue, status) DO UPDATE SET n = jobq_counts.n + EXCLUDED.n",
        )
        .await?;
    client.execute(&stmt, &[&FOLD_LOCK]).await?;
    Ok(())
}

/// The advisory lock of a fold of the counts: "jqfc" in ASCII.
const FOLD_LOCK: i64 = 0x6a71_6663;

/// How often each server folds the count deltas: what Stats sums beyond
/// the folded counts stays a fraction of a second of changes.
pub const FOLD_EVERY: Duration = Duration::from_millis(200);

/// Folds the count deltas every [`FOLD_EVERY`] for as long as the store
/// lives.
pub async fn fold_counts_forever(pg: std::sync::Weak<super::Core>) {
    let mut tick = tokio::time::interval(FOLD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pg) = pg.upgrade() else { return };
        if let Err(err) = fold_counts(&pg).await {
            tracing::debug!(cause = %err, "folding the job counts failed; trying again");
        }
    }
}

/// The earliest `run_at` among PENDING jobs of the queues in `$1`, paused
/// ones left out. The due index is ordered by priority first, so a plain
/// `min(run_at)` would read every pending job; this skips through it like
/// the dequeue does (see `take.rs`): per queue, each pending priority is
/// found with one index probe, and its earliest `run_at` with another.
pub const NEXT_RUN_AT: &str = "WITH RECURSIVE prio(q, p) AS ( \
       SELECT q, (SELECT priority FROM jobq_jobs WHERE status = 'pending' AND queue = q \
                  ORDER BY priority DESC LIMIT 1) \
       FROM unnest($1::text[]) AS q WHERE q NOT IN (SELECT queue FROM jobq_paused) \
       UNION ALL \
       SELECT prio.q, (SELECT priority FROM jobq_jobs WHERE status = 'pending' \
                       AND queue = prio.q AND priority < prio.p \
                       ORDER BY priority DESC LIMIT 1) \
       FROM prio WHERE prio.p IS NOT NULL) \
     SELECT min((SELECT run_at FROM jobq_jobs WHERE status = 'pending' \
                 AND queue = prio.q AND priority = prio.p ORDER BY run_at LIMIT 1)) \
     FROM prio WHERE prio.p IS NOT NULL";

/// [`NEXT_RUN_AT`] of these queues, on this server's clock (see
/// [`on_local_clock`]).
pub async fn next_run_at(pg: &Pg, queues: &[String]) -> Result<Option<SystemTime>, PgError> {
    if let Some(next) = pg.recent.get(queues) {
        // A take of these queues that came up short read it just now
        // (see `takes.rs`).
        return Ok(next);
    }
    let client = pg.client().await?;
    next_run_at_in(&client, pg.clock, queues).await
}

/// [`NEXT_RUN_AT`] of these queues on `client`, on this server's clock.
pub async fn next_run_at_in(
    client: &impl GenericClient,
    clock: Clock,
    queues: &[String],
) -> Result<Option<SystemTime>, PgError> {
    let stmt = client
        .prepare_cached(&format!("SELECT ({NEXT_RUN_AT}), now()"))
        .await?;
    let row = client.query_one(&stmt, &[&queues]).await?;
    Ok(on_local_clock(clock, row.try_get(0)?, row.try_get(1)?))
}

/// The earliest expiry among the leases this server's reaper reclaims
/// (see [`expiring`]), on this server's clock.
pub async fn next_lease_expiry(pg: &Pg) -> Result<Option<SystemTime>, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(
            "SELECT min(lease_expires_at), now() FROM jobq_jobs WHERE status = 'running' \
             AND (lease_server IS NULL OR lease_server = $1)",
        )
        .await?;
    let row = client.query_one(&stmt, &[&pg.me]).await?;
    Ok(on_local_clock(pg.clock, row.try_get(0)?, row.try_get(1)?))
}

/// A database time that a waiter or the reaper will sleep towards, moved
/// to this server's clock: as far from now as it is from the database's
/// `now()`. Their sleeps run on this server's clock, and a server whose
/// clock is ahead of the database's would otherwise wake before the time
/// and look again at once, for as long as the two clocks differ (measured
/// in review: ~1,500 reaper passes a second at 3 s of skew); one behind
/// it would wake late by as much. With the caller's clock (tests), times
/// are the caller's already.
fn on_local_clock(clock: Clock, at: Option<SystemTime>, db_now: SystemTime) -> Option<SystemTime> {
    if clock != Clock::Database {
        return at;
    }
    let local_now = SystemTime::now();
    at.map(|at| match at.duration_since(db_now) {
        Ok(ahead) => local_now + ahead,
        Err(past) => local_now.checked_sub(past.duration()).unwrap_or(local_now),
    })
}

/// Leases that expired at `at` (or the database's `now()`), except those of
/// another server's Lease streams: only the server whose stream holds a
/// lease knows whether its job ever left that server (one that did not is
/// given back without an attempt), and a dead server's stream leases are
/// reclaimed as orphans (see [`super::cluster::reclaim_orphaned`]).
///
/// A plain read: several servers' reapers may list the same plain lease,
/// and the reclaim that follows names the lease id, so only one of them
/// reclaims it (the others' are refused as stale). A `FOR UPDATE SKIP
/// LOCKED` here would lock nothing useful (the statement runs on its own,
/// so its locks end with it) and cost a write of every row it read.
pub async fn expiring(pg: &Pg, at: SystemTime) -> Result<Vec<(JobId, LeaseId)>, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(
            "SELECT id, lease_id FROM jobq_jobs WHERE status = 'running' \
             AND lease_expires_at <= coalesce($1::timestamptz, now()) \
             AND (lease_server IS NULL OR lease_server = $3) \
             ORDER BY lease_expires_at LIMIT $2",
        )
        .await?;
    let rows = client
        .query(&stmt, &[&pg.now_param(at), &EXPIRING_LIMIT, &pg.me])
        .await?;
    rows.iter()
        .map(|r| {
            let id: i64 = r.try_get(0)?;
            let lease: i64 = r.try_get(1)?;
            Ok((JobId(row::from_db(id)), LeaseId(row::from_db(lease))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `at` lies `ahead` past the local clock, within `slack`.
    fn lies_ahead(at: SystemTime, ahead: Duration) -> bool {
        let local = SystemTime::now() + ahead;
        let slack = Duration::from_millis(500);
        at.duration_since(local).unwrap_or_else(|e| e.duration()) < slack
    }

    #[test]
    fn database_times_move_to_the_local_clock() {
        let skew = Duration::from_secs(3);
        let second = Duration::from_secs(1);
        // The database's clock runs 3 s ahead of this server's, and behind.
        for db_now in [SystemTime::now() + skew, SystemTime::now() - skew] {
            let due_in_a_second = on_local_clock(Clock::Database, Some(db_now + second), db_now);
            assert!(lies_ahead(due_in_a_second.unwrap(), second));
            let overdue = on_local_clock(Clock::Database, Some(db_now - second), db_now).unwrap();
            assert!(overdue < SystemTime::now());
            assert!(lies_ahead(overdue + second, Duration::ZERO));
        }
        assert_eq!(
            on_local_clock(Clock::Database, None, SystemTime::now()),
            None
        );
        // The caller's clock (tests): times are the caller's already.
        let at = SystemTime::UNIX_EPOCH + skew;
        assert_eq!(
            on_local_clock(Clock::Caller, Some(at), SystemTime::now()),
            Some(at)
        );
    }
}
