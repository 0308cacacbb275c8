//! The one mapping between a [`Job`] and its rows: `jobq_jobs` and
//! `jobq_attempts`. Adding a field to `Job` or `Lease` is a change here
//! only: a field that queries filter or sort on gets a column (and a
//! migration); any other goes into [`Extra`], the `extra` JSONB column,
//! with `#[serde(default)]` so older rows still read.

use std::{
    sync::LazyLock,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use tokio_postgres::{types::ToSql, Row};

use super::error::PgError;
use crate::job::{
    Attempt, Job, JobId, Lease, LeaseId, Outcome, Progress, Status, DEFAULT_MAX_SNOOZES,
};

/// The columns of a job, in the order of [`JobRow::params`] (`$1`…`$20`).
pub const COLUMNS: &str = "id, queue, kind, payload, key, status, attempts, max_attempts, \
     enqueued_at, run_at, lease_id, lease_worker, lease_taken_at, lease_expires_at, \
     lease_duration_ns, finished_at, last_error, extra, priority, grp";

/// The index of a column selected right after [`COLUMNS`].
pub const AFTER_COLUMNS: usize = 20;

/// [`COLUMNS`] with an empty payload in the payload's place, for loads that
/// change or check a job: no change of status changes the payload, so only
/// a take (and get, list) reads it, and no UPDATE writes it.
pub static CHANGE_COLUMNS: LazyLock<String> =
    LazyLock::new(|| COLUMNS.replacen("payload", "''::bytea AS payload", 1));

/// `SET col = $n, …` for every column but the id and the payload, for an
/// UPDATE whose `$1` is the id and whose values are
/// [`JobRow::update_params`] (`$1`…`$18`).
pub const SET_COLUMNS: &str = "queue = $2, kind = $3, key = $4, status = $5, \
     attempts = $6, max_attempts = $7, enqueued_at = $8, run_at = $9, lease_id = $10, \
     lease_worker = $11, lease_taken_at = $12, lease_expires_at = $13, \
     lease_duration_ns = $14, finished_at = $15, last_error = $16, extra = $17, priority = $18";

/// The columns of an attempt, in the order of [`AttemptRow::params`].
pub const ATTEMPT_COLUMNS: &str =
    "job_id, lease_id, worker_id, started_at, ended_at, outcome, error";

/// Job fields kept in the `extra` JSONB column: those no query looks at.
#[derive(Debug, Serialize, Deserialize)]
struct Extra {
    /// `Job.metadata`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    metadata: crate::job::Metadata,
    /// `Lease.owner`: the token that took the current lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_owner: Option<String>,
    /// `Job.snoozes`.
    #[serde(default, skip_serializing_if = "is_zero")]
    snoozes: u32,
    /// `Job.max_snoozes`; a row without it (an SQL enqueue, or a row from
    /// before snooze counts) has the default.
    #[serde(
        default = "default_max_snoozes",
        skip_serializing_if = "is_default_max_snoozes"
    )]
    max_snoozes: u32,
    /// `Job.progress`: the latest report, which a heartbeat writes with the
    /// lease it extends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    progress: Option<StoredProgress>,
}

impl Default for Extra {
    fn default() -> Extra {
        Extra {
            metadata: Default::default(),
            lease_owner: None,
            snoozes: 0,
            max_snoozes: DEFAULT_MAX_SNOOZES,
            progress: None,
        }
    }
}

/// `Job.progress` in the `extra` column: its stamp in microseconds since
/// the epoch, as the database keeps time.
#[derive(Debug, Serialize, Deserialize)]
struct StoredProgress {
    percent: u32,
    message: String,
    reported_at_us: i64,
    /// The lease it was reported under, by its bits (as `lease_id` is).
    #[serde(default)]
    lease_id: i64,
}

impl From<&Progress> for StoredProgress {
    fn from(p: &Progress) -> StoredProgress {
        let us = p
            .reported_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        StoredProgress {
            percent: p.percent,
            message: p.message.clone(),
            reported_at_us: us,
            lease_id: to_db(p.lease_id.0),
        }
    }
}

