//! The operator's writes: delete one job, pause and resume a queue. Each
//! is one short transaction; the rules stay in [`crate::machine`].

use std::collections::BTreeSet;

use super::{error::PgError, listen, row, write, Pg};
use crate::{
    error::{Error, Result},
    job::JobId,
    machine,
};

/// Deletes one job unless it is RUNNING, deciding on the row locked `FOR
/// UPDATE` (attempts go with it, `ON DELETE CASCADE`).
pub async fn delete(pg: &Pg, id: JobId) -> Result<()> {
    let mut client = pg.client().await.map_err(Error::from)?;
    let tx = client.transaction().await.map_err(PgError::from)?;
    let ids = BTreeSet::from([id]);
    let loaded = write::lock(&tx, &ids).await?;
    let job = &loaded.first().ok_or(Error::NotFound(id))?.job;
    machine::deletable(job)?;
    tx.execute("DELETE FROM jobq_jobs WHERE id = $1", &[&row::to_db(id.0)])
        .await
        .map_err(PgError::from)?;
    tx.commit().await.map_err(PgError::from)?;
    Ok(())
}

/// Pauses or resumes a queue (idempotent). A resume tells every server
/// (this one included, through its listener) that jobs may be due.
pub async fn set_paused(pg: &Pg, queue: &str, paused: bool) -> Result<(), PgError> {
    let mut client = pg.client().await?;
    let tx = client.transaction().await?;
    if paused {
        // A take locks jobq_paused (shared) before it reads it, and holds
        // the lock until it commits: this waits for the takes in flight
        // (their jobs leave before the pause returns), and a take that
        // starts meanwhile waits for this commit and then reads the pause. Without it, a
        // take that had read "not paused" just before could still hand a
        // job out after PauseQueue returned (DESIGN.md §1 rule 6).
        tx.batch_execute("LOCK TABLE jobq_paused IN ACCESS EXCLUSIVE MODE")
            .await?;
        tx.execute(
            "INSERT INTO jobq_paused (queue) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&queue],
        )
        .await?;
    } else {
        tx.execute("DELETE FROM jobq_paused WHERE queue = $1", &[&queue])
            .await?;
        tx.execute("SELECT pg_notify($1, $2)", &[&listen::DUE, &queue])
            .await?;
    }
    tx.commit().await?;
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
