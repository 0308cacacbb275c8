//! Schedules in the sled store: the `schedules` tree, keyed by name,
//! valued by the [`Schedule`] in JSON (self-describing, so a field added
//! later with `#[serde(default)]` reads old records), without its payload,
//! which lies in the `schedule_payloads` tree in chunks of at most
//! [`CHUNK`] bytes. There are few schedules and the scheduler reads them
//! all, so nothing is kept in memory. Callers hold the store's mutex
//! around read-modify-writes.
//!
//! Why chunks: sled 0.34 writes a value (or a node) of more than a quarter
//! of a log segment (~128 KiB) to a file of its own under `blobs/`, and
//! removes a replaced one only once the log segment that holds the
//! replacing write fills up; it keeps that removal in memory, so a restart
//! forgets it and the file stays for good. A schedule write logs a few
//! dozen bytes besides its blob, so the segment took thousands of writes
//! to fill: a schedule with a 100 KB payload (385 KB of JSON) left a blob
//! behind on every replace or delete. Chunks keep every value, and every
//! leaf (which splits past 64 KiB once it holds 8 items), under that size.
//!
//! Order, so that a record never refers to chunks the log may not have
//! (sled recovers a prefix of its log): a new payload's chunks are written
//! before the record that refers to them, and the chunks of the payload a
//! record replaces or deletes are removed after it, in the same commit
//! round. A crash in between leaves chunks no record refers to, which
//! [`collect`] removes at startup; never a record without its payload.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::SledError;
use crate::{
    error::{Error, Result},
    schedule::Schedule,
};

/// Most bytes of one chunk of a payload.
const CHUNK: usize = 8 * 1024;

/// A schedule as its record holds it: the payload is in the
/// `schedule_payloads` tree when `apart` says so (a record written before
/// chunks holds it inline, and reads as such).
#[derive(Serialize, Deserialize)]
struct Record {
    #[serde(flatten)]
    schedule: Schedule,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    apart: Option<Apart>,
}

/// Where a payload's chunks are: keys `id ++ chunk index` (big-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Apart {
    id: u64,
    len: u64,
}

fn chunk_key(id: u64, index: u32) -> [u8; 12] {
    let mut key = [0; 12];
    key[..8].copy_from_slice(&id.to_be_bytes());
    key[8..].copy_from_slice(&index.to_be_bytes());
    key
}

fn decode(key: &[u8], value: &[u8]) -> Result<Record> {
    serde_json::from_slice(value)
        .map_err(|e| Error::Corrupt(format!("undecodable schedule {key:?}: {e}")))
}

fn encode(record: &Record) -> Result<Vec<u8>> {
    serde_json::to_vec(record).map_err(|e| {
        Error::Corrupt(format!(
            "cannot encode schedule {:?}: {e}",
            record.schedule.name
        ))
    })
}

/// The record of `name`, its payload not read in.
fn record(tree: &sled::Tree, name: &str) -> Result<Option<Record>> {
    match tree.get(name.as_bytes()).map_err(SledError::from)? {
        Some(value) => decode(name.as_bytes(), &value).map(Some),
        None => Ok(None),
    }
}

/// The schedule of a record, with its payload read from its chunks.
fn filled(chunks: &sled::Tree, record: Record) -> Result<Schedule> {
    let Record {
        mut schedule,
        apart,
    } = record;
    let Some(apart) = apart else {
        return Ok(schedule);
    };
    let mut payload = Vec::with_capacity(usize::try_from(apart.len).unwrap_or(0));
    for chunk in chunks.scan_prefix(apart.id.to_be_bytes()) {
        let (_, bytes) = chunk.map_err(SledError::from)?;
        payload.extend_from_slice(&bytes);
    }
    if payload.len() as u64 != apart.len {
        return Err(Error::Corrupt(format!(
            "schedule {:?} has a payload of {} bytes, its record says {}",
            schedule.name,
            payload.len(),
            apart.len
        )));
    }
    schedule.payload = payload;
    Ok(schedule)
}

/// Removes the chunks of payload `id`.
fn remove_chunks(chunks: &sled::Tree, id: u64) -> Result<()> {
    for chunk in chunks.scan_prefix(id.to_be_bytes()).keys() {
        let key = chunk.map_err(SledError::from)?;
        chunks.remove(key).map_err(SledError::from)?;
    }
    Ok(())
}

