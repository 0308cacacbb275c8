//! Enqueue: ids from the `jobq_job_ids` sequence, keys held once per queue
//! by the partial unique index `jobq_jobs_key`. An insert that meets a
//! retained job with its key (`ON CONFLICT DO NOTHING`, which waits for a
//! concurrent inserter of the same key to commit or roll back) returns
//! that job instead: concurrent enqueues of one key through any number of
//! servers make one job. An enqueue with other rules for its key
//! (docs/src/shaping.md, "Uniqueness") locks that job's row, and replaces
//! it or takes its key over (then inserts again) as
//! [`rules::key_conflict`] says, in the same transaction.

use std::{collections::HashMap, time::SystemTime};

use futures::future::join_all;

use super::{
    error::PgError,
    row::{self, JobRow, COLUMNS},
    tx::Open,
    write, Core,
};
use crate::{
    job::{JobId, NewJob, Uniqueness},
    machine::{self, Event},
    store::{rules, Change, Enqueued},
};

/// Adds the jobs of a batch whose keys are distinct, as
/// [`crate::store::Backend::insert`].
///
/// Two round trips: the ids and `now` (drawn outside the transaction, as a
/// sequence is anyway) go out with the `BEGIN`, then the inserts with the
/// `COMMIT` (a failed insert turns that `COMMIT` into a rollback). A batch
/// with a key costs a third: the `COMMIT` waits for the read of the jobs
/// that held keys already (one that was deleted meanwhile is
/// [`PgError::Raced`], nothing is committed, and a retry takes the freed
/// key).
pub async fn insert(
    pg: &Core,
    batch: Vec<NewJob>,
    now: SystemTime,
) -> Result<Vec<Enqueued>, PgError> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let tx = Open::new(pg.client().await?);
    let n = i64::try_from(batch.len()).unwrap_or(i64::MAX);
    let ids_stmt = tx
        .prepare_cached(
            "SELECT coalesce($1::timestamptz, now()), \
             array(SELECT nextval('jobq_job_ids') FROM generate_series(1, $2::bigint))",
        )
        .await?;
    let insert = tx
        .prepare_cached(&format!(
            "INSERT INTO jobq_jobs ({COLUMNS}) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20) \
             ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING"
        ))
        .await?;
    let now_param = pg.now_param(now);
    let head = async {
        tx.query_one(&ids_stmt, &[&now_param, &n])
            .await
            .map_err(PgError::from)
    };
    let (head, ()) = futures::try_join!(head, tx.begin())?;
    let now: SystemTime = head.try_get(0)?;
    let ids: Vec<i64> = head.try_get(1)?;
    let rules: Vec<Uniqueness> = batch.iter().map(|new| new.unique).collect();
    let jobs: Vec<_> = batch
        .into_iter()
        .zip(ids)
        .map(|(new, id)| row::stored(machine::create(JobId(row::from_db(id)), new, now)))
        .collect();
    let rows: Vec<JobRow> = jobs.iter().map(JobRow::of).collect();
    // Inserted in (queue, key) order, whatever the batch's order: each
    // insert holds its key in the unique index until the commit, so two
    // batches that share keys in different orders would otherwise wait on
    // each other (a deadlock, which fails every caller of both). The ids
    // were drawn in the batch's order above, so FIFO is unchanged.
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| (&jobs[a].queue, &jobs[a].key).cmp(&(&jobs[b].queue, &jobs[b].key)));
    let inserts = join_all(order.iter().map(|&i| {
        let params = rows[i].params();
        let insert = &insert;
        let tx = &tx;
        async move { tx.execute(insert, &params).await }
    }));
    // Without a key no insert can meet a job already there, so the COMMIT
    // goes with the inserts (sent after every one of them: a join polls
    // in order; every reply is awaited, whatever fails, and a failed
    // insert turns the COMMIT into a rollback). With a key, a job already
    // there is read before the commit, so that a read that fails (the job
    // was deleted meanwhile) leaves nothing committed, and the batch can
    // run again, each caller alone.
    let keyed = jobs.iter().any(|j| j.key.is_some());
    let commit = async {
        if keyed {
            return Ok(());
        }
        tx.client().batch_execute("COMMIT").await
    };
    let (counts, committed) = futures::join!(inserts, commit);
    let mut inserted = vec![0; rows.len()];
    for (&i, count) in order.iter().zip(counts) {
        inserted[i] = match count {
            Ok(count) => count,
            Err(err) => {
                if !keyed && committed.is_ok() {
                    // The COMMIT rolled the transaction back.
                    tx.done();
                } else if keyed {
                    tx.rollback().await;
                }
                return Err(err.into());
            }
        };
    }
    committed?;
    if !keyed {
        tx.done();
    }
    let existing_stmt = tx
        .prepare_cached(&format!(
            "SELECT {}, lease_server FROM jobq_jobs WHERE queue = $1 AND key = $2",
            *row::CHANGE_COLUMNS
        ))
        .await?;
    // The jobs holding keys that enqueues with other rules meet, locked in
    // (queue, key) order, as the inserts took the keys. (A take-over's
    // insert after a holder let its key go may still wait on another
    // batch that waits on this one: PostgreSQL ends one as a deadlock,
    // which the caller sees as UNAVAILABLE and retries.)
    let mut meet: Vec<usize> = (0..jobs.len())
        .filter(|&i| inserted[i] != 1 && !rules[i].is_default())
        .collect();
    meet.sort_by(|&a, &b| (&jobs[a].queue, &jobs[a].key).cmp(&(&jobs[b].queue, &jobs[b].key)));
    let mut met: HashMap<usize, Enqueued> = HashMap::new();
    for i in meet {
        match meet_holder(&tx, pg, &jobs[i], &rules[i], &rows[i], &insert, now).await {
            Ok(enqueued) => {
                met.insert(i, enqueued);
            }
            Err(err) => {
                tx.rollback().await;
                return Err(err);
            }
        }
    }
    let mut out = Vec::with_capacity(jobs.len());
    let mut queues: Vec<String> = Vec::new();
    for (i, (job, count)) in jobs.into_iter().zip(inserted).enumerate() {
        if count == 1 {
            if !queues.contains(&job.queue) {
                queues.push(job.queue.clone());
            }
            out.push(Enqueued::created(job));
            continue;
        }
        if let Some(enqueued) = met.remove(&i) {
            if (enqueued.created || enqueued.replaced) && !queues.contains(&enqueued.job.queue) {
                queues.push(enqueued.job.queue.clone());
            }
            out.push(enqueued);
            continue;
        }
        let rows = tx.query(&existing_stmt, &[&job.queue, &job.key]).await?;
        // Empty when the job that held the key was deleted (DeleteJob,
        // retention) between the insert and this read: the key is free
        // now, and a retry takes it.
        let existing = write::with_history(&tx, rows).await?.pop().ok_or_else(|| {
            PgError::Raced(format!(
                "the job that held key {:?} was deleted meanwhile",
                job.key
            ))
        });
        let existing = match existing {
            Ok(existing) => existing,
            Err(err) => {
                tx.rollback().await;
                return Err(err);
            }
        };
        out.push(Enqueued::existing(existing.job));
    }
    if keyed {
        tx.commit().await?;
    }
    pg.due(queues);
    Ok(out)
}

