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

use std::{
    collections::{HashMap, HashSet},
    sync::LazyLock,
    time::SystemTime,
};

use super::{error::PgError, limited, operator, queries, row::COLUMNS, tx::Open, write, Core};
use crate::{machine::Event, policy::QueuePolicy, store::Change};

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

/// [`dequeue`] of up to `$3` jobs (in order: priority, then due order),
/// selecting `columns` of the jobs it locks.
pub fn dequeue_many(columns: &str) -> String {
    dequeue(columns)
        .replace("id LIMIT 1 FOR UPDATE", "id LIMIT $3 FOR UPDATE")
        .replace(") j LIMIT 1", ") j LIMIT $3")
}

/// [`dequeue_many`] of whole job rows, built once.
static DEQUEUE_ROW: LazyLock<String> =
    LazyLock::new(|| dequeue_many(&format!("{COLUMNS}, lease_server")));

/// [`DEQUEUE_ROW`] for the first queue of a take, which the same round
/// trip as the take's checks also asks: nothing when that queue is paused
/// or has a policy (read after the pause locks, as the paused set is; a
/// queue with a policy is taken from under its policy lock,
/// [`limited`]).
static DEQUEUE_FIRST: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT * FROM ({}) d WHERE NOT EXISTS (SELECT 1 FROM jobq_paused WHERE queue = $1) \
         AND NOT EXISTS (SELECT 1 FROM jobq_policies WHERE queue = $1)",
        *DEQUEUE_ROW
    )
});

/// Takes the first due job, as [`crate::store::Backend::take`], in a
/// transaction of its own.
pub async fn take(
    pg: &Core,
    queues: &[String],
    take: Event,
    streamed: bool,
    now: SystemTime,
) -> Result<Option<Change>, PgError> {
    let (mut changes, _) = take_many(pg, queues, vec![take], streamed, now).await?;
    Ok(changes.pop())
}

/// Takes up to one due job per event of `takes`, in one transaction: the
/// changes, in the order of `takes` (fewer when fewer jobs were due), and,
/// when fewer, the queues' next due time as read in the transaction (on
/// this server's clock).
///
/// Round trips: the `BEGIN`, the checks and the first queue's dequeue
/// together (pipelined, one), the jobs' history (one), their writes (one),
/// the `COMMIT` (one); each further queue looked at costs one more.
pub async fn take_many(
    pg: &Core,
    queues: &[String],
    takes: Vec<Event>,
    streamed: bool,
    now: SystemTime,
) -> Result<(Vec<Change>, Option<SystemTime>), PgError> {
    // Never closed: only dropped with the store.
    let _permit = pg
        .takes
        .acquire()
        .await
        .map_err(|_| PgError::Raced("the store is closing".into()))?;
    let tx = Open::new(pg.client().await?);
    match take_in(pg, &tx, queues, takes, streamed, now).await {
        Ok(taken) => {
            tx.commit().await?;
            Ok(taken)
        }
        Err(err) => {
            tx.rollback().await;
            Err(err)
        }
    }
}

async fn take_in(
    pg: &Core,
    tx: &Open,
    queues: &[String],
    takes: Vec<Event>,
    streamed: bool,
    now: SystemTime,
) -> Result<(Vec<Change>, Option<SystemTime>), PgError> {
    let sync_off = async {
        tx.batch_execute("SET LOCAL synchronous_commit = off")
            .await
            .map_err(PgError::from)
    };
    let db_now = queries::now(tx.client(), pg.now_param(now));
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
    let policies = async {
        let stmt = tx
            .prepare_cached(&format!(
                "SELECT {} FROM jobq_policies WHERE queue = ANY($1)",
                operator::POLICY_COLUMNS
            ))
            .await?;
        let rows = tx.query(&stmt, &[&queues]).await?;
        rows.iter()
            .map(operator::policy_of)
            .collect::<Result<HashMap<String, QueuePolicy>, PgError>>()
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
    let now_param = pg.now_param(now);
    let wanted = i64::try_from(takes.len()).unwrap_or(i64::MAX);
    // The first queue's dequeue, in the same round trip (last, so after
    // the pause locks). With the caller's clock (tests) the dequeue needs
    // the `now` read first, so it waits for the loop below.
    let first = async {
        let Some(queue) = queues.first().filter(|_| now_param.is_none()) else {
            return Ok(None);
        };
        let stmt = tx.prepare_cached(&DEQUEUE_FIRST).await?;
        let rows = tx.query(&stmt, &[queue, &now_param, &wanted]).await?;
        Ok::<_, PgError>(Some(rows))
    };
    let (_, _, mut now, _, paused, policies, registered, first) = futures::try_join!(
        tx.begin(),
        sync_off,
        db_now,
        locked,
        paused,
        policies,
        registered,
        first
    )?;
    if !registered {
        return Err(PgError::Unregistered);
    }
    let now_param = pg.now_param(now);
    for queue in queues {
        let policy = policies.get(queue).copied().unwrap_or_default();
        pg.limits.set(queue, policy);
    }
    let open: Vec<&String> = queues.iter().filter(|q| !paused.contains(*q)).collect();
    let limited: Vec<&String> = open
        .iter()
        .copied()
        .filter(|q| policies.contains_key(*q))
        .collect();
    if !limited.is_empty() {
        // A take of a queue with a policy is made when it holds the lock,
        // and stamped when it counted the running jobs under it (on the
        // database's clock: not the transaction's start, which may precede
        // the change that freed its slot; see `limited::dequeue`). Never
        // earlier than the transaction's: the other queues' jobs were
        // found due at that time.
        now = now.max(limited::lock(tx, &limited, now_param).await?);
    }
    let mut first = first;
    let mut rows = Vec::new();
    for queue in open {
        let left = wanted - i64::try_from(rows.len()).unwrap_or(i64::MAX);
        if left <= 0 {
            break;
        }
        let found = match (first.take(), policies.get(queue)) {
            (_, Some(&policy)) => {
                let (found, counted) =
                    limited::dequeue(tx, queue, policy, (now, now_param), left, &DEQUEUE_ROW)
                        .await?;
                now = now.max(counted.unwrap_or(now));
                found
            }
            (Some(found), None) if Some(queue) == queues.first() => found,
            _ => {
                let stmt = tx.prepare_cached(&DEQUEUE_ROW).await?;
                tx.query(&stmt, &[queue, &now_param, &left]).await?
            }
        };
        rows.extend(found);
    }
    let short = rows.len() < takes.len();
    let loaded = write::with_history(tx, rows).await?;
    let ids: Vec<_> = loaded.iter().map(|l| l.job.id).collect();
    let events: Vec<_> = ids.into_iter().zip(takes).collect();
    let (results, mut writes, _) = write::apply_all(loaded, events, now);
    if streamed {
        for w in &mut writes {
            w.server = Some(pg.me.clone());
        }
    }
    // A short take also reads the next due time, in the same round trip.
    let next = async {
        if !short {
            return Ok(None);
        }
        queries::next_run_at_in(tx.client(), pg.clock, queues).await
    };
    let (_, next) = futures::try_join!(write::write(tx, pg, &writes), next)?;
    let changes = results
        .into_iter()
        .map(|r| {
            // The rows were due under the same `now`: a refusal is a bug.
            r.map_err(|e| PgError::Schema(format!("a due job refused its take: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((changes, next))
}
