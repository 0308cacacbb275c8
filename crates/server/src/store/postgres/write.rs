//! The write path, written once: load the rows `FOR UPDATE`, call
//! [`machine::apply`], write each changed row with a fencing condition on
//! the lease it was loaded with, and sync its attempts, all in the
//! caller's transaction. The SQL only loads and stores; every rule stays
//! in the machine.
//!
//! Notifications (docs/src/design.md §5, notify after durable): a lease
//! that ended is notified inside the transaction only when another
//! server's stream held it (that server frees the stream's slot on
//! commit); this server's own streams hear of it from the store's own
//! signals. A queue that a change made due is returned to the caller,
//! which hands it to the notifier after the commit ([`super::listen`]):
//! a NOTIFY inside a transaction takes a database-wide lock from its
//! commit until the end of its WAL flush, so notifying transactions
//! commit one at a time.

use std::{
    collections::{BTreeSet, HashMap},
    time::SystemTime,
};

use deadpool_postgres::ClientWrapper;
use futures::{future::try_join_all, TryFutureExt};
use tokio_postgres::types::ToSql;

use super::{
    error::PgError,
    listen,
    row::{self, AttemptRow, JobRow, ATTEMPT_COLUMNS, ATTEMPT_SELECT, SET_COLUMNS},
    Core,
};
use crate::{
    error::{Error, Result},
    job::{Job, JobId, Outcome, Status},
    machine::{self, Event, TransitionError},
    store::{Change, LeaseEnded},
};

/// A job as loaded, with the server whose stream holds its lease.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub job: Job,
    pub server: Option<String>,
}

/// One change to write: the job before and after, and the lease holder's
/// server before and afterwards.
pub struct Write {
    pub change: Change,
    pub server: Option<String>,
    pub before: Option<String>,
}

/// Loads the jobs (with history) whose rows the caller selected with
/// [`COLUMNS`] then `lease_server`.
pub async fn with_history(
    tx: &ClientWrapper,
    rows: Vec<tokio_postgres::Row>,
) -> Result<Vec<Loaded>, PgError> {
    let mut loaded = Vec::with_capacity(rows.len());
    for row in &rows {
        loaded.push(Loaded {
            job: row::job_of(row)?,
            server: row.try_get(row::AFTER_COLUMNS)?,
        });
    }
    if loaded.is_empty() {
        return Ok(loaded);
    }
    let ids: Vec<i64> = loaded.iter().map(|l| row::to_db(l.job.id.0)).collect();
    let stmt = tx.prepare_cached(ATTEMPT_SELECT).await?;
    let attempts = tx.query(&stmt, &[&ids]).await?;
    let mut by_job: HashMap<JobId, Vec<_>> = HashMap::new();
    for a in &attempts {
        let (id, attempt) = row::attempt_of(a)?;
        by_job.entry(id).or_default().push(attempt);
    }
    for l in &mut loaded {
        l.job.history = by_job.remove(&l.job.id).unwrap_or_default();
    }
    Ok(loaded)
}

/// Loads and locks the jobs in `ids`, in id order (so two transactions
/// never wait on each other in a cycle).
pub async fn lock(tx: &ClientWrapper, ids: &BTreeSet<JobId>) -> Result<Vec<Loaded>, PgError> {
    let ids: Vec<i64> = ids.iter().map(|id| row::to_db(id.0)).collect();
    let sql = format!(
        "SELECT {}, lease_server FROM jobq_jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        *row::CHANGE_COLUMNS
    );
    let stmt = tx.prepare_cached(&sql).await?;
    let rows = tx.query(&stmt, &[&ids]).await?;
    with_history(tx, rows).await
}

