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
use crate::policy::{Bucket, QueuePolicy};

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

    /// Whether a change of status of one of `queue`'s jobs may let a held
    /// job go: its policy limits running jobs or groups (a rate limit frees
    /// nothing; its tokens come back with time).
    pub fn freed_by_changes(&self, queue: &str) -> bool {
        self.get(queue)
            .is_some_and(|p| p.max_running > 0 || p.group_max_running > 0 || p.group_rate.is_some())
    }

    /// A queue's policy, as last read.
    pub fn get(&self, queue: &str) -> Option<QueuePolicy> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(queue)
            .copied()
    }

    /// Records one queue's policy (empty: none). A take records the
    /// policies it read: a read lock when nothing changed.
    pub fn set(&self, queue: &str, policy: QueuePolicy) {
        if self.get(queue).unwrap_or_default() == policy {
            return;
        }
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

/// Of the due PENDING jobs of `$1` (at most `$3`), how many `$2`
/// (`group_max_running`) holds back, and how many it does not.
/// Of the due PENDING jobs of `$1` (at most `$3`): how many `$2`
/// (`group_max_running`) holds back, how many a group rate out of tokens
/// (`$4` a second, a bucket of `$5`) holds back, and how many neither.
const HELD: &str = "SELECT count(*) FILTER (WHERE held), count(*) FILTER (WHERE dry AND NOT held), \
       count(*) FILTER (WHERE NOT held AND NOT dry) FROM ( \
       SELECT (j.grp IS NOT NULL AND $2::int > 0 AND ( \
         (SELECT count(*) FROM jobq_jobs r WHERE r.queue = $1 AND r.grp = j.grp \
          AND r.status = 'running') >= $2::int \
         OR ($2::int = 1 AND EXISTS (SELECT 1 FROM jobq_jobs h WHERE h.queue = $1 \
           AND h.grp = j.grp AND h.id < j.id AND h.status IN ('pending', 'running'))))) AS held, \
         ($4::float8 IS NOT NULL AND j.grp IS NOT NULL AND EXISTS ( \
           SELECT 1 FROM jobq_group_buckets b WHERE b.queue = $1 AND b.grp = j.grp \
           AND least($5::float8, b.tokens + greatest(0, extract(epoch FROM (now() - b.at)))::float8 * $4) < 1)) \
         AS dry \
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
    let most = i64::try_from(crate::policy::HELD_COUNT_MOST).unwrap_or(i64::MAX);
    let (per_second, capacity) = match policy.group_rate {
        Some(r) => (Some(r.per_second()), r.capacity()),
        None => (None, 0.0),
    };
    let row = client
        .query_one(&stmt, &[&stats.queue, &k, &most, &per_second, &capacity])
        .await?;
    let count = |i: usize| -> Result<u64, PgError> {
        Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or(0))
    };
    stats.held_group_max_running = count(0)?;
    stats.held_group_rate = count(1)?;
    let others = count(2)?;
    if !policy.room(stats.running) {
        stats.held_max_running = others;
    } else if let Some(rate) = policy.rate {
        let stmt = client
            .prepare_cached("SELECT tokens, at, now() FROM jobq_rate_buckets WHERE queue = $1")
            .await?;
        if let Some(r) = client.query_opt(&stmt, &[&stats.queue]).await? {
            let bucket = Bucket {
                tokens: r.try_get(0)?,
                at: r.try_get(1)?,
            };
            if bucket.tokens(&rate, r.try_get(2)?) < 1.0 {
                stats.held_rate = others;
            }
        }
    }
    Ok(())
}

