//! The operator's writes: delete one job, pause and resume a queue, set a
//! queue's policy. Each is one short transaction; the rules stay in
//! [`crate::machine`].

use std::collections::BTreeSet;

use super::{error::PgError, listen, row, tx::Open, write, Core, Pg};
use crate::{
    error::{Error, Result},
    job::JobId,
    machine,
    policy::{QueuePolicy, Rate},
};

/// Deletes one job unless it is RUNNING, deciding on the row locked `FOR
/// UPDATE` (attempts go with it, `ON DELETE CASCADE`).
pub async fn delete(pg: &Pg, id: JobId) -> Result<()> {
    let tx = Open::new(pg.client().await.map_err(Error::from)?);
    let ids = BTreeSet::from([id]);
    let (_, loaded) = futures::try_join!(tx.begin(), write::lock(&tx, &ids))?;
    let deleted = async {
        let job = &loaded.first().ok_or(Error::NotFound(id))?.job;
        machine::deletable(job)?;
        tx.execute("DELETE FROM jobq_jobs WHERE id = $1", &[&row::to_db(id.0)])
            .await
            .map_err(PgError::from)?;
        Ok::<_, Error>(())
    }
    .await;
    match deleted {
        Ok(()) => tx.commit().await?,
        Err(err) => {
            tx.rollback().await;
            return Err(err);
        }
    }
    Ok(())
}

/// The first key of the per-queue pause locks (PostgreSQL's two-key
/// advisory locks, a key space apart from the migrations' one-key lock):
/// "jqpa" in ASCII.
pub const PAUSE_LOCK: i32 = 0x6a71_7061;

/// How long a pause waits for the takes in flight of its queue.
const PAUSE_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The second key of `queue`'s pause lock: a stable hash of its name (a
/// collision only makes a pause wait for another queue's takes too).
pub fn pause_lock_key(queue: &str) -> i32 {
    i32::from_ne_bytes(crc32fast::hash(queue.as_bytes()).to_ne_bytes())
}

/// The one-key advisory lock that pauses of queues not yet paused take
/// (exclusive, per transaction), so that each counts the others'
/// committed pauses against `--max-paused-queues`: "jqpc" in ASCII.
/// (The migrations' one-key lock has another key.)
pub const PAUSE_CAP_LOCK: i64 = 0x6a71_7063;

/// Pauses or resumes a queue (idempotent). A resume tells every server
/// (this one included, through its listener) that jobs may be due.
/// Pausing a queue not yet paused when `most` are is RESOURCE_EXHAUSTED,
/// counted under [`PAUSE_CAP_LOCK`] so that pauses racing on any servers
/// never go past it; pausing a paused queue always succeeds.
pub async fn set_paused(pg: &Pg, queue: &str, paused: bool, most: usize) -> Result<()> {
    let mut client = pg.client().await.map_err(Error::from)?;
    let tx = client.transaction().await.map_err(PgError::from)?;
    if paused {
        // A take holds its queues' pause locks (shared) from before it
        // reads jobq_paused until it commits: this waits for the takes of
        // this queue in flight (their jobs are taken before the pause
        // returns), and a take that starts meanwhile waits for this commit
        // and then reads the pause. Without it, a take that had read "not
        // paused" just before could still take a job after PauseQueue
        // returned (docs/src/design.md §1 rule 6). A take stuck mid-transaction
        // makes this fail (UNAVAILABLE, retryable) rather than wait on.
        lock_queue(&tx, queue).await?;
        if !held(&tx, "jobq_paused", queue).await? {
            // Taken after the queue's own lock, by pauses only: a take
            // never waits for it.
            let count = count_under(&tx, PAUSE_CAP_LOCK, "jobq_paused").await?;
            crate::validate::pause_room(count, false, most)?;
        }
        tx.execute(
            "INSERT INTO jobq_paused (queue) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&queue],
        )
        .await
        .map_err(PgError::from)?;
    } else {
        tx.execute("DELETE FROM jobq_paused WHERE queue = $1", &[&queue])
            .await
            .map_err(PgError::from)?;
        tx.execute("SELECT pg_notify($1, $2)", &[&listen::DUE, &queue])
            .await
            .map_err(PgError::from)?;
    }
    tx.commit().await.map_err(PgError::from)?;
    Ok(())
}

/// Every paused queue, sorted by bytes (as Rust sorts strings, and sled
/// keeps them), whatever the database's collation.
pub async fn paused(pg: &Pg) -> Result<Vec<String>, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached("SELECT queue FROM jobq_paused ORDER BY queue COLLATE \"C\"")
        .await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(PgError::from)
}

/// Takes `queue`'s pause lock (exclusive), waiting at most
/// [`PAUSE_LOCK_TIMEOUT`] for the takes of the queue in flight (a take
/// stuck mid-transaction makes this fail, UNAVAILABLE and retryable,
/// rather than wait on).
async fn lock_queue(tx: &tokio_postgres::Transaction<'_>, queue: &str) -> Result<()> {
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{}ms'; SELECT pg_advisory_xact_lock({PAUSE_LOCK}, {})",
        PAUSE_LOCK_TIMEOUT.as_millis(),
        pause_lock_key(queue)
    ))
    .await
    .map_err(PgError::from)?;
    Ok(())
}

/// Whether `table` (of rows keyed by queue) has a row for `queue`.
async fn held(tx: &tokio_postgres::Transaction<'_>, table: &str, queue: &str) -> Result<bool> {
    let row = tx
        .query_opt(
            &format!("SELECT 1 FROM {table} WHERE queue = $1"),
            &[&queue],
        )
        .await
        .map_err(PgError::from)?;
    Ok(row.is_some())
}

