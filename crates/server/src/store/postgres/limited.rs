//! Takes from queues with a policy (docs/src/shaping.md), and this
//! server's copy of which queues have one.
//!
//! A take reads the policies of its queues in the transaction that takes
//! (after the queues' pause locks, as the paused set is read), so a policy
//! set on any server holds on all of them. The queues with a policy are
//! then taken from one transaction at a time, over every server: each
//! such take holds the queue's policy lock (an exclusive advisory lock
//! until it commits), and counts the RUNNING jobs after it got the lock,
//! so it sees every take before it committed. Takes of queues without a
//! policy take no such lock and pay one more index probe (the policy's
//! absence).
//!
//! With `group_max_running`, a take reads the groups at their limit (from
//! the RUNNING jobs of the queue: as many rows as run) and takes one job
//! at a time, in the queue's order, skipping those groups; with 1 (a
//! sequence), a job is taken only if no older job of its group is PENDING
//! or RUNNING (one probe of `jobq_jobs_groups`). The cost of the skip
//! grows with the due jobs of the groups at their limit that precede the
//! first eligible one (sled's index keeps held jobs out of the way
//! instead).

use std::{
    collections::HashMap,
    sync::RwLock,
    time::{Duration, SystemTime},
};

use tokio_postgres::Row;

use super::{error::PgError, operator, row::COLUMNS, tx::Open};
use crate::policy::QueuePolicy;

/// The first key of the per-queue policy locks (the second is the pause
/// lock's key, [`operator::pause_lock_key`]): "jqpl" in ASCII.
pub const POLICY_LOCK: i32 = 0x6a71_706c;

/// How often a waiter on a queue with a policy that holds due jobs looks
/// again, at the least: a slot freed on another server wakes it sooner
/// (its wake-up), unless that server did not know of the policy yet.
pub const RECHECK: Duration = Duration::from_secs(1);

/// This server's copy of the queues with a policy: refreshed by every
/// heartbeat and every read of the policies, set by a policy change made
/// here. Only wake-ups and waits depend on it; takes read the table.
#[derive(Default)]
pub struct Limits(RwLock<HashMap<String, QueuePolicy>>);

impl Limits {
    /// Whether `queue` has a policy, as last read.
    pub fn limited(&self, queue: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(queue)
    }

    /// A queue's policy, as last read.
    pub fn get(&self, queue: &str) -> Option<QueuePolicy> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
            .copied()
    }

    /// Records one queue's policy (empty: none).
    pub fn set(&self, queue: &str, policy: QueuePolicy) {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        if policy.is_empty() {
            map.remove(queue);
        } else {
            map.insert(queue.to_owned(), policy);
        }
    }

    /// Replaces the copy with every policy, as read.
    pub fn replace(&self, all: &[(String, QueuePolicy)]) {
        let mut map = self.0.write().unwrap_or_else(|p| p.into_inner());
        *map = all.iter().cloned().collect();
    }
}

/// Most due jobs a Stats call looks at per queue with a policy to count
/// the held ones (each costs a probe or two).
pub const HELD_COUNT_MOST: i64 = 100_000;

/// Of the due PENDING jobs of `$1` (at most `$3`), how many `$2`
/// (`group_max_running`) holds back, and how many it does not.
const HELD: &str = "SELECT count(*) FILTER (WHERE held), count(*) FILTER (WHERE NOT held) FROM ( \
       SELECT (j.grp IS NOT NULL AND $2::int > 0 AND ( \
         (SELECT count(*) FROM jobq_jobs r WHERE r.queue = $1 AND r.grp = j.grp \
          AND r.status = 'running') >= $2::int \
         OR ($2::int = 1 AND EXISTS (SELECT 1 FROM jobq_jobs h WHERE h.queue = $1 \
           AND h.grp = j.grp AND h.id < j.id AND h.status IN ('pending', 'running'))))) AS held \
       FROM jobq_jobs j WHERE j.queue = $1 AND j.status = 'pending' AND j.run_at <= now() \
       LIMIT $3) c";