/// How many times an enqueue looks again for the job holding its key when
/// that job let the key go (to another enqueue that took it over, or by a
/// delete) while this one waited for its row.
const MEET_TRIES: usize = 3;

/// Meets the job that holds `job`'s key by `unique`'s rules, in the
/// enqueue's transaction: its row locked, it is returned as it is,
/// replaced, or loses its key before `job` (`row`) is inserted again.
async fn meet_holder(
    tx: &Open,
    pg: &Core,
    job: &crate::job::Job,
    unique: &Uniqueness,
    row: &JobRow,
    insert: &tokio_postgres::Statement,
    now: SystemTime,
) -> Result<Enqueued, PgError> {
    let locked = tx
        .prepare_cached(&format!(
            "SELECT {}, lease_server FROM jobq_jobs WHERE queue = $1 AND key = $2 FOR UPDATE",
            *row::CHANGE_COLUMNS
        ))
        .await?;
    let mut holder = None;
    for _ in 0..MEET_TRIES {
        let rows = tx.query(&locked, &[&job.queue, &job.key]).await?;
        if let Some(found) = write::with_history(tx, rows).await?.pop() {
            holder = Some(found);
            break;
        }
        // The row this statement waited for no longer has the key, and
        // what took it committed after the statement began: a new
        // statement sees it. The key may be free, too.
        if tx.execute(insert, &row.params()).await? == 1 {
            return Ok(Enqueued::created(job.clone()));
        }
    }
    let holder = holder.ok_or_else(|| {
        PgError::Raced(format!(
            "the job that held key {:?} changed hands {MEET_TRIES} times meanwhile",
            job.key
        ))
    })?;
    let delay = job.run_at.duration_since(now).unwrap_or_default();
    let conflict = rules::key_conflict(unique, &holder.job, now);
    let Some(event) = conflict.event(&job.payload, &job.metadata, delay) else {
        return Ok(Enqueued::existing(holder.job));
    };
    let replace = matches!(event, Event::Replace { .. });
    let new = machine::apply(holder.job.clone(), event, now)
        .map(row::stored)
        .map_err(|e| PgError::Raced(format!("the job that held key {:?}: {e}", job.key)))?;
    let change = Change {
        old: holder.job,
        new,
    };
    let server = holder.server;
    write::write(
        tx,
        pg,
        &[write::Write {
            change: change.clone(),
            server: server.clone(),
            before: server,
        }],
    )
    .await?;
    if replace {
        // The payload is the one column the write path never sets.
        let set_payload = tx
            .prepare_cached("UPDATE jobq_jobs SET payload = $2 WHERE id = $1")
            .await?;
        let id = row::to_db(change.new.id.0);
        tx.execute(&set_payload, &[&id, &change.new.payload])
            .await?;
        return Ok(Enqueued {
            job: change.new.clone(),
            created: false,
            replaced: true,
            changed: Some(change),
        });
    }
    if tx.execute(insert, &row.params()).await? != 1 {
        return Err(PgError::Raced(format!(
            "key {:?} was taken again meanwhile",
            job.key
        )));
    }
    Ok(Enqueued {
        changed: Some(change),
        ..Enqueued::created(job.clone())
    })
}
