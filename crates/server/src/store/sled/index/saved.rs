//! The indexes as saved at a clean stop, so that the next start reads one
//! file instead of decoding every record (1M jobs: a fraction of a second
//! instead of seconds, and no record pulled through sled's page cache).
//!
//! The layout: a version byte, the token that ties the file to the store
//! that wrote it (see `Sled::close`), the CRC-32 of the rest, then the
//! indexes in postcard: per queue its name, its PENDING `(run_at, id)`
//! entries per priority, its keys and its per-status id bitmaps; the
//! RUNNING jobs' lease expiries; and the overall per-status id bitmaps (all
//! bitmaps in roaring's portable format). A queue's pending entries are
//! those of its jobs without a group; its grouped jobs are saved per
//! group (RUNNING count, PENDING entries), and are all eligible when read
//! (no policy is in force until the store applies the saved policies).
//! Paused queues are not in it: they have a tree of their own, read at
//! every start. Whether the saved indexes still match the records is the
//! sled backend's business: this module writes them and reads them back,
//! and refuses what another build, another token or damage left.

use std::{
    cmp::Reverse,
    collections::{BTreeSet, HashMap},
};

use roaring::RoaringTreemap;
use serde::{Deserialize, Serialize};

use super::{At, Entry, Groups, Index, PackedSet, QueueIndex};
use crate::job::JobId;

/// The layout [`Index::save`] writes; anything else is not read (a file
/// of layout 1, without the queues' id bitmaps, or of layout 2, without
/// groups, makes the start read every record once, as after a crash).
const VERSION: u8 = 3;

/// Version, token, CRC.
const HEADER: usize = 1 + 8 + 4;