/// Whether a refused reclaim found the lease already reclaimed: another
/// server (or this one's reaper) got there first, and fencing refused
/// the second.
pub fn double_reclaim(job: &Job, event: &Event, err: &TransitionError) -> bool {
    let Event::Reclaim { lease_id, .. } = event else {
        return false;
    };
    matches!(
        err,
        TransitionError::StaleLease { .. } | TransitionError::NotAllowed { .. }
    ) && job.history.iter().any(|a| {
        a.lease_id == *lease_id
            && matches!(
                a.outcome,
                Some(Outcome::LeaseExpired | Outcome::WorkerDisconnected | Outcome::Revoked)
            )
    })
}

/// Applies `events` in order to the loaded jobs (a job named twice sees its
/// first change). Returns one result per event, the writes to make, and
/// how many reclaims were refused as doubles.
pub fn apply_all(
    loaded: Vec<Loaded>,
    events: Vec<(JobId, Event)>,
    now: SystemTime,
) -> (Vec<Result<Change>>, Vec<Write>, u64) {
    let mut current: HashMap<JobId, Loaded> = loaded.into_iter().map(|l| (l.job.id, l)).collect();
    let mut first: HashMap<JobId, (Job, Option<String>)> = HashMap::new();
    let mut out = Vec::with_capacity(events.len());
    let mut doubles = 0;
    for (id, event) in events {
        let Some(entry) = current.get_mut(&id) else {
            out.push(Err(Error::NotFound(id)));
            continue;
        };
        let old = entry.job.clone();
        let refused = |err: &TransitionError| double_reclaim(&old, &event, err);
        match machine::apply(old.clone(), event.clone(), now) {
            Ok(new) => {
                let new = row::stored(new);
                first
                    .entry(id)
                    .or_insert_with(|| (old.clone(), entry.server.clone()));
                if new.lease_id() != old.lease_id() {
                    // Set by the take itself (see `take`); a lease that
                    // ended belongs to no server.
                    entry.server = None;
                }
                entry.job = new.clone();
                out.push(Ok(Change { old, new }));
            }
            Err(err) => {
                if refused(&err) {
                    doubles += 1;
                }
                out.push(Err(err.into()));
            }
        }
    }
    let writes = first
        .into_iter()
        .filter_map(|(id, (old, before))| {
            let latest = current.remove(&id)?;
            (latest.job != old).then_some(Write {
                change: Change {
                    old,
                    new: latest.job,
                },
                server: latest.server,
                before,
            })
        })
        .collect();
    (out, writes, doubles)
}