/// Stores `schedule`, replacing one of the same name, and frees the
/// payload of the one it replaces. A non-empty payload goes to chunks
/// under `id`, which no other payload has.
pub(super) fn put(
    tree: &sled::Tree,
    chunks: &sled::Tree,
    schedule: &Schedule,
    id: impl FnOnce() -> Result<u64>,
) -> Result<()> {
    let replaced = record(tree, &schedule.name)?.and_then(|r| r.apart);
    let apart = match schedule.payload.is_empty() {
        true => None,
        false => {
            let id = id()?;
            for (index, chunk) in schedule.payload.chunks(CHUNK).enumerate() {
                let index = u32::try_from(index).map_err(|_| {
                    Error::Corrupt(format!("schedule {:?}: payload too long", schedule.name))
                })?;
                chunks
                    .insert(chunk_key(id, index), chunk)
                    .map_err(SledError::from)?;
            }
            Some(Apart {
                id,
                len: schedule.payload.len() as u64,
            })
        }
    };
    let record = Record {
        schedule: Schedule {
            payload: Vec::new(),
            ..schedule.clone()
        },
        apart,
    };
    tree.insert(schedule.name.as_bytes(), encode(&record)?)
        .map_err(SledError::from)?;
    if let Some(old) = replaced {
        remove_chunks(chunks, old.id)?;
    }
    Ok(())
}

/// Deletes a schedule and frees its payload; returns it if there was one.
pub(super) fn delete(
    tree: &sled::Tree,
    chunks: &sled::Tree,
    name: &str,
) -> Result<Option<Schedule>> {
    let Some(record) = record(tree, name)? else {
        return Ok(None);
    };
    let apart = record.apart;
    let schedule = filled(chunks, record)?;
    tree.remove(name.as_bytes()).map_err(SledError::from)?;
    if let Some(apart) = apart {
        remove_chunks(chunks, apart.id)?;
    }
    Ok(Some(schedule))
}

/// Every schedule, by name (sled keeps keys sorted).
pub(super) fn all(tree: &sled::Tree, chunks: &sled::Tree) -> Result<Vec<Schedule>> {
    tree.iter()
        .map(|entry| {
            let (key, value) = entry.map_err(SledError::from)?;
            filled(chunks, decode(&key, &value)?)
        })
        .collect()
}

/// One schedule by name.
pub(super) fn get(tree: &sled::Tree, chunks: &sled::Tree, name: &str) -> Result<Option<Schedule>> {
    record(tree, name)?.map(|r| filled(chunks, r)).transpose()
}

/// Moves the `last_tick` of the schedule `name` created at `created_at`
/// forward to `tick`; back only from a `last_tick` more than
/// [`crate::schedule::CLOCK_AHEAD_MARGIN`] past `now` (recorded under a
/// clock that ran ahead). Nothing for a schedule gone or replaced. The
/// record alone is rewritten; its payload stays where it is.
pub(super) fn ticked(
    tree: &sled::Tree,
    name: &str,
    created_at: SystemTime,
    tick: SystemTime,
    now: SystemTime,
) -> Result<()> {
    let Some(mut record) = record(tree, name)? else {
        return Ok(());
    };
    let schedule = &mut record.schedule;
    if schedule.created_at != created_at
        || schedule
            .last_tick
            .is_some_and(|last| last >= tick && last <= now + crate::schedule::CLOCK_AHEAD_MARGIN)
    {
        return Ok(());
    }
    schedule.last_tick = Some(tick);
    tree.insert(name.as_bytes(), encode(&record)?)
        .map_err(SledError::from)?;
    Ok(())
}

/// Removes the chunks no record refers to: those of a put or delete cut
/// short by a crash. Run at startup, before any write. Returns how many
/// payloads it removed.
pub(super) fn collect(tree: &sled::Tree, chunks: &sled::Tree) -> Result<u64> {
    let mut live = std::collections::HashSet::new();
    for entry in tree.iter() {
        let (key, value) = entry.map_err(SledError::from)?;
        if let Some(apart) = decode(&key, &value)?.apart {
            live.insert(apart.id);
        }
    }
    let mut orphans = std::collections::BTreeSet::new();
    for key in chunks.iter().keys() {
        let key = key.map_err(SledError::from)?;
        let id = key
            .get(..8)
            .and_then(|k| <[u8; 8]>::try_from(k).ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| Error::Corrupt(format!("undecodable schedule payload key {key:?}")))?;
        if !live.contains(&id) {
            orphans.insert(id);
        }
    }
    for &id in &orphans {
        remove_chunks(chunks, id)?;
    }
    Ok(orphans.len() as u64)
}
