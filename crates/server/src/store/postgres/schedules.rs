//! Schedules in PostgreSQL: the `jobq_schedules` table (migration 4), one
//! row per schedule, shared by every server of the store. `last_tick` only
//! moves forward (back only from a tick in the future, recorded under a
//! clock that ran ahead), so servers that enqueue the same tick (the job
//! key makes that one job) agree on it whatever order they write in.

use std::time::SystemTime;

use tokio_postgres::Row;

use super::{error::PgError, Pg};
use crate::schedule::Schedule;

const COLUMNS: &str =
    "name, queue, kind, payload, cron, timezone, max_attempts, created_at, last_tick";

fn schedule_of(row: &Row) -> Result<Schedule, PgError> {
    let max_attempts: i32 = row.try_get(6)?;
    Ok(Schedule {
        name: row.try_get(0)?,
        queue: row.try_get(1)?,
        kind: row.try_get(2)?,
        payload: row.try_get(3)?,
        cron: row.try_get(4)?,
        timezone: row.try_get(5)?,
        max_attempts: u32::try_from(max_attempts)
            .map_err(|_| PgError::Schema(format!("negative max_attempts {max_attempts}")))?,
        created_at: row.try_get(7)?,
        last_tick: row.try_get(8)?,
    })
}

/// Stores a schedule, replacing one of the same name.
pub async fn put(pg: &Pg, s: &Schedule) -> Result<(), PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(&format!(
            "INSERT INTO jobq_schedules ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (name) DO UPDATE SET queue = EXCLUDED.queue, kind = EXCLUDED.kind, \
             payload = EXCLUDED.payload, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, \
             max_attempts = EXCLUDED.max_attempts, created_at = EXCLUDED.created_at, \
             last_tick = EXCLUDED.last_tick"
        ))
        .await?;
    let max_attempts = i32::try_from(s.max_attempts).unwrap_or(i32::MAX);
    client
        .execute(
            &stmt,
            &[
                &s.name,
                &s.queue,
                &s.kind,
                &s.payload,
                &s.cron,
                &s.timezone,
                &max_attempts,
                &s.created_at,
                &s.last_tick,
            ],
        )
        .await?;
    Ok(())
}

/// Deletes a schedule; returns it if there was one.
pub async fn delete(pg: &Pg, name: &str) -> Result<Option<Schedule>, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(&format!(
            "DELETE FROM jobq_schedules WHERE name = $1 RETURNING {COLUMNS}"
        ))
        .await?;
    client
        .query_opt(&stmt, &[&name])
        .await?
        .as_ref()
        .map(schedule_of)
        .transpose()
}

/// Every schedule, by name.
pub async fn all(pg: &Pg) -> Result<Vec<Schedule>, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM jobq_schedules ORDER BY name"
        ))
        .await?;
    client
        .query(&stmt, &[])
        .await?
        .iter()
        .map(schedule_of)
        .collect()
}

/// One schedule by name.
pub async fn get(pg: &Pg, name: &str) -> Result<Option<Schedule>, PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM jobq_schedules WHERE name = $1"
        ))
        .await?;
    client
        .query_opt(&stmt, &[&name])
        .await?
        .as_ref()
        .map(schedule_of)
        .transpose()
}

/// Moves the `last_tick` of the schedule `name` created at `created_at`
/// forward to `tick`; back only from a `last_tick` further in the future
/// than [`crate::schedule::CLOCK_AHEAD_MARGIN`] (recorded under a clock
/// that ran ahead). Nothing for a schedule gone or replaced.
pub async fn ticked(
    pg: &Pg,
    name: &str,
    created_at: SystemTime,
    tick: SystemTime,
) -> Result<(), PgError> {
    let client = pg.client().await?;
    let stmt = client
        .prepare_cached(
            "UPDATE jobq_schedules SET last_tick = $2 \
             WHERE name = $1 AND created_at = $4 \
               AND (last_tick IS NULL OR last_tick < $2 \
                    OR last_tick > now() + make_interval(secs => $3))",
        )
        .await?;
    let margin = crate::schedule::CLOCK_AHEAD_MARGIN.as_secs_f64();
    client
        .execute(&stmt, &[&name, &tick, &margin, &created_at])
        .await?;
    Ok(())
}