/// Fills in the held counts of `stats` (one queue's counts) under
/// `policy`.
pub async fn held(
    client: &impl deadpool_postgres::GenericClient,
    stats: &mut crate::store::QueueStats,
    policy: QueuePolicy,
) -> Result<(), PgError> {
    let stmt = client.prepare_cached(HELD).await?;
    let k = i32::try_from(policy.group_max_running).unwrap_or(i32::MAX);
    let row = client
        .query_one(&stmt, &[&stats.queue, &k, &HELD_COUNT_MOST])
        .await?;
    let (by_group, others): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    stats.held_group_max_running = u64::try_from(by_group).unwrap_or(0);
    if !policy.room(stats.running) {
        stats.held_max_running = u64::try_from(others).unwrap_or(0);
    }
    Ok(())
}

/// Waits for the policy locks of `queues` (in key order, as every take
/// takes them: two takes never wait on each other in a cycle).
pub async fn lock(tx: &Open, queues: &[&String]) -> Result<(), PgError> {
    let mut keys: Vec<i32> = queues.iter().map(|q| operator::pause_lock_key(q)).collect();
    keys.sort_unstable();
    keys.dedup();
    let stmt = tx
        .prepare_cached("SELECT count(pg_advisory_xact_lock($1, k)) FROM unnest($2::int4[]) AS k")
        .await?;
    tx.query_one(&stmt, &[&POLICY_LOCK, &keys]).await?;
    Ok(())
}

/// The due jobs of `$1` at `$2` (or `now()`) in delivery order, but not
/// of the groups in `$3`, not the ids in `$4`, and with `$5` only a
/// group's oldest open job; the first one, locked.
fn grouped_dequeue() -> String {
    format!(
        "SELECT {COLUMNS}, lease_server FROM jobq_jobs j WHERE status = 'pending' AND queue = $1 \
         AND run_at <= coalesce($2::timestamptz, now()) \
         AND (grp IS NULL OR grp <> ALL($3::text[])) AND id <> ALL($4::bigint[]) \
         AND (NOT $5::bool OR grp IS NULL OR NOT EXISTS ( \
           SELECT 1 FROM jobq_jobs h WHERE h.queue = $1 AND h.grp = j.grp AND h.id < j.id \
           AND h.status IN ('pending', 'running'))) \
         ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED"
    )
}

/// Takes (locks) up to `left` due jobs of `queue` that `policy` allows,
/// in delivery order; the caller holds the queue's policy lock. `plain`
/// is the statement of a queue without a group limit.
pub async fn dequeue(
    tx: &Open,
    queue: &str,
    policy: QueuePolicy,
    now: Option<SystemTime>,
    left: i64,
    plain: &str,
) -> Result<Vec<Row>, PgError> {
    let mut room = left;
    if policy.max_running > 0 {
        let stmt = tx
            .prepare_cached(
                "SELECT count(*) FROM jobq_jobs WHERE queue = $1 AND status = 'running'",
            )
            .await?;
        let running: i64 = tx.query_one(&stmt, &[&queue]).await?.try_get(0)?;
        room = room.min(i64::from(policy.max_running) - running);
    }
    if room <= 0 {
        return Ok(Vec::new());
    }
    let k = i64::from(policy.group_max_running);
    if k == 0 {
        let stmt = tx.prepare_cached(plain).await?;
        return Ok(tx.query(&stmt, &[&queue, &now, &room]).await?);
    }
    let stmt = tx
        .prepare_cached(
            "SELECT grp, count(*) FROM jobq_jobs WHERE queue = $1 AND status = 'running' \
             AND grp IS NOT NULL GROUP BY grp",
        )
        .await?;
    let mut running: HashMap<String, i64> = tx
        .query(&stmt, &[&queue])
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    let stmt = tx.prepare_cached(&grouped_dequeue()).await?;
    let sequence = k == 1;
    let mut taken: Vec<i64> = Vec::new();
    let mut rows = Vec::new();
    while i64::try_from(rows.len()).unwrap_or(i64::MAX) < room {
        let full: Vec<&str> = running
            .iter()
            .filter(|&(_, &n)| n >= k)
            .map(|(g, _)| g.as_str())
            .collect();
        let Some(row) = tx
            .query_opt(&stmt, &[&queue, &now, &full, &taken, &sequence])
            .await?
        else {
            break;
        };
        taken.push(row.try_get(0)?);
        if let Some(group) = row.try_get::<_, Option<String>>(19)? {
            *running.entry(group).or_default() += 1;
        }
        rows.push(row);
    }
    Ok(rows)
}