/// The rows of `table`, counted under the one-key advisory lock `cap`, so
/// that writers racing on any servers each count the others' committed
/// rows against their cap.
async fn count_under(tx: &tokio_postgres::Transaction<'_>, cap: i64, table: &str) -> Result<usize> {
    tx.execute(&format!("SELECT pg_advisory_xact_lock({cap})"), &[])
        .await
        .map_err(PgError::from)?;
    let count: i64 = tx
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .map_err(PgError::from)?
        .get(0);
    Ok(usize::try_from(count).unwrap_or(usize::MAX))
}

/// The one-key advisory lock that new policies take, so that each counts
/// the others' against `--max-queue-policies`: "jqpp" in ASCII.
pub const POLICY_CAP_LOCK: i64 = 0x6a71_7070;

/// Sets (or, empty, clears) a queue's policy, and tells every server that
/// its jobs may be due. Like a pause, it first waits for the takes of the
/// queue in flight (its pause lock, exclusive): a take that starts after
/// it returns reads the new policy.
pub async fn set_policy(pg: &Pg, queue: &str, policy: QueuePolicy, most: usize) -> Result<()> {
    let mut client = pg.client().await.map_err(Error::from)?;
    let tx = client.transaction().await.map_err(PgError::from)?;
    lock_queue(&tx, queue).await?;
    if policy.is_empty() {
        tx.execute("DELETE FROM jobq_policies WHERE queue = $1", &[&queue])
            .await
            .map_err(PgError::from)?;
    } else {
        if !held(&tx, "jobq_policies", queue).await? {
            let count = count_under(&tx, POLICY_CAP_LOCK, "jobq_policies").await?;
            crate::validate::policy_room(count, false, most)?;
        }
        let int = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        let (max_running, group_max_running) =
            (int(policy.max_running), int(policy.group_max_running));
        let columns = |rate: Option<Rate>| {
            (
                int(rate.map_or(0, |r| r.limit)),
                rate.map_or(0, |r| i64::try_from(r.per.as_micros()).unwrap_or(i64::MAX)),
                int(rate.map_or(0, |r| r.burst)),
            )
        };
        let (limit, per_us, burst) = columns(policy.rate);
        let (g_limit, g_per_us, g_burst) = columns(policy.group_rate);
        tx.execute(
            &format!(
                "INSERT INTO jobq_policies ({POLICY_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (queue) DO UPDATE SET \
                 max_running = EXCLUDED.max_running, \
                 group_max_running = EXCLUDED.group_max_running, \
                 rate_limit = EXCLUDED.rate_limit, rate_per_us = EXCLUDED.rate_per_us, \
                 rate_burst = EXCLUDED.rate_burst, group_rate_limit = EXCLUDED.group_rate_limit, \
                 group_rate_per_us = EXCLUDED.group_rate_per_us, \
                 group_rate_burst = EXCLUDED.group_rate_burst"
            ),
            &[
                &queue,
                &max_running,
                &group_max_running,
                &limit,
                &per_us,
                &burst,
                &g_limit,
                &g_per_us,
                &g_burst,
            ],
        )
        .await
        .map_err(PgError::from)?;
    }
    // A new policy starts with full buckets.
    for table in ["jobq_rate_buckets", "jobq_group_buckets"] {
        tx.execute(&format!("DELETE FROM {table} WHERE queue = $1"), &[&queue])
            .await
            .map_err(PgError::from)?;
    }
    tx.execute("SELECT pg_notify($1, $2)", &[&listen::DUE, &queue])
        .await
        .map_err(PgError::from)?;
    tx.commit().await.map_err(PgError::from)?;
    pg.limits.set(queue, policy);
    Ok(())
}

/// Every queue's policy, sorted by bytes (as [`paused`]); also refreshes
/// this server's copy ([`Core::limits`]).
pub async fn policies(pg: &Core) -> Result<Vec<(String, QueuePolicy)>, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {POLICY_COLUMNS} FROM jobq_policies ORDER BY queue COLLATE \"C\""
        ))
        .await?;
    let rows = client.query(&stmt, &[]).await?;
    let all = rows
        .iter()
        .map(policy_of)
        .collect::<Result<Vec<_>, PgError>>()?;
    pg.limits.replace(&all);
    Ok(all)
}

/// The columns of `jobq_policies` that [`policy_of`] reads, in order.
pub const POLICY_COLUMNS: &str = "queue, max_running, group_max_running, \
     rate_limit, rate_per_us, rate_burst, group_rate_limit, group_rate_per_us, group_rate_burst";

/// A row of `jobq_policies` selected with [`POLICY_COLUMNS`].
pub fn policy_of(r: &tokio_postgres::Row) -> Result<(String, QueuePolicy), PgError> {
    let limit = |i: usize| -> Result<u32, PgError> {
        let v: i32 = r.try_get(i)?;
        u32::try_from(v).map_err(|_| PgError::Schema(format!("negative limit {v}")))
    };
    // A rate's three columns from `first` on.
    let rate = |first: usize| -> Result<Option<Rate>, PgError> {
        let per_us: i64 = r.try_get(first + 1)?;
        Ok(match limit(first)? {
            0 => None,
            n => Some(Rate {
                limit: n,
                per: std::time::Duration::from_micros(u64::try_from(per_us).unwrap_or(0)),
                burst: limit(first + 2)?,
            }),
        })
    };
    Ok((
        r.try_get(0)?,
        QueuePolicy {
            max_running: limit(1)?,
            group_max_running: limit(2)?,
            rate: rate(3)?,
            group_rate: rate(6)?,
        },
    ))
}
