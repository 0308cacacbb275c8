//! Schedules in the sled store: the `schedules` tree, keyed by name,
//! valued by the [`Schedule`] in JSON (self-describing, so a field added
//! later with `#[serde(default)]` reads old records). There are few of
//! them and the scheduler reads them all, so nothing is kept in memory.
//! Callers hold the store's mutex around read-modify-writes.

use std::time::SystemTime;

use super::SledError;
use crate::{
    error::{Error, Result},
    schedule::Schedule,
};

fn decode(key: &[u8], value: &[u8]) -> Result<Schedule> {
    serde_json::from_slice(value)
        .map_err(|e| Error::Corrupt(format!("undecodable schedule {key:?}: {e}")))
}

fn encode(schedule: &Schedule) -> Result<Vec<u8>> {
    serde_json::to_vec(schedule)
        .map_err(|e| Error::Corrupt(format!("cannot encode schedule {:?}: {e}", schedule.name)))
}

/// Stores `schedule`, replacing one of the same name.
pub(super) fn put(tree: &sled::Tree, schedule: &Schedule) -> Result<()> {
    tree.insert(schedule.name.as_bytes(), encode(schedule)?)
        .map_err(SledError::from)?;
    Ok(())
}

/// Deletes a schedule; returns it if there was one.
pub(super) fn delete(tree: &sled::Tree, name: &str) -> Result<Option<Schedule>> {
    match tree.remove(name.as_bytes()).map_err(SledError::from)? {
        Some(value) => decode(name.as_bytes(), &value).map(Some),
        None => Ok(None),
    }
}

/// Every schedule, by name (sled keeps keys sorted).
pub(super) fn all(tree: &sled::Tree) -> Result<Vec<Schedule>> {
    tree.iter()
        .map(|record| {
            let (key, value) = record.map_err(SledError::from)?;
            decode(&key, &value)
        })
        .collect()
}

/// One schedule by name.
pub(super) fn get(tree: &sled::Tree, name: &str) -> Result<Option<Schedule>> {
    match tree.get(name.as_bytes()).map_err(SledError::from)? {
        Some(value) => decode(name.as_bytes(), &value).map(Some),
        None => Ok(None),
    }
}

/// Moves the `last_tick` of the schedule `name` created at `created_at`
/// forward to `tick`; back only from a `last_tick` more than
/// [`crate::schedule::CLOCK_AHEAD_MARGIN`] past `now` (recorded under a
/// clock that ran ahead). Nothing for a schedule gone or replaced.
pub(super) fn ticked(
    tree: &sled::Tree,
    name: &str,
    created_at: SystemTime,
    tick: SystemTime,
    now: SystemTime,
) -> Result<()> {
    let Some(mut schedule) = get(tree, name)? else {
        return Ok(());
    };
    if schedule.created_at != created_at
        || schedule
            .last_tick
            .is_some_and(|last| last >= tick && last <= now + crate::schedule::CLOCK_AHEAD_MARGIN)
    {
        return Ok(());
    }
    schedule.last_tick = Some(tick);
    put(tree, &schedule)
}