/// How long a waiter on `queues` whose take found due jobs held sleeps
/// before it looks again, when one of them has a rate limit: until the
/// queue's bucket has a token, and at least one token's interval of the
/// queue's or the groups' rate (a take that found none may have come just
/// before a token; one held by a group's bucket, or by another limit,
/// looks again at the rate's pace); `None` when none has a rate limit. On
/// the database's clock, as the takes spend them.
pub async fn token_wait(
    client: &impl deadpool_postgres::GenericClient,
    queues: &[String],
) -> Result<Option<Duration>, PgError> {
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {}, b.tokens, b.at, now() \
             FROM jobq_policies p LEFT JOIN jobq_rate_buckets b USING (queue) \
             WHERE p.queue = ANY($1) AND (p.rate_limit > 0 OR p.group_rate_limit > 0)",
            operator::POLICY_COLUMNS
                .split(", ")
                .map(|c| format!("p.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .await?;
    let interval =
        |rate: &crate::policy::Rate| Duration::from_secs_f64(1.0 / rate.per_second().max(1e-9));
    let mut wait: Option<Duration> = None;
    for r in client.query(&stmt, &[&queues]).await? {
        let (_, policy) = operator::policy_of(&r)?;
        let now: SystemTime = r.try_get(11)?;
        let mut this = RECHECK;
        if let Some(rate) = policy.rate {
            let until = match (r.try_get::<_, Option<f64>>(9)?, r.try_get(10)?) {
                (Some(tokens), Some(at)) => Bucket { tokens, at }
                    .next_token(&rate, now)
                    .duration_since(now)
                    .unwrap_or_default(),
                _ => Duration::ZERO,
            };
            this = this.min(until.max(interval(&rate)));
        }
        if let Some(rate) = policy.group_rate {
            this = this.min(interval(&rate));
        }
        wait = Some(wait.map_or(this, |w| w.min(this)));
    }
    Ok(wait)
}

/// Waits for the policy locks of `queues` (in key order, as every take
/// takes them: two takes never wait on each other in a cycle); returns the
/// time they were got (`clock_timestamp()`, or the caller's `now`).
pub async fn lock(
    tx: &Open,
    queues: &[&String],
    now: Option<SystemTime>,
) -> Result<SystemTime, PgError> {
    let mut keys: Vec<i32> = queues.iter().map(|q| operator::pause_lock_key(q)).collect();
    keys.sort_unstable();
    keys.dedup();
    let stmt = tx
        .prepare_cached(
            "SELECT count(pg_advisory_xact_lock($1, k)), coalesce($3::timestamptz, clock_timestamp()) \
             FROM unnest($2::int4[]) AS k",
        )
        .await?;
    let row = tx.query_one(&stmt, &[&POLICY_LOCK, &keys, &now]).await?;
    Ok(row.try_get(1)?)
}

/// A group's bucket's tokens at `$3` (`jobq_group_buckets` row `b`),
/// refilling at `$1` a second up to `$2`.
const GROUP_TOKENS: &str =
    "least($2::float8, b.tokens + greatest(0, extract(epoch FROM ($3::timestamptz - b.at)))::float8 * $1)";

/// The due jobs of `$1` at `$2` (or `now()`) in delivery order, but not
/// of the groups in `$3`, not the ids in `$4`, with `$5` only a group's
/// oldest open job, and with a group rate (`$6` a second, a bucket of
/// `$7`, counted at `$8`) not of a group out of tokens; the first one,
/// locked.
fn grouped_dequeue() -> String {
    let tokens = GROUP_TOKENS
        .replace("$1", "$6")
        .replace("$2", "$7")
        .replace("$3", "$8");
    format!(
        "SELECT {COLUMNS}, lease_server FROM jobq_jobs j WHERE status = 'pending' AND queue = $1 \
         AND run_at <= coalesce($2::timestamptz, now()) \
         AND (grp IS NULL OR grp <> ALL($3::text[])) AND id <> ALL($4::bigint[]) \
         AND (NOT $5::bool OR grp IS NULL OR NOT EXISTS ( \
           SELECT 1 FROM jobq_jobs h WHERE h.queue = $1 AND h.grp = j.grp AND h.id < j.id \
           AND h.status IN ('pending', 'running'))) \
         AND ($6::float8 IS NULL OR grp IS NULL OR NOT EXISTS ( \
           SELECT 1 FROM jobq_group_buckets b WHERE b.queue = $1 AND b.grp = j.grp \
           AND {tokens} < 1)) \
         ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED"
    )
}

/// Spends a token of group `$2` of queue `$1`: a bucket of `$3`, refilling
/// at `$5` a second, counted at `$4` (no row: full).
fn spend_group_token() -> String {
    let tokens = GROUP_TOKENS
        .replace("$1", "$5")
        .replace("$2", "$3")
        .replace("$3::timestamptz", "$4::timestamptz");
    format!(
        "INSERT INTO jobq_group_buckets AS b (queue, grp, tokens, at) \
         VALUES ($1, $2, $3::float8 - 1, $4) ON CONFLICT (queue, grp) DO UPDATE SET \
         tokens = greatest(0, {tokens} - 1), at = greatest(b.at, $4)"
    )
}

/// Takes (locks) up to `left` due jobs of `queue` that `policy` allows,
/// in delivery order; the caller holds the queue's policy lock. `plain`
/// is the statement of a queue without a group limit.
///
/// Also returns when the running jobs were counted, for a policy that
/// limits them: the take's stamp. Every change that freed a slot this
/// take fills committed before that count, so it was stamped (with its
/// transaction's start) before it; the lock's own time is not enough, as
/// a take whose next statement is slow (a loaded or cut connection)
/// counts after changes that began once it held the lock.
pub async fn dequeue(
    tx: &Open,
    queue: &str,
    policy: QueuePolicy,
    (at, caller): (SystemTime, Option<SystemTime>),
    left: i64,
    plain: &str,
) -> Result<(Vec<Row>, Option<SystemTime>), PgError> {
    let now = Some(at);
    let mut room = left;
    // Rate buckets are counted when the policy lock was got
    // (`clock_timestamp()`, not the transaction's start: a take that
    // waited for the lock spends the tokens that came back meanwhile), or
    // at the caller's time.
    let clock = if policy.rate.is_some() || policy.group_rate.is_some() {
        let stmt = tx
            .prepare_cached("SELECT coalesce($1::timestamptz, clock_timestamp())")
            .await?;
        tx.query_one(&stmt, &[&caller]).await?.try_get(0)?
    } else {
        at
    };
    // The queue's bucket (no row: full).
    let bucket = match policy.rate {
        Some(rate) => {
            let stmt = tx
                .prepare_cached("SELECT tokens, at FROM jobq_rate_buckets WHERE queue = $1")
                .await?;
            let bucket = match tx.query_opt(&stmt, &[&queue]).await? {
                Some(r) => Bucket {
                    tokens: r.try_get(0)?,
                    at: r.try_get(1)?,
                },
                None => Bucket::full(&rate, clock),
            };
            // Whole tokens only: f64 to i64 saturates.
            #[allow(clippy::cast_possible_truncation)]
            let whole = bucket.tokens(&rate, clock).floor() as i64;
            room = room.min(whole);
            Some((rate, bucket))
        }
        None => None,
    };
    let (rows, counted) =
        dequeue_within(tx, queue, policy, (now, caller, clock), room, plain).await?;
    if let (Some((rate, mut bucket)), false) = (bucket, rows.is_empty()) {
        #[allow(clippy::cast_precision_loss)]
        bucket.spend(&rate, rows.len() as f64, clock);
        let stmt = tx
            .prepare_cached(
                "INSERT INTO jobq_rate_buckets (queue, tokens, at) VALUES ($1, $2, $3) \
                 ON CONFLICT (queue) DO UPDATE SET tokens = EXCLUDED.tokens, at = EXCLUDED.at",
            )
            .await?;
        tx.execute(&stmt, &[&queue, &bucket.tokens, &bucket.at])
            .await?;
    }
    Ok((rows, counted))
}

/// The RUNNING jobs of `$1`: when they were counted (`$2`, or
/// `clock_timestamp()`, read after the statement's snapshot), how many,
/// and how many of each group.
const RUNNING: &str = "SELECT coalesce($2::timestamptz, clock_timestamp()), \
       coalesce(sum(n), 0)::int8, \
       coalesce(array_agg(grp) FILTER (WHERE grp IS NOT NULL), '{}'), \
       coalesce(array_agg(n) FILTER (WHERE grp IS NOT NULL), '{}') \
       FROM (SELECT grp, count(*) AS n FROM jobq_jobs WHERE queue = $1 AND status = 'running' \
             GROUP BY grp) g";

/// [`dequeue`] within `left` takes of the rate limit: its running limits.
/// The running jobs are counted in one statement (one snapshot), so one
/// stamp is true of every count.
async fn dequeue_within(
    tx: &Open,
    queue: &str,
    policy: QueuePolicy,
    (now, caller, clock): (Option<SystemTime>, Option<SystemTime>, SystemTime),
    left: i64,
    plain: &str,
) -> Result<(Vec<Row>, Option<SystemTime>), PgError> {
    let mut room = left;
    let k = i64::from(policy.group_max_running);
    let mut running: HashMap<String, i64> = HashMap::new();
    let mut counted = None;
    if policy.max_running > 0 || k > 0 {
        let stmt = tx.prepare_cached(RUNNING).await?;
        let row = tx.query_one(&stmt, &[&queue, &caller]).await?;
        counted = Some(row.try_get::<_, SystemTime>(0)?);
        if policy.max_running > 0 {
            let all: i64 = row.try_get(1)?;
            room = room.min(i64::from(policy.max_running) - all);
        }
        let groups: Vec<String> = row.try_get(2)?;
        let counts: Vec<i64> = row.try_get(3)?;
        running = groups.into_iter().zip(counts).collect();
    }
    if room <= 0 {
        return Ok((Vec::new(), counted));
    }
    if k == 0 && policy.group_rate.is_none() {
        let stmt = tx.prepare_cached(plain).await?;
        return Ok((tx.query(&stmt, &[&queue, &now, &room]).await?, counted));
    }
    let (per_second, capacity) = match policy.group_rate {
        Some(r) => (Some(r.per_second()), r.capacity()),
        None => (None, 0.0),
    };
    let spend = tx.prepare_cached(&spend_group_token()).await?;
    let stmt = tx.prepare_cached(&grouped_dequeue()).await?;
    let sequence = k == 1;
    let mut taken: Vec<i64> = Vec::new();
    let mut rows = Vec::new();
    while i64::try_from(rows.len()).unwrap_or(i64::MAX) < room {
        let full: Vec<&str> = running
            .iter()
            .filter(|&(_, &n)| k > 0 && n >= k)
            .map(|(g, _)| g.as_str())
            .collect();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
            &queue,
            &now,
            &full,
            &taken,
            &sequence,
            &per_second,
            &capacity,
            &clock,
        ];
        let Some(row) = tx.query_opt(&stmt, &params).await? else {
            break;
        };
        taken.push(row.try_get(0)?);
        if let Some(group) = row.try_get::<_, Option<String>>(19)? {
            if let Some(rate) = per_second {
                // Seen by this transaction's next dequeue.
                tx.execute(&spend, &[&queue, &group, &capacity, &clock, &rate])
                    .await?;
            }
            *running.entry(group).or_default() += 1;
        }
        rows.push(row);
    }
    Ok((rows, counted))
}
