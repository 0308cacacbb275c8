//! The embedded backend: job records in sled, indexes in memory,
//! durability by group commit.
//!
//! Records live in the `jobs` tree, keyed by the job id as a big-endian
//! `u64` (so a range scan is id order, which is enqueue order), valued by
//! the `Job` in postcard ([`record`]). A payload over
//! [`record::INLINE_MAX`] bytes lives apart, written once at enqueue (a
//! debounce's replace writes its new payload into the record, which the
//! job's next change moves apart) and read only to hand the job out
//! (take, get, list): a transition rewrites
//! a record of a few hundred bytes whatever the payload's size, and the
//! startup scan never reads payloads. Apart is the `payloads` tree under
//! the same key, or from `--payload-file-bytes` on a file of its own
//! ([`payload_files`], out of sled's page cache). A payload is written
//! (a file: durably) before its record and removed after it (a file: once
//! the removal is durable), so a crash in between leaves at most an
//! orphan payload, never a record without one. Job ids and lease ids both come from sled's
//! persistent id generator, which never repeats across restarts; 0 is never
//! issued.
//!
//! Every change follows one pattern, written once in [`Sled::apply_locked`]:
//! lock the state, load the record, call [`machine::apply`], write the
//! record, update the indexes, unlock. [`super::Jobs`] then waits for the
//! [`Flusher`]'s next round before it replies. The mutex is a std
//! one because it is never held across an `.await`, and what runs under it
//! is short: sled writes go to its in-memory log buffers (a full buffer may
//! be written out inline, and the id generator persists its counter once
//! per million ids). The fsync happens outside it, shared by every writer
//! of the round, so the mutex orders changes without serializing disk
//! waits.
//!
//! The indexes are rebuilt at startup from every record, unless the last
//! stop was clean: closing refuses every later write and waits until every
//! earlier one is durable; only then does it save the indexes to the file
//! `index.saved` (made durable first) and a random token, also written into
//! the file, to the `jobs` tree ([`SAVED_TOKEN_KEY`]). [`Sled::open`] reads
//! the file only if its token is the store's, and removes the token
//! (durably) before it returns: the file serves one start, and is never read
//! after a write it does not show. After a crash there is no token, and the
//! records are read. The token is a record no build can decode, so an older
//! build, which knows nothing of saved indexes, refuses to open a store a
//! newer one stopped cleanly rather than write changes those would miss.
//!
//! The parts: [`open`] (startup, the scan, saved indexes), [`write`] (the
//! write path), [`payload`] (where payloads live), [`result`] (where the
//! results of DONE jobs live), [`list`] (listing),
//! [`backend`] (the [`Backend`](super::Backend) impl), over [`record`] (the
//! encoding), [`index`] (the in-memory indexes) and [`flusher`] (group
//! commit).

mod backend;
mod error;
pub mod flusher;
mod index;
mod keys;
mod list;
mod open;
mod payload;
mod payload_files;
mod progress;
mod record;
mod result;
mod schedules;
mod write;

use std::{
    future::Future,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, MutexGuard, OnceLock, PoisonError,
    },
};

pub use error::SledError;
use flusher::Flusher;
use index::Index;
pub use open::SledOptions;
use payload_files::PayloadFiles;
use record::Payload;

use super::{jobs::Broken, Jobs, Remote};
use crate::{
    config::Config,
    error::{Error, Result},
    job::{Job, JobId},
};

/// DONE and FAILED jobs read per purge step, between which the mutex is
/// free (and the step's deletions are made durable): small, so that
/// neither the lock nor a commit round carries much of a purge at a time.
/// With 256, takes during a purge of 1M DONE jobs were delayed up to
/// 7–10 ms (p99 2.5–3.8); with 64, up to 6.6–7.3 ms (p99 1.1–1.3), and
/// the purge still ends within 10 s (the benchmarks chapter's table).
const PURGE_CHUNK: usize = 64;

/// The bytes a leaf of the `payloads` tree fills to before it splits on
/// count (vendored sled, change 6), where sled splits above 16 items. Its
/// payloads are 513 bytes to `--payload-file-bytes` (16 KiB), written once
/// and read on a take or a fetch, so fuller leaves cost only the rewrites
/// of the leaf that takes the inserts (each consolidation writes it whole),
/// and save pages: 1M payloads of 1 KiB made ~80,000 leaves of 13, each a
/// page table entry and a paged-out stub in memory. Payloads of 2 KiB and
/// up (16 fill 32 KiB) split as before. 32 KiB: 1M × 1 KiB peaked at 86 MiB
/// against 93 (64 KiB: 87.5, and enqueues of 1 KiB payloads at 18k/s
/// against 22–23k, from rewriting a bigger leaf). `jobs` keeps sled's
/// count: a heartbeat or take consolidates its record's leaf now and then,
/// and those bytes are bounded.
const PAYLOAD_LEAF_BYTES: usize = 32 * 1024;

/// The key, in the `jobs` tree, of the token of the indexes saved at a
/// clean stop: longer than a record's key, so after every id.
const SAVED_TOKEN_KEY: &[u8] = b"\xff\xff\xff\xff\xff\xff\xff\xffsaved-index-token";

/// The token's value begins like a record of a layout that no build reads
/// (the versioned-record marker, then version 255).
const SAVED_TOKEN_TAG: [u8; 2] = [0, 0xff];

/// The file the indexes are saved to at a clean stop, in the data folder.
const SAVED_FILE: &str = "index.saved";