/// What cannot be read back: a layout of another build, or damage.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SavedError {
    #[error("saved indexes of layout {0}, this build reads {VERSION}")]
    Version(u8),
    #[error("saved indexes of another stop (token {0}, the store's is {1})")]
    Stale(u64, u64),
    #[error("saved indexes fail their checksum")]
    Checksum,
    #[error("saved indexes do not decode: {0}")]
    Decode(#[from] postcard::Error),
    #[error("a saved id bitmap does not decode: {0}")]
    Bitmap(#[from] std::io::Error),
}

/// One priority's pending entries.
type PendingSet = (Reverse<i32>, PackedSet<(At, JobId)>);

/// One queue, as written (borrowed from the index).
#[derive(Serialize)]
struct QueueOut<'a> {
    name: &'a str,
    pending: Vec<(i32, &'a PackedSet<(At, JobId)>)>,
    keys: &'a HashMap<Box<str>, JobId>,
    by_status: [Vec<u8>; 4],
    groups: Vec<(&'a str, u64, Vec<Entry>)>,
}

/// One queue, as read.
#[derive(Deserialize)]
struct QueueIn {
    name: Box<str>,
    /// Each priority's entries in order (as a sorted set writes them).
    pending: Vec<(i32, Vec<(At, JobId)>)>,
    keys: HashMap<Box<str>, JobId>,
    by_status: [Vec<u8>; 4],
    groups: Vec<(String, u64, Vec<Entry>)>,
}

#[derive(Serialize)]
struct IndexOut<'a> {
    queues: Vec<QueueOut<'a>>,
    leases: &'a BTreeSet<(At, JobId)>,
    by_status: [Vec<u8>; 4],
}

#[derive(Deserialize)]
struct IndexIn {
    queues: Vec<QueueIn>,
    leases: Vec<(At, JobId)>,
    by_status: [Vec<u8>; 4],
}

impl Index {
    /// The indexes, paused queues left out, as one value tied to `token`.
    pub(crate) fn save(&self, token: u64) -> Result<Vec<u8>, SavedError> {
        // The pending sets of queues with groups, without the grouped jobs.
        let ungrouped: Vec<Option<Vec<PendingSet>>> = self
            .queues
            .iter()
            .map(|q| {
                if q.groups.is_empty() {
                    return None;
                }
                let grouped = q.groups.pending_ids();
                let sets = q
                    .pending
                    .iter()
                    .map(|(&p, set)| {
                        let kept = set.iter().filter(|(_, id)| !grouped.contains(id));
                        (p, kept.collect())
                    })
                    .collect();
                Some(sets)
            })
            .collect();
        let out = IndexOut {
            queues: self
                .queues
                .iter()
                .zip(&ungrouped)
                .map(|(q, ungrouped)| {
                    let pending = match ungrouped {
                        Some(sets) => sets.iter().map(|(p, set)| (p.0, set)).collect(),
                        None => q.pending.iter().map(|(p, set)| (p.0, set)).collect(),
                    };
                    Ok(QueueOut {
                        name: &q.name,
                        pending,
                        keys: &q.keys,
                        by_status: portable(&q.by_status)?,
                        groups: q.groups.saved(),
                    })
                })
                .collect::<Result<_, SavedError>>()?,
            leases: &self.leases,
            by_status: portable(&self.by_status)?,
        };
        let mut bytes = vec![0; HEADER];
        bytes[0] = VERSION;
        bytes[1..9].copy_from_slice(&token.to_be_bytes());
        let mut bytes = postcard::to_extend(&out, bytes)?;
        let crc = crc32fast::hash(&bytes[HEADER..]);
        bytes[9..HEADER].copy_from_slice(&crc.to_be_bytes());
        Ok(bytes)
    }

    /// Reads what [`Index::save`] wrote with `token`; no queue is paused.
    pub(crate) fn load(bytes: &[u8], token: u64) -> Result<Index, SavedError> {
        let (header, body) = bytes
            .split_first_chunk::<HEADER>()
            .ok_or(SavedError::Decode(
                postcard::Error::DeserializeUnexpectedEnd,
            ))?;
        let [version, rest @ ..] = header;
        if *version != VERSION {
            return Err(SavedError::Version(*version));
        }
        let (saved_token, crc) = rest.split_at(8);
        let saved_token = u64::from_be_bytes(saved_token.try_into().expect("8 bytes"));
        if saved_token != token {
            return Err(SavedError::Stale(saved_token, token));
        }
        if crc32fast::hash(body).to_be_bytes() != crc {
            return Err(SavedError::Checksum);
        }
        let saved: IndexIn = postcard::from_bytes(body)?;
        let mut index = Index {
            // From sorted input a B-tree is built packed, not grown by
            // splits: fuller nodes than the running server's.
            leases: saved.leases.into_iter().collect(),
            ..Index::default()
        };
        index.by_status = bitmaps(&saved.by_status)?;
        for q in saved.queues {
            index.by_name.insert(q.name.clone(), index.queues.len());
            let mut queue = QueueIndex {
                name: q.name,
                pending: q
                    .pending
                    .into_iter()
                    .map(|(p, entries)| (Reverse(p), entries.into_iter().collect()))
                    .collect(),
                keys: q.keys,
                by_status: bitmaps(&q.by_status)?,
                groups: Groups::from_saved(q.groups),
            };
            for (p, at, id) in queue.groups.eligible(Default::default()) {
                queue
                    .pending
                    .entry(Reverse(p))
                    .or_default()
                    .insert((at, id));
            }
            index.queues.push(queue);
        }
        Ok(index)
    }
}

/// Per-status id bitmaps in roaring's portable format.
fn portable(sets: &[RoaringTreemap; 4]) -> Result<[Vec<u8>; 4], SavedError> {
    let mut out: [Vec<u8>; 4] = Default::default();
    for (bytes, set) in out.iter_mut().zip(sets) {
        set.serialize_into(bytes)?;
    }
    Ok(out)
}

/// What [`portable`] wrote.
fn bitmaps(saved: &[Vec<u8>; 4]) -> Result<[RoaringTreemap; 4], SavedError> {
    let mut out: [RoaringTreemap; 4] = Default::default();
    for (set, bytes) in out.iter_mut().zip(saved) {
        *set = RoaringTreemap::deserialize_from(bytes.as_slice())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::{job::NewJob, machine};

    #[test]
    fn saved_indexes_read_back_equal_and_damage_is_an_error() {
        let mut index = Index::default();
        let at = |secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        for id in 1..=50u64 {
            let new = NewJob {
                queue: ["a", "b", "c"][id as usize % 3].into(),
                kind: "k".into(),
                payload: vec![],
                key: (id % 4 == 0).then(|| format!("key-{id}")),
                max_attempts: 3,
                delay: Duration::from_secs(id % 5),
                priority: (id % 3) as i32 - 1,
                metadata: Default::default(),
                group: (id % 2 == 0).then(|| format!("g{}", id % 5)),
                max_snoozes: crate::job::DEFAULT_MAX_SNOOZES,
                unique: Default::default(),
            };
            let mut job = machine::create(JobId(id), new, at(1_000));
            if id % 7 == 0 {
                job.status = crate::job::Status::Running;
            }
            index.insert(&job);
        }
        let saved = index.save(7).unwrap();
        assert_eq!(Index::load(&saved, 7).unwrap(), index);

        assert!(matches!(
            Index::load(&saved, 8),
            Err(SavedError::Stale(7, 8))
        ));
        let mut other = saved.clone();
        other[0] = VERSION + 1;
        assert!(matches!(Index::load(&other, 7), Err(SavedError::Version(v)) if v == VERSION + 1));
        let mut flipped = saved.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(
            Index::load(&flipped, 7),
            Err(SavedError::Checksum)
        ));
        assert!(Index::load(&saved[..saved.len() - 3], 7).is_err());
        assert!(Index::load(&[], 7).is_err());
    }
}