impl From<StoredProgress> for Progress {
    fn from(p: StoredProgress) -> Progress {
        let us = u64::try_from(p.reported_at_us).unwrap_or(0);
        Progress {
            percent: p.percent,
            message: p.message,
            reported_at: UNIX_EPOCH + Duration::from_micros(us),
            lease_id: LeaseId(from_db(p.lease_id)),
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn default_max_snoozes() -> u32 {
    DEFAULT_MAX_SNOOZES
}

fn is_default_max_snoozes(n: &u32) -> bool {
    *n == DEFAULT_MAX_SNOOZES
}

/// A status as stored, back.
pub fn status_of(text: &str) -> Result<Status, PgError> {
    Status::from_label(text).ok_or_else(|| PgError::Schema(format!("unknown job status {text:?}")))
}

fn outcome_text(outcome: Outcome) -> &'static str {
    outcome.label()
}

fn outcome_of(text: &str) -> Result<Outcome, PgError> {
    Outcome::from_label(text).ok_or_else(|| PgError::Schema(format!("unknown outcome {text:?}")))
}

/// A u64 id in a bigint column: the same 64 bits.
pub fn to_db(id: u64) -> i64 {
    i64::from_ne_bytes(id.to_ne_bytes())
}

/// A bigint column back to its u64 id.
pub fn from_db(v: i64) -> u64 {
    u64::from_ne_bytes(v.to_ne_bytes())
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `t` cut to whole microseconds: what a `timestamptz` keeps.
fn micros(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => {
            UNIX_EPOCH + Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        }
        Err(_) => t,
    }
}

/// The job as the database will store it: times cut to microseconds, so
/// what a call returns equals what a later read returns.
pub fn stored(mut job: Job) -> Job {
    job.enqueued_at = micros(job.enqueued_at);
    job.run_at = micros(job.run_at);
    job.finished_at = job.finished_at.map(micros);
    if let Some(lease) = job.lease.as_mut() {
        lease.taken_at = micros(lease.taken_at);
        lease.expires_at = micros(lease.expires_at);
    }
    for a in &mut job.history {
        a.started_at = micros(a.started_at);
        a.ended_at = a.ended_at.map(micros);
    }
    job
}

/// A job's column values, owned, ready to bind.
pub struct JobRow {
    id: i64,
    queue: String,
    kind: String,
    payload: Vec<u8>,
    key: Option<String>,
    status: &'static str,
    attempts: i32,
    max_attempts: i32,
    enqueued_at: SystemTime,
    run_at: SystemTime,
    lease_id: Option<i64>,
    lease_worker: Option<String>,
    lease_taken_at: Option<SystemTime>,
    lease_expires_at: Option<SystemTime>,
    lease_duration_ns: Option<i64>,
    finished_at: Option<SystemTime>,
    last_error: Option<String>,
    extra: serde_json::Value,
    priority: i32,
    grp: Option<String>,
}

impl JobRow {
    /// The row of `job` (its history goes to [`AttemptRow`]s).
    pub fn of(job: &Job) -> JobRow {
        JobRow {
            payload: job.payload.clone(),
            ..JobRow::without_payload(job)
        }
    }

    /// The row of `job` for an UPDATE, which leaves the payload alone: no
    /// copy of it is made or sent.
    pub fn without_payload(job: &Job) -> JobRow {
        let lease = job.lease.as_ref();
        JobRow {
            id: to_db(job.id.0),
            queue: job.queue.clone(),
            kind: job.kind.clone(),
            payload: Vec::new(),
            key: job.key.clone(),
            status: job.status.label(),
            attempts: i32::try_from(job.attempts).unwrap_or(i32::MAX),
            max_attempts: i32::try_from(job.max_attempts).unwrap_or(i32::MAX),
            enqueued_at: job.enqueued_at,
            run_at: job.run_at,
            lease_id: lease.map(|l| to_db(l.id.0)),
            lease_worker: lease.map(|l| l.worker_id.clone()),
            lease_taken_at: lease.map(|l| l.taken_at),
            lease_expires_at: lease.map(|l| l.expires_at),
            lease_duration_ns: lease.map(|l| nanos(l.duration)),
            finished_at: job.finished_at,
            last_error: job.last_error.clone(),
            extra: serde_json::to_value(Extra {
                metadata: job.metadata.clone(),
                lease_owner: job.lease.as_ref().and_then(|l| l.owner.clone()),
                snoozes: job.snoozes,
                max_snoozes: job.max_snoozes,
                progress: job.progress.as_ref().map(StoredProgress::from),
            })
            .unwrap_or(serde_json::Value::Null),
            priority: job.priority,
            grp: job.group.clone(),
        }
    }

    /// The values for `$1`…`$20` in [`COLUMNS`] order.
    pub fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.id,
            &self.queue,
            &self.kind,
            &self.payload,
            &self.key,
            &self.status,
            &self.attempts,
            &self.max_attempts,
            &self.enqueued_at,
            &self.run_at,
            &self.lease_id,
            &self.lease_worker,
            &self.lease_taken_at,
            &self.lease_expires_at,
            &self.lease_duration_ns,
            &self.finished_at,
            &self.last_error,
            &self.extra,
            &self.priority,
            &self.grp,
        ]
    }