/// Where the indexes came from at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuilt {
    /// Saved by the last (clean) stop.
    FromSaved,
    /// Read from every record (first start, or the last stop was not
    /// clean).
    FromRecords,
}

/// The store the server runs by default: [`Jobs`] over [`Sled`].
pub type SledStore = Jobs<Sled>;

/// The sled backend. See the module docs.
pub struct Sled {
    // Field order matters on drop: the flusher finishes its last round
    // before the database handle goes.
    flusher: Flusher,
    db: sled::Db,
    jobs: sled::Tree,
    /// Payloads by job id (see the module docs).
    payloads: sled::Tree,
    /// Big payloads, each in a file ([`payload_files`]).
    files: PayloadFiles,
    /// Results of DONE jobs by job id ([`result`]).
    results: sled::Tree,
    /// Jobs' latest progress by job id ([`progress`]).
    progress: sled::Tree,
    /// Paused queues: the queue name as key, an empty value.
    paused_tree: sled::Tree,
    /// Queue policies: the queue name as key, the policy in postcard.
    policies_tree: sled::Tree,
    /// Schedules by name ([`schedules`]).
    schedules_tree: sled::Tree,
    /// Their payloads, in chunks ([`schedules`]).
    schedule_payloads: sled::Tree,
    /// Where the indexes are saved at a clean stop ([`SAVED_FILE`]).
    saved_file: PathBuf,
    /// The indexes, and the paused queues (under the same lock, so a take
    /// never races a pause).
    state: Mutex<Index>,
    /// Closed: every write of a record is refused. Set and read under the
    /// lock of `state`.
    sealed: AtomicBool,
    rebuilt: Rebuilt,
    /// The store's signals, for a take that waits after it is written.
    remote: OnceLock<Remote>,
}

fn record_key(id: JobId) -> [u8; 8] {
    id.0.to_be_bytes()
}

/// Removes the entries of `ids` from a tree kept beside the records
/// (payloads, results, progress); removing one that is not there is a
/// look-up.
fn remove_keyed(tree: &sled::Tree, ids: impl IntoIterator<Item = JobId>) -> Result<()> {
    for id in ids {
        tree.remove(record_key(id)).map_err(SledError::from)?;
    }
    Ok(())
}

fn encode(job: &mut Job, payload: Payload) -> Result<Vec<u8>> {
    record::encode(job, payload)
        .map_err(|e| Error::Corrupt(format!("cannot encode job {}: {e}", job.id)))
}

fn decode(key: &[u8], value: &[u8]) -> Result<(Job, Payload)> {
    let (job, payload) = record::decode(value)
        .map_err(|e| Error::Corrupt(format!("undecodable record {key:?}: {e}")))?;
    if key != record_key(job.id) {
        return Err(Error::Corrupt(format!(
            "record {key:?} holds job {}",
            job.id
        )));
    }
    Ok((job, payload))
}

impl Jobs<Sled> {
    /// Opens (or creates) the sled store in `config.data`.
    ///
    /// # Errors
    /// See [`Sled::open`].
    pub fn open(config: &Config) -> Result<SledStore> {
        Ok(
            Jobs::new(Sled::open(&SledOptions::of(config))?, config.backoff())
                .deliver_before_durable(config.deliver_before_fsync)
                .max_paused_queues(config.max_paused_queues)
                .max_queue_policies(config.max_queue_policies),
        )
    }

    /// How many group-commit rounds (flush + fsync) have run; for tests and
    /// benchmarks.
    pub fn flush_rounds(&self) -> u64 {
        self.backend().flusher.rounds()
    }

    /// Tells `hook` the duration and size of every group-commit round.
    pub fn on_commit(&self, hook: flusher::RoundHook) {
        self.backend().flusher.on_round(hook);
    }
}

impl Sled {
    /// An error once the store is sealed: checked before anything is
    /// written (a payload apart) as well as by [`Sled::write`].
    fn check_open(&self) -> Result<()> {
        if self.sealed.load(Ordering::Relaxed) {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        // Every update of the index happens after its record is written and
        // cannot panic halfway, so a poisoned lock still guards a usable
        // index.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A fresh job id: never 0, never reused, increasing.
    fn next_id(&self) -> Result<u64> {
        loop {
            let id = self.db.generate_id().map_err(SledError::from)?;
            if id != 0 {
                return Ok(id);
            }
        }
    }

    /// A job's record, and where its payload is.
    fn load_record(&self, id: JobId) -> Result<(Job, Payload)> {
        let key = record_key(id);
        match self.jobs.get(key).map_err(SledError::from)? {
            Some(value) => decode(&key, &value),
            None => Err(Error::NotFound(id)),
        }
    }

    /// A job without its payload, unless the record still holds it inline:
    /// for changes and checks, which never look at the payload.
    fn load(&self, id: JobId) -> Result<Job> {
        Ok(self.load_record(id)?.0)
    }

    /// Loads a job the index says exists.
    fn load_indexed(&self, id: JobId) -> Result<(Job, Payload)> {
        self.load_record(id).map_err(|e| match e {
            Error::NotFound(id) => Error::Corrupt(format!("job {id} is indexed but has no record")),
            e => e,
        })
    }
}

impl Broken for Sled {
    fn broken(&self) -> impl Future<Output = String> + Send + 'static {
        self.flusher.broken()
    }
}

#[cfg(test)]
mod leaf_tests;
#[cfg(test)]
mod tests;