/// Writes changed jobs: each row fenced on the lease it was loaded with,
/// its attempts synced, and another server's lease-ended notifications
/// queued (sent by PostgreSQL on commit; see the module docs). Statements
/// are pipelined. Returns the queues the changes made due, for the
/// notifier once committed.
pub async fn write(
    tx: &ClientWrapper,
    pg: &Core,
    writes: &[Write],
) -> Result<Vec<String>, PgError> {
    let me = pg.me.as_str();
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    let update = tx
        .prepare_cached(&format!(
            "UPDATE jobq_jobs SET {SET_COLUMNS}, lease_server = $19 \
             WHERE id = $1 AND lease_id IS NOT DISTINCT FROM $20"
        ))
        .await?;
    let upsert = tx
        .prepare_cached(&format!(
            "INSERT INTO jobq_attempts ({ATTEMPT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (job_id, lease_id) DO UPDATE SET worker_id = EXCLUDED.worker_id, \
             started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at, \
             outcome = EXCLUDED.outcome, error = EXCLUDED.error"
        ))
        .await?;
    let delete = tx
        .prepare_cached("DELETE FROM jobq_attempts WHERE job_id = $1 AND lease_id = ANY($2)")
        .await?;
    // The results acks brought (an empty one is none), in the same
    // transaction as the ack.
    let results: Vec<(i64, &[u8])> = writes
        .iter()
        .filter_map(|w| {
            let result = w.change.new.result.as_deref()?;
            (!result.is_empty()).then(|| (row::to_db(w.change.new.id.0), result))
        })
        .collect();
    let store_result = if results.is_empty() {
        None
    } else {
        Some(
            tx.prepare_cached(
                "INSERT INTO jobq_results (job_id, result) VALUES ($1, $2) \
                 ON CONFLICT (job_id) DO UPDATE SET result = EXCLUDED.result",
            )
            .await?,
        )
    };

    let rows: Vec<(JobRow, Option<i64>, &Option<String>)> = writes
        .iter()
        .map(|w| {
            (
                JobRow::without_payload(&w.change.new),
                w.change.old.lease_id().map(|l| row::to_db(l.0)),
                &w.server,
            )
        })
        .collect();
    let mut attempts: Vec<AttemptRow> = Vec::new();
    let mut removed: Vec<(i64, Vec<i64>)> = Vec::new();
    let (mut channels, mut payloads) = (Vec::new(), Vec::new());
    let mut due: Vec<String> = Vec::new();
    for w in writes {
        let (old, new) = (&w.change.old, &w.change.new);
        for a in &new.history {
            if !old.history.contains(a) {
                attempts.push(AttemptRow::of(new.id, a));
            }
        }
        let gone: Vec<i64> = old
            .history
            .iter()
            .filter(|a| !new.history.iter().any(|b| b.lease_id == a.lease_id))
            .map(|a| row::to_db(a.lease_id.0))
            .collect();
        if !gone.is_empty() {
            removed.push((row::to_db(new.id.0), gone));
        }
        let elsewhere = w.before.as_deref().is_some_and(|s| s != me);
        if let (true, Some(ended)) = (elsewhere, LeaseEnded::of(old, new)) {
            channels.push(listen::LEASE_ENDED);
            payloads.push(listen::encode(me, &ended));
        }
        // As the store's own wake-ups (`Jobs::commit`): a job made PENDING,
        // or in a queue with a policy, any change of status (a slot freed,
        // a sequence's head gone).
        let freed = old.status != new.status && pg.limits.freed_by_changes(&new.queue);
        if (new.status == Status::Pending || freed) && !due.contains(&new.queue) {
            due.push(new.queue.clone());
        }
    }

    let updates = try_join_all(rows.iter().map(|(row, fence, server)| {
        let mut params = row.update_params();
        params.push(*server as &(dyn ToSql + Sync));
        params.push(fence as &(dyn ToSql + Sync));
        let update = &update;
        async move { tx.execute(update, &params).await }
    }));
    let deletes = try_join_all(removed.iter().map(|(id, leases)| {
        let delete = &delete;
        async move {
            let params: [&(dyn ToSql + Sync); 2] = [id, leases];
            tx.execute(delete, &params).await
        }
    }));
    let upserts = try_join_all(attempts.iter().map(|a| {
        let params = a.params();
        let upsert = &upsert;
        async move { tx.execute(upsert, &params).await }
    }));
    let stored = try_join_all(results.iter().map(|(id, result)| {
        let store_result = &store_result;
        async move {
            match store_result {
                Some(stmt) => tx.execute(stmt, &[id, result]).await,
                None => Ok(0),
            }
        }
    }));
    let notify = notify(tx, &channels, &payloads);
    let (updated, _, _, _, ()) = futures::try_join!(
        updates.map_err(PgError::from),
        deletes.map_err(PgError::from),
        upserts.map_err(PgError::from),
        stored.map_err(PgError::from),
        notify
    )?;
    if let Some(pos) = updated.iter().position(|&n| n != 1) {
        // Impossible under the row lock; a bug if it ever happens.
        return Err(PgError::Schema(format!(
            "job {} changed under its row lock (fencing refused the write)",
            writes[pos].change.new.id
        )));
    }
    Ok(due)
}

/// Queues notifications (deduplicated by PostgreSQL within a transaction).
pub async fn notify(
    tx: &ClientWrapper,
    channels: &[&str],
    payloads: &[String],
) -> Result<(), PgError> {
    if channels.is_empty() {
        return Ok(());
    }
    let stmt = tx
        .prepare_cached("SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS t(c, p)")
        .await?;
    tx.query(&stmt, &[&channels, &payloads]).await?;
    Ok(())
}