    /// The values for `$1`…`$18` of an UPDATE with [`SET_COLUMNS`]: those of
    /// [`JobRow::params`] but the payload (`$4` there) and the group (the
    /// last), which never change after enqueue.
    pub fn update_params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut params = self.params();
        params.pop();
        params.remove(3);
        params
    }
}

/// An attempt's column values, owned, ready to bind.
pub struct AttemptRow {
    job_id: i64,
    lease_id: i64,
    worker_id: String,
    started_at: SystemTime,
    ended_at: Option<SystemTime>,
    outcome: Option<&'static str>,
    error: Option<String>,
}

impl AttemptRow {
    /// The row of one attempt of job `id`.
    pub fn of(id: JobId, a: &Attempt) -> AttemptRow {
        AttemptRow {
            job_id: to_db(id.0),
            lease_id: to_db(a.lease_id.0),
            worker_id: a.worker_id.clone(),
            started_at: a.started_at,
            ended_at: a.ended_at,
            outcome: a.outcome.map(outcome_text),
            error: a.error.clone(),
        }
    }

    /// The values in [`ATTEMPT_COLUMNS`] order.
    pub fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.job_id,
            &self.lease_id,
            &self.worker_id,
            &self.started_at,
            &self.ended_at,
            &self.outcome,
            &self.error,
        ]
    }
}

/// A job from a row selected with [`COLUMNS`] (first, in order), without
/// its history.
pub fn job_of(row: &Row) -> Result<Job, PgError> {
    let get_u32 = |i: usize| -> Result<u32, PgError> {
        let v: i32 = row.try_get(i)?;
        u32::try_from(v).map_err(|_| PgError::Schema(format!("negative count {v}")))
    };
    let extra: serde_json::Value = row.try_get(17)?;
    let Extra {
        metadata,
        lease_owner,
        snoozes,
        max_snoozes,
        progress,
    } = serde_json::from_value(extra)
        .map_err(|e| PgError::Schema(format!("unreadable extra column: {e}")))?;
    let lease_id: Option<i64> = row.try_get(10)?;
    let lease = match lease_id {
        Some(id) => Some(Lease {
            id: LeaseId(from_db(id)),
            worker_id: row.try_get::<_, Option<String>>(11)?.unwrap_or_default(),
            taken_at: row
                .try_get::<_, Option<SystemTime>>(12)?
                .unwrap_or(UNIX_EPOCH),
            expires_at: row
                .try_get::<_, Option<SystemTime>>(13)?
                .unwrap_or(UNIX_EPOCH),
            duration: Duration::from_nanos(
                u64::try_from(row.try_get::<_, Option<i64>>(14)?.unwrap_or(0)).unwrap_or(0),
            ),
            owner: lease_owner,
        }),
        None => None,
    };
    Ok(Job {
        id: JobId(from_db(row.try_get(0)?)),
        queue: row.try_get(1)?,
        kind: row.try_get(2)?,
        payload: row.try_get(3)?,
        key: row.try_get(4)?,
        status: status_of(row.try_get(5)?)?,
        attempts: get_u32(6)?,
        max_attempts: get_u32(7)?,
        priority: row.try_get(18)?,
        enqueued_at: row.try_get(8)?,
        run_at: row.try_get(9)?,
        lease,
        finished_at: row.try_get(15)?,
        last_error: row.try_get(16)?,
        history: Vec::new(),
        metadata,
        group: row.try_get(19)?,
        snoozes,
        max_snoozes,
        result: None,
        progress: progress.map(Progress::from),
    })
}

/// An attempt from a row selected with `job_id` then [`ATTEMPT_COLUMNS`]
/// minus `job_id` (as [`ATTEMPT_SELECT`]); returns its job's id too.
pub fn attempt_of(row: &Row) -> Result<(JobId, Attempt), PgError> {
    let outcome: Option<String> = row.try_get(5)?;
    Ok((
        JobId(from_db(row.try_get(0)?)),
        Attempt {
            lease_id: LeaseId(from_db(row.try_get(1)?)),
            worker_id: row.try_get(2)?,
            started_at: row.try_get(3)?,
            ended_at: row.try_get(4)?,
            outcome: outcome.as_deref().map(outcome_of).transpose()?,
            error: row.try_get(6)?,
        },
    ))
}

/// Selects the attempts of the jobs in `$1` (bigint[]), in order.
pub const ATTEMPT_SELECT: &str = "SELECT job_id, lease_id, worker_id, started_at, ended_at, \
     outcome, error FROM jobq_attempts WHERE job_id = ANY($1) ORDER BY job_id, seq";
