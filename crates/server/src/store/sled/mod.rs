//! The embedded backend: job records in sled, indexes in memory,
//! durability by group commit.
//!
//! Records live in the `jobs` tree, keyed by the job id as a big-endian
//! `u64` (so a range scan is id order, which is enqueue order), valued by
//! the `Job` in postcard ([`record`]). A payload over
//! [`record::INLINE_MAX`] bytes lives apart, written once at enqueue and
//! read only to hand the job out (take, get, list): a transition rewrites
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

mod error;
pub mod flusher;
mod index;
mod payload_files;
mod record;
mod schedules;

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    future::Future,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, MutexGuard, OnceLock, PoisonError,
    },
    time::{Instant, SystemTime},
};

pub use error::SledError;
use flusher::Flusher;
use index::Index;
use payload_files::PayloadFiles;
use record::Payload;

use super::{
    jobs::Broken, rules::Retention, Backend, Change, Enqueued, Jobs, ListFilter, Page, QueueStats,
    Remote,
};
use crate::{
    config::Config,
    error::{Error, Result},
    job::{Job, JobId, LeaseId, NewJob, Status},
    machine::{self, Event},
    schedule::Schedule,
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
    /// Paused queues: the queue name as key, an empty value.
    paused_tree: sled::Tree,
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
        Ok(Jobs::new(Sled::open(config)?, config.backoff())
            .deliver_before_durable(config.deliver_before_fsync)
            .max_paused_queues(config.max_paused_queues))
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
    /// Opens (or creates) the database in `config.data` and rebuilds the
    /// in-memory indexes from the records.
    ///
    /// # Errors
    /// [`Error::Storage`] if sled cannot open the folder, [`Error::Corrupt`]
    /// if a record does not decode or the flusher cannot start.
    pub fn open(config: &Config) -> Result<Sled> {
        std::fs::create_dir_all(&config.data)
            .map_err(|e| Error::Corrupt(format!("cannot create {}: {e}", config.data.display())))?;
        let open = || {
            sled::Config::new()
                .path(&config.data)
                .cache_capacity(config.cache_bytes)
                // Our flusher makes every acknowledged write durable; sled's
                // own periodic fsync would only compete with it.
                .flush_every_ms(None)
                .mode(sled::Mode::HighThroughput)
                .open()
                .map_err(SledError::from)
        };
        let mut db = reopen(open)?;
        let mut jobs = db.open_tree("jobs").map_err(SledError::from)?;
        let saved_file = config.data.join(SAVED_FILE);
        let started = Instant::now();
        let (mut index, rebuilt) = match take_saved(&db, &jobs, &config.data, &saved_file)? {
            Some(index) => (index, Rebuilt::FromSaved),
            None => {
                let mut index = scan(&jobs)?;
                index.compact();
                if index.len() > 0 {
                    // The scan pulled every record through sled's page
                    // cache, which keeps far more than `cache_bytes` of it
                    // (1M jobs: ~60 MiB); a fresh handle starts empty.
                    drop(jobs);
                    drop(db);
                    db = reopen(open)?;
                    jobs = db.open_tree("jobs").map_err(SledError::from)?;
                }
                (index, Rebuilt::FromRecords)
            }
        };
        tracing::info!(jobs = index.len(), from = ?rebuilt, elapsed = ?started.elapsed(), "sled indexes ready");
        let payloads = db.open_tree("payloads").map_err(SledError::from)?;
        payloads.fill_leaves_to(PAYLOAD_LEAF_BYTES);
        // A payload small enough for the record stays in it.
        let file_min = usize::try_from(config.payload_file_bytes)
            .unwrap_or(usize::MAX)
            .max(record::INLINE_MAX + 1);
        let files = PayloadFiles::open(&config.data, file_min)?;
        let orphans = files.collect(|id| index.contains(id))?;
        if orphans > 0 {
            tracing::info!(
                orphans,
                "removed payload files of enqueues cut short by a crash"
            );
        }
        let paused_tree = db.open_tree("paused").map_err(SledError::from)?;
        for record in paused_tree.iter() {
            let (key, _) = record.map_err(SledError::from)?;
            let queue = String::from_utf8(key.to_vec())
                .map_err(|_| Error::Corrupt(format!("undecodable paused queue {key:?}")))?;
            index.set_paused(&queue, true);
        }
        let schedules_tree = db.open_tree("schedules").map_err(SledError::from)?;
        let schedule_payloads = db.open_tree("schedule_payloads").map_err(SledError::from)?;
        let orphans = schedules::collect(&schedules_tree, &schedule_payloads)?;
        if orphans > 0 {
            tracing::info!(
                orphans,
                "removed schedule payloads of writes cut short by a crash"
            );
        }
        let flusher = Flusher::start(db.clone(), &config.data, config.fault_sync())?;
        Ok(Sled {
            flusher,
            db,
            jobs,
            payloads,
            files,
            paused_tree,
            schedules_tree,
            schedule_payloads,
            saved_file,
            state: Mutex::new(index),
            sealed: AtomicBool::new(false),
            rebuilt,
            remote: OnceLock::new(),
        })
    }

    /// Where the indexes came from at startup.
    pub fn rebuilt(&self) -> Rebuilt {
        self.rebuilt
    }

    /// Refuses every later write of a record (under the lock, so every
    /// earlier one is in the indexes).
    fn seal(&self) {
        let _index = self.lock();
        self.sealed.store(true, Ordering::Relaxed);
    }

    /// An error once the store is sealed: checked before anything is
    /// written (a payload apart) as well as by [`Sled::write`].
    fn check_open(&self) -> Result<()> {
        if self.sealed.load(Ordering::Relaxed) {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }

    /// Saves the indexes of a sealed store whose every write is durable:
    /// the file first, durably; then its token, which the caller's next
    /// commit round makes durable. Saving is an optimisation: if it fails
    /// the next start reads the records, so the failure is only logged.
    fn save(&self) {
        let index = self.lock();
        let token = rand::random::<u64>();
        let saved = index
            .save(token)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                write_durably(&self.saved_file, &bytes)
                    .map_err(|e| format!("{}: {e}", self.saved_file.display()))
            })
            .and_then(|()| {
                let mut value = SAVED_TOKEN_TAG.to_vec();
                value.extend_from_slice(&token.to_be_bytes());
                self.jobs
                    .insert(SAVED_TOKEN_KEY, value)
                    .map_err(|e| e.to_string())
            });
        if let Err(cause) = saved {
            tracing::warn!(%cause, "cannot save the indexes; the next start reads every record");
        }
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

    /// A job with its payload, to hand out.
    async fn load_full(&self, id: JobId) -> Result<Job> {
        let (mut job, payload) = self.load_record(id)?;
        match payload {
            Payload::File(len) => {
                let file = self.files.open_file(id)?;
                let stored = self.read_file(id, file).await?;
                self.place(&mut job, stored, len)?;
            }
            payload => self.fill(&mut job, payload)?,
        }
        Ok(job)
    }

    /// Reads an opened payload file (`None`: there was none) on tokio's
    /// blocking pool, not on a runtime thread: it is at least
    /// `--payload-file-bytes` long and may have left the page cache.
    async fn read_file(&self, id: JobId, file: Option<File>) -> Result<Option<Vec<u8>>> {
        let Some(file) = file else {
            return Ok(None);
        };
        let files = self.files.clone();
        tokio::task::spawn_blocking(move || files.read(id, file))
            .await
            .map_err(|e| Error::Io(format!("reading a payload file failed: {e}")))?
            .map(Some)
    }

    /// Reads a job's payload in, if it is apart or in a file.
    fn fill(&self, job: &mut Job, payload: Payload) -> Result<()> {
        let (stored, len) = match payload {
            Payload::Inline | Payload::Apart(0) | Payload::File(0) => return Ok(()),
            Payload::Apart(len) => (
                self.payloads
                    .get(record_key(job.id))
                    .map_err(SledError::from)?
                    .map(|bytes| bytes.to_vec()),
                len,
            ),
            Payload::File(len) => {
                let file = self.files.open_file(job.id)?;
                (file.map(|f| self.files.read(job.id, f)).transpose()?, len)
            }
        };
        self.place(job, stored, len)
    }

    /// Puts a payload read from apart (`None`: not found) into its job,
    /// whose record says it has `len` bytes.
    fn place(&self, job: &mut Job, stored: Option<Vec<u8>>, len: u64) -> Result<()> {
        match stored {
            Some(bytes) if bytes.len() as u64 == len => {
                job.payload = bytes;
                Ok(())
            }
            Some(bytes) => Err(Error::Corrupt(format!(
                "job {} has a payload of {} bytes, its record says {len}",
                job.id,
                bytes.len()
            ))),
            // Deleted or purged since its record was read (reads do not
            // hold the lock): gone, not corrupt.
            None if !self
                .jobs
                .contains_key(record_key(job.id))
                .map_err(SledError::from)? =>
            {
                Err(Error::NotFound(job.id))
            }
            None => Err(Error::Corrupt(format!(
                "job {} has no payload, its record says {len} bytes",
                job.id
            ))),
        }
    }

    /// Stores a payload apart, before the record that refers to it.
    fn put_payload(&self, id: JobId, payload: &[u8]) -> Result<()> {
        if !payload.is_empty() {
            self.payloads
                .insert(record_key(id), payload)
                .map_err(SledError::from)?;
        }
        Ok(())
    }

    /// Removes the payloads of jobs whose records are gone.
    fn remove_payloads(&self, ids: impl IntoIterator<Item = JobId>) -> Result<()> {
        for id in ids {
            self.payloads
                .remove(record_key(id))
                .map_err(SledError::from)?;
        }
        Ok(())
    }

    /// Loads a job the index says exists.
    fn load_indexed(&self, id: JobId) -> Result<Job> {
        self.load(id).map_err(|e| match e {
            Error::NotFound(id) => Error::Corrupt(format!("job {id} is indexed but has no record")),
            e => e,
        })
    }

    /// Writes records (`None` removes one) to the jobs tree, all or none
    /// after a crash.
    ///
    /// A single record goes in as a plain insert or remove: sled 0.34's
    /// `apply_batch` rolls its log buffer twice (`pin_log`), each roll a
    /// `pwrite` and a `sync_file_range` handed to sled's I/O threads, and
    /// paying that on every enqueue, take and ack made the server 2-3x
    /// slower. Only several records need the batch's atomicity.
    fn write(&self, writes: Vec<([u8; 8], Option<Vec<u8>>)>) -> Result<()> {
        self.check_open()?;
        match <[_; 1]>::try_from(writes) {
            Ok([(key, Some(value))]) => {
                self.jobs.insert(key, value).map_err(SledError::from)?;
            }
            Ok([(key, None)]) => {
                self.jobs.remove(key).map_err(SledError::from)?;
            }
            Err(writes) if writes.is_empty() => {}
            Err(writes) => {
                let mut batch = sled::Batch::default();
                for (key, value) in writes {
                    match value {
                        Some(value) => batch.insert(&key, value),
                        None => batch.remove(&key),
                    }
                }
                self.jobs.apply_batch(batch).map_err(SledError::from)?;
            }
        }
        Ok(())
    }

    /// The one write path: under the lock, load each job (or the version
    /// this call already changed), apply its event, then write every
    /// changed record in one batch and update the indexes.
    fn apply_locked(
        &self,
        index: &mut Index,
        events: Vec<(JobId, Event)>,
        now: SystemTime,
    ) -> Result<Vec<Result<Change>>> {
        self.check_open()?;
        // Jobs changed by this call so far: (as loaded, latest, where the
        // payload is).
        let mut changed: HashMap<JobId, (Job, Job, Payload)> = HashMap::new();
        let mut loaded: HashMap<JobId, Payload> = HashMap::new();
        let mut out = Vec::with_capacity(events.len());
        for (id, event) in events {
            let current = match changed.get(&id) {
                Some((_, latest, _)) => latest.clone(),
                None => match self.load_record(id) {
                    Ok((job, payload)) => {
                        loaded.insert(id, payload);
                        job
                    }
                    Err(Error::NotFound(id)) => {
                        out.push(Err(Error::NotFound(id)));
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            match machine::apply(current.clone(), event, now) {
                Ok(new) => {
                    let payload = loaded.get(&id).copied().unwrap_or(Payload::Inline);
                    changed
                        .entry(id)
                        .or_insert_with(|| (current.clone(), new.clone(), payload))
                        .1 = new.clone();
                    out.push(Ok(Change { old: current, new }));
                }
                Err(e) => out.push(Err(e.into())),
            }
        }
        if changed.is_empty() {
            return Ok(out);
        }
        let mut writes = Vec::with_capacity(changed.len());
        for (id, (_, new, payload)) in &mut changed {
            let placed = match *payload {
                Payload::Apart(len) => Payload::Apart(len),
                Payload::File(len) => Payload::File(len),
                // An older record may hold a big payload inline: it moves
                // apart now, once.
                Payload::Inline => Payload::for_len(new.payload.len()),
            };
            if *payload == Payload::Inline && placed != Payload::Inline {
                self.put_payload(*id, &new.payload)?;
            }
            writes.push((record_key(*id), Some(encode(new, placed)?)));
        }
        self.write(writes)?;
        for (first, last, _) in changed.values() {
            index.update(first, last);
        }
        Ok(out)
    }

    /// Writes the payloads of `batch` that go to files, durably, each
    /// under a job id taken now; returns the ids taken, one per job (empty
    /// if no payload goes to a file; `None` for a job whose key is already
    /// taken, which will not be created).
    async fn write_files(&self, batch: &mut Vec<NewJob>) -> Result<Vec<Option<JobId>>> {
        if !batch.iter().any(|new| self.files.wants(new.payload.len())) {
            return Ok(Vec::new());
        }
        self.check_open()?;
        let taken: Vec<bool> = {
            let index = self.lock();
            batch
                .iter()
                .map(|new| {
                    new.key
                        .as_deref()
                        .is_some_and(|k| index.key(&new.queue, k).is_some())
                })
                .collect()
        };
        // Every job to be created gets its id now, in batch order, not
        // only those with a file: ids order jobs of one run_at, so a batch
        // stays FIFO whatever its payloads' sizes.
        let mut ids = Vec::with_capacity(batch.len());
        for taken in taken {
            ids.push(match taken {
                false => Some(JobId(self.next_id()?)),
                true => None,
            });
        }
        let files = self.files.clone();
        let jobs = std::mem::take(batch);
        let reserved = ids.clone();
        let (jobs, written) = tokio::task::spawn_blocking(move || {
            let written = files.write(
                jobs.iter()
                    .zip(&reserved)
                    .filter(|(new, _)| files.wants(new.payload.len()))
                    .filter_map(|(new, id)| id.map(|id| (id, new.payload.as_slice()))),
            );
            (jobs, written)
        })
        .await
        .map_err(|e| Error::Io(format!("payload writer: {e}")))?;
        *batch = jobs;
        if written.is_err() {
            // No record was written: the files of this batch are nobody's.
            self.files.remove(ids.iter().flatten().copied());
        }
        written.map(|()| ids)
    }

    /// Inserts `batch`; `ids[i]`, if set, is the id taken for job `i` by
    /// [`Sled::write_files`], which wrote its payload to its file if it
    /// goes to one.
    fn insert_locked(
        &self,
        batch: Vec<NewJob>,
        ids: &[Option<JobId>],
        now: SystemTime,
    ) -> Result<Vec<Enqueued>> {
        let mut index = self.lock();
        self.check_open()?;
        let mut out: Vec<Enqueued> = Vec::with_capacity(batch.len());
        let mut writes = Vec::with_capacity(batch.len());
        for (i, new) in batch.into_iter().enumerate() {
            if let Some(existing) = new.key.as_deref().and_then(|k| index.key(&new.queue, k)) {
                out.push(Enqueued {
                    job: self.load_indexed(existing)?,
                    created: false,
                });
                continue;
            }
            let taken = ids.get(i).copied().flatten();
            let id = match taken {
                Some(id) => id,
                None => JobId(self.next_id()?),
            };
            let mut job = machine::create(id, new, now);
            // (A key taken at `write_files` but freed since leaves a big
            // payload without a file: it goes to the tree.)
            let placed = match taken.is_some() && self.files.wants(job.payload.len()) {
                true => Payload::File(job.payload.len() as u64),
                false => Payload::for_len(job.payload.len()),
            };
            if let Payload::Apart(_) = placed {
                self.put_payload(job.id, &job.payload)?;
            }
            writes.push((record_key(job.id), Some(encode(&mut job, placed)?)));
            out.push(Enqueued { job, created: true });
        }
        self.write(writes)?;
        for enqueued in out.iter().filter(|e| e.created) {
            index.insert(&enqueued.job);
        }
        Ok(out)
    }

    /// Takes the first due job under the lock; a payload in a file comes
    /// back opened, for the caller to read without it.
    fn take_locked(
        &self,
        queues: &[String],
        take: Event,
        now: SystemTime,
    ) -> Result<Option<(Change, Option<Unread>)>> {
        let mut index = self.lock();
        let Some(id) = queues
            .iter()
            .filter(|q| !index.is_paused(q))
            .find_map(|q| index.first_due(q, now))
        else {
            return Ok(None);
        };
        let mut results = self.apply_locked(&mut index, vec![(id, take)], now)?;
        match results.pop() {
            Some(Ok(mut change)) => {
                // The take is written. What follows may fail (a payload
                // that cannot be read) or wait (a file read, during which
                // a Dequeue's caller may give up) before the caller
                // publishes it, so its lease is made reapable and durable
                // now: otherwise the job would stay RUNNING under a lease
                // nobody holds, and nothing would wake the reaper for it.
                if let Some(at) = change.new.lease_expires_at() {
                    if let Some(remote) = self.remote.get() {
                        remote.lease_expires(at);
                    }
                }
                self.flusher.request();
                // The worker needs the payload, which the change left apart.
                // A file is opened under the lock (so a delete right after
                // cannot take it away) and read by the caller without it
                // (it may be big).
                if change.new.payload.is_empty() {
                    let (_, placed) = self.load_record(id)?;
                    if let Payload::File(len) = placed {
                        let file = self.files.open_file(id)?;
                        return Ok(Some((change, Some(Unread { file, len }))));
                    }
                    self.fill(&mut change.new, placed)?;
                }
                Ok(Some((change, None)))
            }
            Some(Err(Error::NotFound(id))) => Err(Error::Corrupt(format!(
                "job {id} is indexed but has no record"
            ))),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    fn expiring_locked(&self, at: SystemTime) -> Result<Vec<(JobId, LeaseId)>> {
        let ids = self.lock().expired(at);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            match self.load(id) {
                Ok(job) => {
                    if let Some(lease) = job.lease_id() {
                        out.push((id, lease));
                    }
                }
                // Purged or changed meanwhile: the caller re-checks anyway.
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// One purge step: reads up to [`PURGE_CHUNK`] DONE and FAILED jobs
    /// after `after` (by the status index: PENDING and RUNNING records are
    /// never read, so a purge over 1M pending jobs reads none of them) —
    /// or, for a purge of PENDING jobs, that queue's PENDING ones —
    /// without the lock, then deletes the purgeable ones under it,
    /// re-checking each (it may have been retried or taken meanwhile).
    /// Returns the number deleted and where the next step starts.
    fn purge_chunk_locked(
        &self,
        after: Option<JobId>,
        retention: Retention,
    ) -> Result<(u64, Option<JobId>, Vec<JobId>)> {
        let Some(start) = after.map_or(Some(0), |id| id.0.checked_add(1)) else {
            return Ok((0, None, Vec::new()));
        };
        let ids = {
            let index = self.lock();
            // One queue's purge walks that queue's finished jobs, not every
            // queue's.
            let finished = |status| match &retention.queue {
                Some(queue) => index.in_queue(queue, Some(status), JobId(start), PURGE_CHUNK),
                None => index.with_status(status, JobId(start), PURGE_CHUNK),
            };
            match (&retention.queue, retention.pending_through) {
                (Some(queue), Some(_)) => {
                    index.in_queue(queue, Some(Status::Pending), JobId(start), PURGE_CHUNK)
                }
                _ => {
                    let mut ids = finished(Status::Done);
                    ids.extend(finished(Status::Failed));
                    ids.sort_unstable();
                    ids.truncate(PURGE_CHUNK);
                    ids
                }
            }
        };
        let Some(&last) = ids.last() else {
            return Ok((0, None, Vec::new()));
        };
        let mut candidates = Vec::new();
        let mut next = Some(last);
        for id in ids {
            match self.load(id) {
                // The rest finished too recently: the pass ends here, having
                // read the purgeable jobs and not every retained one.
                Ok(job) if retention.past_every_cutoff(&job) => {
                    next = None;
                    break;
                }
                Ok(job) if retention.purgeable(&job) => candidates.push(id),
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if candidates.is_empty() {
            return Ok((0, next, Vec::new()));
        }
        let mut index = self.lock();
        let mut writes = Vec::new();
        let (mut gone, mut apart, mut files) = (Vec::new(), Vec::new(), Vec::new());
        for id in candidates {
            match self.load_record(id) {
                Ok((job, payload)) if retention.purgeable(&job) => {
                    writes.push((record_key(id), None));
                    match payload {
                        Payload::Inline => {}
                        Payload::Apart(_) => apart.push(id),
                        Payload::File(_) => files.push(id),
                    }
                    gone.push(job);
                }
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.write(writes)?;
        self.remove_payloads(apart)?;
        for job in &gone {
            index.remove(job);
        }
        Ok((gone.len() as u64, next, files))
    }

    fn list_scan(&self, filter: &ListFilter) -> Result<Page> {
        let limit = filter.limit.max(1);
        let Some(start) = filter.after.map_or(Some(0), |id| id.0.checked_add(1)) else {
            return Ok(Page::default());
        };
        let matches = |job: &Job| {
            filter.queue.as_ref().is_none_or(|q| *q == job.queue)
                && filter.status.is_none_or(|s| s == job.status)
                && filter
                    .key
                    .as_ref()
                    .is_none_or(|k| job.key.as_ref() == Some(k))
        };
        // With queue and key given, at most one retained job matches.
        if let (Some(queue), Some(key)) = (&filter.queue, &filter.key) {
            let id = self.lock().key(queue, key);
            let jobs = match id.filter(|id| id.0 >= start) {
                Some(id) => match self.load_record(id) {
                    Ok((mut job, payload)) if matches(&job) => {
                        if filter.omit_payload {
                            job.payload = Vec::new();
                            vec![job]
                        } else {
                            match self.fill(&mut job, payload) {
                                Ok(()) => vec![job],
                                Err(Error::NotFound(_)) => vec![],
                                Err(e) => return Err(e),
                            }
                        }
                    }
                    Ok(_) | Err(Error::NotFound(_)) => vec![],
                    Err(e) => return Err(e),
                },
                None => vec![],
            };
            return Ok(Page { jobs, next: None });
        }
        // The page ends at `limit` jobs or at `max_bytes` of them, whichever
        // comes first, so it is never built bigger than that in memory (nor
        // too big for the reply); a job alone over the bound still makes a
        // page, so paging always moves on.
        let mut jobs = Vec::new();
        let (mut bytes, mut full) = (0usize, false);
        // By queue, status or key: only the records the index names for
        // them (a queue with few jobs among many is not a scan); with no
        // filter every record from `start` on, all of which match.
        let indexed = |select, ids: Vec<JobId>, from| Indexed {
            sled: self,
            select,
            from,
            ids: ids.into_iter(),
        };
        let mut records: Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> + '_> =
            match (&filter.queue, filter.status, &filter.key) {
                (Some(queue), status, _) => Box::new(indexed(
                    Select::Queue(queue, status),
                    Vec::new(),
                    Some(start),
                )),
                (None, Some(status), None) => {
                    Box::new(indexed(Select::Status(status), Vec::new(), Some(start)))
                }
                // At most one job per queue holds a key.
                (None, _, Some(key)) => {
                    let mut ids = self.lock().keyed(key);
                    ids.retain(|id| id.0 >= start);
                    Box::new(indexed(Select::Named, ids, None))
                }
                // Records only: the saved-index token (written at a clean
                // stop) sorts after every record's key.
                (None, None, None) => Box::new(
                    self.jobs
                        .range(start.to_be_bytes()..=record_key(JobId(u64::MAX))),
                ),
            };
        for record in records.by_ref() {
            let (key, value) = record.map_err(SledError::from)?;
            let (mut job, payload) = decode(&key, &value)?;
            if !matches(&job) {
                continue;
            }
            let mut size = value.len();
            if filter.omit_payload {
                size = size.saturating_sub(job.payload.len());
                job.payload = Vec::new();
            } else if let Payload::Apart(len) | Payload::File(len) = payload {
                size = size.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
            }
            if !jobs.is_empty() && bytes.saturating_add(size) > filter.max_bytes {
                full = true;
                break;
            }
            if !filter.omit_payload {
                match self.fill(&mut job, payload) {
                    Ok(()) => {}
                    // Purged meanwhile: not listed.
                    Err(Error::NotFound(_)) => continue,
                    Err(e) => return Err(e),
                }
            }
            bytes = bytes.saturating_add(size);
            jobs.push(job);
            if jobs.len() == limit {
                full = true;
                break;
            }
        }
        // A full page may have a successor; an exhausted scan has none.
        // (Stopped by bytes, the job that did not fit is the successor.)
        let next = match jobs.last() {
            Some(last) if full && (jobs.len() < limit || records.next().is_some()) => Some(last.id),
            _ => None,
        };
        Ok(Page { jobs, next })
    }
}

/// A taken job's payload file, opened under the store's lock (`None`: it
/// was missing) and not read yet, and the length its record gives.
struct Unread {
    file: Option<File>,
    len: u64,
}

/// Which of the index's id sets a listing walks.
enum Select<'f> {
    /// Jobs with one status.
    Status(crate::job::Status),
    /// One queue's jobs, of one status or all.
    Queue(&'f str, Option<crate::job::Status>),
    /// The ids given at the start, and no more.
    Named,
}

/// The records of the jobs an index set names, in id order: fetched a
/// chunk of ids at a time under the lock, each record read without it (so
/// a job may have changed since; the caller's filter checks it again).
struct Indexed<'a, 'f> {
    sled: &'a Sled,
    select: Select<'f>,
    /// The next id to look from; `None` once the set is exhausted.
    from: Option<u64>,
    ids: std::vec::IntoIter<JobId>,
}

/// Ids fetched under the lock per step of [`Indexed`].
const LIST_CHUNK: usize = 256;

impl Iterator for Indexed<'_, '_> {
    type Item = sled::Result<(sled::IVec, sled::IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(id) = self.ids.next() {
                let key = record_key(id);
                match self.sled.jobs.get(key) {
                    Ok(Some(value)) => return Some(Ok((sled::IVec::from(&key[..]), value))),
                    // Purged or deleted since the ids were read.
                    Ok(None) => continue,
                    Err(e) => return Some(Err(e)),
                }
            }
            let from = JobId(self.from?);
            let ids = match self.select {
                Select::Status(status) => self.sled.lock().with_status(status, from, LIST_CHUNK),
                Select::Queue(queue, status) => {
                    self.sled.lock().in_queue(queue, status, from, LIST_CHUNK)
                }
                Select::Named => Vec::new(),
            };
            self.from = match ids.last() {
                Some(last) if ids.len() == LIST_CHUNK => last.0.checked_add(1),
                _ => None,
            };
            if ids.is_empty() {
                return None;
            }
            self.ids = ids.into_iter();
        }
    }
}

impl Backend for Sled {
    fn insert_waits(&self, batch: &[NewJob]) -> bool {
        batch.iter().any(|new| self.files.wants(new.payload.len()))
    }

    async fn insert(&self, mut batch: Vec<NewJob>, now: SystemTime) -> Result<Vec<Enqueued>> {
        let files = self.write_files(&mut batch).await?;
        let enqueued = self.insert_locked(batch, &files, now)?;
        // A file whose job was not created (its key was taken meanwhile)
        // has no record: remove it now. (After an error the files stay:
        // orphans, removed by the next start.)
        if files.iter().any(Option::is_some) {
            let created: HashSet<JobId> = enqueued
                .iter()
                .filter(|e| e.created)
                .map(|e| e.job.id)
                .collect();
            self.files.remove(
                files
                    .into_iter()
                    .flatten()
                    .filter(|id| !created.contains(id)),
            );
        }
        Ok(enqueued)
    }

    async fn take(
        &self,
        queues: &[String],
        take: Event,
        _streamed: bool,
        now: SystemTime,
    ) -> Result<Option<Change>> {
        match self.take_locked(queues, take, now)? {
            Some((mut change, Some(Unread { file, len }))) => {
                let stored = self.read_file(change.new.id, file).await?;
                self.place(&mut change.new, stored, len)?;
                Ok(Some(change))
            }
            Some((change, None)) => Ok(Some(change)),
            None => Ok(None),
        }
    }

    async fn apply(
        &self,
        events: Vec<(JobId, Event)>,
        now: SystemTime,
    ) -> Result<Vec<Result<Change>>> {
        let mut index = self.lock();
        self.apply_locked(&mut index, events, now)
    }

    async fn set_paused(&self, queue: &str, paused: bool, most: usize) -> Result<()> {
        let mut index = self.lock();
        if paused {
            crate::validate::pause_room(index.paused_len(), index.is_paused(queue), most)?;
            self.paused_tree
                .insert(queue.as_bytes(), &[])
                .map_err(SledError::from)?;
        } else {
            self.paused_tree
                .remove(queue.as_bytes())
                .map_err(SledError::from)?;
        }
        index.set_paused(queue, paused);
        Ok(())
    }

    async fn paused(&self) -> Result<Vec<String>> {
        Ok(self.lock().paused())
    }

    async fn expiring(&self, at: SystemTime) -> Result<Vec<(JobId, LeaseId)>> {
        self.expiring_locked(at)
    }

    async fn last_pending(&self, queue: &str) -> Result<Option<JobId>> {
        Ok(self.lock().last_in_queue(queue, Status::Pending))
    }

    async fn purge_chunk(
        &self,
        after: Option<JobId>,
        retention: Retention,
    ) -> Result<(u64, Option<JobId>)> {
        let (purged, next, files) = self.purge_chunk_locked(after, retention)?;
        self.remove_files_when_durable(files);
        Ok((purged, next))
    }

    async fn delete(&self, id: JobId) -> Result<()> {
        let payload = {
            let mut index = self.lock();
            let (job, payload) = self.load_record(id)?;
            machine::deletable(&job)?;
            self.write(vec![(record_key(id), None)])?;
            if let Payload::Apart(_) = payload {
                self.remove_payloads([id])?;
            }
            index.remove(&job);
            payload
        };
        if let Payload::File(_) = payload {
            self.remove_files_when_durable(vec![id]);
        }
        Ok(())
    }

    async fn put_schedule(&self, schedule: &Schedule) -> Result<()> {
        let _state = self.lock();
        schedules::put(
            &self.schedules_tree,
            &self.schedule_payloads,
            schedule,
            || self.next_id(),
        )
    }

    async fn delete_schedule(&self, name: &str) -> Result<Option<Schedule>> {
        let _state = self.lock();
        schedules::delete(&self.schedules_tree, &self.schedule_payloads, name)
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        schedules::all(&self.schedules_tree, &self.schedule_payloads)
    }

    async fn schedule(&self, name: &str) -> Result<Option<Schedule>> {
        schedules::get(&self.schedules_tree, &self.schedule_payloads, name)
    }

    async fn schedule_ticked(
        &self,
        name: &str,
        created_at: SystemTime,
        tick: SystemTime,
    ) -> Result<()> {
        let _state = self.lock();
        schedules::ticked(
            &self.schedules_tree,
            name,
            created_at,
            tick,
            SystemTime::now(),
        )
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.load_full(id).await
    }

    async fn peek(&self, id: JobId) -> Result<Job> {
        self.load(id)
    }

    async fn list(&self, filter: ListFilter) -> Result<Page> {
        self.list_scan(&filter)
    }

    async fn stats(&self, queue: Option<&str>, now: SystemTime) -> Result<Vec<QueueStats>> {
        Ok(self.lock().stats(queue, now))
    }

    async fn next_run_at(&self, queues: &[String]) -> Result<Option<SystemTime>> {
        Ok(self.lock().next_run_at(queues))
    }

    async fn next_lease_expiry(&self) -> Result<Option<SystemTime>> {
        Ok(self.lock().next_lease_expiry())
    }

    fn durable(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        self.flusher.durable()
    }

    fn attach(&self, remote: Remote) {
        let _ = self.remote.set(remote);
    }

    async fn close(&self) -> Result<()> {
        self.seal();
        // Indexes saved past a write that did not reach the disk would show
        // a job the records do not have.
        self.flusher.durable().await?;
        self.save();
        self.flusher.durable().await
    }
}

impl Sled {
    /// Removes the payload files of removed records once the removals are
    /// durable (before, a crash could bring a record back without its
    /// file), in a task of its own: neither the caller's reply nor its
    /// cancellation waits for it. Files the task does not get to (a failed
    /// round, a stop) are orphans, which the next start removes.
    fn remove_files_when_durable(&self, ids: Vec<JobId>) {
        if ids.is_empty() {
            return;
        }
        let durable = self.flusher.durable();
        let files = self.files.clone();
        tokio::spawn(async move {
            if durable.await.is_ok() {
                let _ = tokio::task::spawn_blocking(move || files.remove(ids)).await;
            }
        });
    }
}

/// Opens sled, also right after its last handle was dropped (by this
/// process: a restart in place, or the reopen after a scan). sled's I/O
/// threads may still hold its lock file for a moment (a log write of the
/// last page consolidations), and sled only tries the lock once: retry for
/// up to about two seconds.
fn reopen(open: impl Fn() -> std::result::Result<sled::Db, SledError>) -> Result<sled::Db> {
    let mut wait = std::time::Duration::from_millis(10);
    let mut waited = std::time::Duration::ZERO;
    loop {
        match open() {
            Err(SledError::Sled(sled::Error::Io(e)))
                if waited < std::time::Duration::from_secs(2)
                    && e.to_string().contains("could not acquire lock") =>
            {
                std::thread::sleep(wait);
                waited += wait;
                wait = (wait * 2).min(std::time::Duration::from_millis(200));
            }
            other => return Ok(other?),
        }
    }
}

/// Builds the indexes from every record: the id range split among up to
/// [`SCAN_THREADS`] threads (one per core), each indexing its part, then
/// merged. Walking sled's tree is most of a start after a crash, and it
/// runs on one core per walk.
fn scan(jobs: &sled::Tree) -> Result<Index> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(SCAN_THREADS));
    scan_parts(jobs, threads, SCAN_SPLIT_MIN)
}

/// [`scan`] on up to `threads` threads, if the ids span `split_min` or
/// more.
fn scan_parts(jobs: &sled::Tree, threads: usize, split_min: u64) -> Result<Index> {
    let id = |entry: Option<(sled::IVec, sled::IVec)>| {
        entry.and_then(|(key, _)| {
            <[u8; 8]>::try_from(key.as_ref())
                .ok()
                .map(u64::from_be_bytes)
        })
    };
    let first = id(jobs.first().map_err(SledError::from)?);
    let last = id(jobs.last().map_err(SledError::from)?);
    let (Some(first), Some(last)) = (first, last) else {
        return scan_range(jobs, None, None);
    };
    let span = last - first;
    if threads < 2 || span < split_min.max(threads as u64) {
        return scan_range(jobs, None, None);
    }
    // Ids are handed out in sequence, so equal id ranges hold about equal
    // numbers of records. The last part runs to the end of the tree.
    let step = span / threads as u64;
    let bounds: Vec<(Option<u64>, Option<u64>)> = (0..threads as u64)
        .map(|k| {
            let start = (k > 0).then(|| first + k * step);
            let end = (k + 1 < threads as u64).then(|| first + (k + 1) * step);
            (start, end)
        })
        .collect();
    let parts: Vec<Result<Index>> = std::thread::scope(|scope| {
        let handles: Vec<_> = bounds
            .iter()
            .map(|&(start, end)| scope.spawn(move || scan_range(jobs, start, end)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut index = Index::default();
    for part in parts {
        index.merge(part?);
    }
    Ok(index)
}

/// Threads a startup scan uses at most.
const SCAN_THREADS: usize = 4;

/// Id ranges smaller than this are scanned on one thread.
const SCAN_SPLIT_MIN: u64 = 100_000;

/// Indexes the records with ids in `start..end` (`None`: from the first
/// key, to the last; a key that is no record's is then an error).
fn scan_range(jobs: &sled::Tree, start: Option<u64>, end: Option<u64>) -> Result<Index> {
    let mut index = Index::default();
    let records = match (start, end) {
        (Some(start), Some(end)) => jobs.range(start.to_be_bytes()..end.to_be_bytes()),
        (Some(start), None) => jobs.range(start.to_be_bytes()..),
        (None, Some(end)) => jobs.range(..end.to_be_bytes()),
        (None, None) => jobs.iter(),
    };
    for record in records {
        let (key, value) = record.map_err(SledError::from)?;
        index.insert(&decode(&key, &value)?.0);
    }
    Ok(index)
}

/// The indexes the last clean stop saved to `file` (in sled's folder
/// `data`), if any.
/// Their token is removed from the store (durably) before they are
/// returned: a write after this start must never be missing from indexes
/// that a later start would read.
fn take_saved(db: &sled::Db, jobs: &sled::Tree, data: &Path, file: &Path) -> Result<Option<Index>> {
    let token = jobs.get(SAVED_TOKEN_KEY).map_err(SledError::from)?;
    if token.is_some() {
        jobs.remove(SAVED_TOKEN_KEY).map_err(SledError::from)?;
        flusher::sync_once(db, data)?;
    }
    let token = token.map(|value| match value.split_first_chunk::<2>() {
        Some((&SAVED_TOKEN_TAG, token)) => <[u8; 8]>::try_from(token).ok(),
        _ => None,
    });
    let read = match token {
        None => Err("the last stop was not clean".to_owned()),
        Some(None) => Err("a malformed token".to_owned()),
        Some(Some(token)) => std::fs::read(file)
            .map_err(|e| format!("{}: {e}", file.display()))
            .and_then(|bytes| {
                Index::load(&bytes, u64::from_be_bytes(token)).map_err(|e| e.to_string())
            }),
    };
    // Used once, or stale: either way of no more use.
    if let Err(err) = std::fs::remove_file(file) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(cause = %err, file = %file.display(), "cannot remove the saved indexes");
        }
    }
    match read {
        Ok(index) => Ok(Some(index)),
        Err(cause) => {
            if token.is_some() {
                tracing::warn!(%cause, "cannot read the saved indexes; reading every record");
            } else {
                tracing::debug!(%cause, "reading every record");
            }
            Ok(None)
        }
    }
}

/// Writes `bytes` to `path` through a temporary file: durable, and whole or
/// not there, when it returns.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temporary)?;
    std::io::Write::write_all(&mut file, bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl Broken for Sled {
    fn broken(&self) -> impl Future<Output = String> + Send + 'static {
        self.flusher.broken()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        job::{JobId, NewJob, Status},
        store::Store,
    };

    /// A job for queue `q` with `payload`.
    fn new_job(payload: Vec<u8>) -> NewJob {
        NewJob {
            queue: "q".into(),
            kind: "k".into(),
            payload,
            key: None,
            max_attempts: 3,
            delay: Duration::ZERO,
            priority: 0,
            metadata: Default::default(),
        }
    }

    /// A store written by a build before payloads moved apart (layout 3:
    /// payload inline) opens, hands the payload out, and moves it apart on
    /// the job's first change.
    #[tokio::test]
    async fn an_inline_payload_moves_apart_on_the_first_change() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        // Over INLINE_MAX: it belongs apart.
        let payload =
            format!(r#"{{"order":"order-4711","note":"{}"}}"#, "x".repeat(4096)).into_bytes();
        let job = machine::create(
            JobId(7),
            NewJob {
                queue: "q".into(),
                kind: "send-email".into(),
                payload: payload.clone(),
                key: Some("order-4711".into()),
                max_attempts: 3,
                delay: Duration::ZERO,
                priority: 0,
                metadata: Default::default(),
            },
            now,
        );
        {
            let db = sled::open(dir.path()).unwrap();
            let v3 = postcard::to_extend(&job, vec![0, 3]).unwrap();
            db.open_tree("jobs")
                .unwrap()
                .insert(record_key(job.id), v3)
                .unwrap();
            db.flush().unwrap();
        }
        let config = Config::with_data(dir.path());
        let store = SledStore::open(&config).unwrap();
        assert_eq!(store.get(job.id).await.unwrap().payload, payload);
        let queues = vec!["q".to_string()];
        let leased = store
            .take(&queues, "w", None, Duration::from_secs(30), now)
            .await
            .unwrap()
            .expect("the old job is due");
        assert_eq!(leased.job.id, job.id);
        assert_eq!(leased.job.payload, payload, "a take hands it out");
        let sled = store.backend();
        let (_, placed) = sled.load_record(job.id).unwrap();
        assert_eq!(placed, Payload::Apart(payload.len() as u64));
        assert_eq!(
            sled.payloads.get(record_key(job.id)).unwrap().as_deref(),
            Some(&payload[..])
        );
        let done = store.ack(job.id, leased.lease_id, now).await.unwrap();
        assert_eq!(done.status, Status::Done);
        assert_eq!(store.get(job.id).await.unwrap().payload, payload);
        // Deleting the job deletes its payload too.
        store.delete(job.id).await.unwrap();
        assert_eq!(sled.payloads.get(record_key(job.id)).unwrap(), None);
    }

    /// A clean close refuses later writes and saves the indexes; the next
    /// open reads them instead of the records, and they are what the
    /// records give. They serve one start: a start that ends without a
    /// close (a crash) leaves none, and the one after reads the records.
    #[tokio::test]
    async fn a_clean_close_saves_the_indexes_for_the_next_start_only() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::with_data(dir.path());
        let now = SystemTime::now();
        let queues = vec!["q".to_string()];
        {
            let store = SledStore::open(&config).unwrap();
            assert_eq!(store.backend().rebuilt(), Rebuilt::FromRecords);
            let mut pending = Vec::new();
            for n in 0..40 {
                let mut new = new_job(vec![b'p'; if n % 7 == 0 { 2000 } else { 10 }]);
                new.key = (n % 3 == 0).then(|| format!("order-{n}"));
                new.priority = n % 5 - 2;
                new.delay = Duration::from_secs(if n % 4 == 1 { 3600 } else { 0 });
                if n % 2 == 0 {
                    new.queue = "other".into();
                }
                pending.push(store.enqueue(new, now).await.unwrap().job.id);
            }
            // Some RUNNING, DONE and FAILED jobs too.
            for n in 0..6 {
                let leased = store
                    .take(&queues, "w", None, Duration::from_secs(30), now)
                    .await
                    .unwrap()
                    .expect("a due job");
                if n % 2 == 0 {
                    store
                        .ack(leased.job.id, leased.lease_id, now)
                        .await
                        .unwrap();
                }
            }
            store.cancel(pending[0], "x".into(), now).await.unwrap();
            store.set_paused("other", true).await.unwrap();
            store.close().await.unwrap();
            let token = store.backend().jobs.get(SAVED_TOKEN_KEY).unwrap();
            assert!(
                record::decode(&token.expect("a token")).is_err(),
                "no build reads the token as a record"
            );
            // Reads go on, and a listing of every record skips the token.
            let all = store
                .list(ListFilter {
                    limit: 100,
                    ..ListFilter::default()
                })
                .await
                .unwrap();
            assert_eq!((all.jobs.len(), all.next), (40, None));
            let refused = store.enqueue(new_job(vec![]), now).await;
            assert!(matches!(refused, Err(Error::ShuttingDown)), "{refused:?}");
            let refused = store.delete(pending[0]).await;
            assert!(matches!(refused, Err(Error::ShuttingDown)), "{refused:?}");
        }
        let store = SledStore::open(&config).unwrap();
        let sled = store.backend();
        assert_eq!(sled.rebuilt(), Rebuilt::FromSaved);
        let mut from_records = scan(&sled.jobs).unwrap();
        from_records.set_paused("other", true);
        assert_eq!(*sled.lock(), from_records);
        assert_eq!(sled.lock().len(), 40);
        assert_eq!(sled.jobs.get(SAVED_TOKEN_KEY).unwrap(), None, "read once");
        assert!(!sled.saved_file.exists(), "and gone");
        // The store works on; then it stops without a close.
        let leased = store
            .take(&queues, "w", None, Duration::from_secs(30), now)
            .await
            .unwrap()
            .expect("a due job");
        store.flush().await.unwrap();
        drop(store);
        let store = SledStore::open(&config).unwrap();
        assert_eq!(store.backend().rebuilt(), Rebuilt::FromRecords);
        assert_eq!(
            store.get(leased.job.id).await.unwrap().status,
            Status::Running
        );
        // A file an earlier stop left is not read: its token is not the
        // store's.
        store.close().await.unwrap();
        let earlier = std::fs::read(&store.backend().saved_file).unwrap();
        drop(store);
        let store = SledStore::open(&config).unwrap();
        assert_eq!(store.backend().rebuilt(), Rebuilt::FromSaved);
        store.close().await.unwrap();
        std::fs::write(&store.backend().saved_file, earlier).unwrap();
        drop(store);
        let store = SledStore::open(&config).unwrap();
        assert_eq!(store.backend().rebuilt(), Rebuilt::FromRecords);
        assert!(!store.backend().saved_file.exists());
    }

    /// The startup scan split among threads gives the indexes one thread
    /// gives.
    #[tokio::test]
    async fn a_scan_in_parts_indexes_like_one_scan() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&Config::with_data(dir.path())).unwrap();
        let now = SystemTime::now();
        for n in 0..60 {
            let mut new = new_job(vec![b'p'; 10]);
            new.queue = ["a", "b", "c"][n % 3].into();
            new.key = (n % 4 == 0).then(|| format!("k{n}"));
            new.priority = (n % 3) as i32;
            new.delay = Duration::from_secs((n % 5) as u64 * 60);
            store.enqueue(new, now).await.unwrap();
        }
        // Some RUNNING (leases) and DONE too.
        for queue in ["a", "b"] {
            let leased = store
                .take(
                    &[queue.to_string()],
                    "w",
                    None,
                    Duration::from_secs(30),
                    now,
                )
                .await
                .unwrap()
                .expect("a due job");
            if queue == "a" {
                store
                    .ack(leased.job.id, leased.lease_id, now)
                    .await
                    .unwrap();
            }
        }
        let jobs = &store.backend().jobs;
        let whole = scan_range(jobs, None, None).unwrap();
        for threads in [2, 3, 7] {
            assert_eq!(
                scan_parts(jobs, threads, 0).unwrap(),
                whole,
                "{threads} parts"
            );
        }
        assert_eq!(whole.len(), 60);
    }

    /// A small payload stays in the record (nothing in the payloads tree);
    /// a big one goes apart; both come back whole.
    #[tokio::test]
    async fn small_payloads_stay_inline_and_big_ones_go_apart() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::with_data(dir.path());
        let store = SledStore::open(&config).unwrap();
        let now = SystemTime::now();
        let file_min = usize::try_from(config.payload_file_bytes).unwrap();
        let mut ids = Vec::new();
        for len in [
            0,
            100,
            record::INLINE_MAX,
            record::INLINE_MAX + 1,
            file_min - 1,
            file_min,
            1 << 20,
        ] {
            let new = new_job(vec![b'p'; len]);
            ids.push((store.enqueue(new, now).await.unwrap().job.id, len));
        }
        let sled = store.backend();
        for (id, len) in ids {
            let (_, placed) = sled.load_record(id).unwrap();
            let in_file = dir.path().join("payloads").join(id.0.to_string());
            if len >= file_min {
                assert_eq!(placed, record::Payload::File(len as u64), "{len} bytes");
                assert_eq!(std::fs::read(&in_file).unwrap().len(), len);
            } else {
                assert_eq!(placed, record::Payload::for_len(len), "{len} bytes");
                assert!(!in_file.exists());
            }
            let stored = sled.payloads.get(record_key(id)).unwrap();
            assert_eq!(
                stored.is_some(),
                len > record::INLINE_MAX && len < file_min,
                "{len} bytes"
            );
            assert_eq!(store.get(id).await.unwrap().payload, vec![b'p'; len]);
        }
    }

    /// A payload file lives as long as its record: a keyed enqueue that
    /// finds its job leaves none behind (also when two race), a deleted
    /// job's goes once the delete is durable, and a file no record refers
    /// to (a crash between the two writes) is removed at the next start.
    #[tokio::test]
    async fn payload_files_go_with_their_records() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("payloads");
        let count = || std::fs::read_dir(&folder).unwrap().count();
        let mut config = Config::with_data(dir.path());
        config.payload_file_bytes = 16 * 1024;
        let big = vec![b'b'; 16 * 1024];
        let now = SystemTime::now();
        {
            let store = SledStore::open(&config).unwrap();
            let mut keyed = new_job(big.clone());
            keyed.key = Some("order-4711".into());
            // Both find the key free before either inserts: both write a
            // file, and the one that finds the key taken removes its own.
            let (a, b) = tokio::join!(
                store.enqueue(keyed.clone(), now),
                store.enqueue(keyed.clone(), now)
            );
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!(a.created != b.created && a.job.id == b.job.id);
            assert_eq!(count(), 1, "one file for the one job");
            let again = store.enqueue(keyed, now).await.unwrap();
            assert!(!again.created);
            assert_eq!(count(), 1, "a later enqueue of the key wrote no file");
            let other = store.enqueue(new_job(big.clone()), now).await.unwrap();
            assert_eq!(count(), 2);
            let taken = store
                .take(&["q".to_string()], "w", None, Duration::from_secs(30), now)
                .await
                .unwrap()
                .expect("a job");
            assert!(
                taken.job.payload == big,
                "a take hands the file's bytes out"
            );
            store
                .cancel(other.job.id, "test".into(), now)
                .await
                .unwrap();
            store.delete(other.job.id).await.unwrap();
            assert!(matches!(
                store.get(other.job.id).await,
                Err(Error::NotFound(_))
            ));
            // Removed by a task of its own once the delete is durable.
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while count() != 1 {
                assert!(std::time::Instant::now() < deadline, "the file stays");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            store.close().await.unwrap();
        }
        for rebuilt in [Rebuilt::FromSaved, Rebuilt::FromRecords] {
            std::fs::write(folder.join("999999"), b"an orphan").unwrap();
            let store = SledStore::open(&config).unwrap();
            assert_eq!(store.backend().rebuilt(), rebuilt);
            assert_eq!(
                count(),
                1,
                "{rebuilt:?}: the orphan is gone, the live file stays"
            );
            let page = store
                .list(ListFilter {
                    limit: 10,
                    ..ListFilter::default()
                })
                .await
                .unwrap();
            assert!(page.jobs.iter().any(|j| j.payload == big));
        }
    }

    /// A purge of a queue's PENDING jobs takes their payloads with them:
    /// the ones stored apart at once, the files once the purge is durable;
    /// a RUNNING job of the queue keeps its payload.
    #[tokio::test]
    async fn a_purge_of_pending_jobs_removes_their_payloads() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("payloads");
        let files = || std::fs::read_dir(&folder).unwrap().count();
        let mut config = Config::with_data(dir.path());
        config.payload_file_bytes = 16 * 1024;
        let store = SledStore::open(&config).unwrap();
        let now = SystemTime::now();
        let apart = vec![b'a'; record::INLINE_MAX + 1];
        let file = vec![b'f'; 16 * 1024];
        let mut batch = Vec::new();
        for _ in 0..100 {
            batch.push(new_job(apart.clone()));
            batch.push(new_job(file.clone()));
            batch.push(new_job(b"{}".to_vec()));
        }
        store.enqueue_batch(batch, now).await.unwrap();
        let running = store
            .take(&["q".to_string()], "w", None, Duration::from_secs(30), now)
            .await
            .unwrap()
            .expect("a job");
        assert_eq!(running.job.payload, apart);
        assert_eq!(store.backend().payloads.len(), 100);
        assert_eq!(files(), 100);

        let purged = store
            .purge_jobs("q", Some(Status::Pending), now)
            .await
            .unwrap();
        assert_eq!(purged, 299);
        assert_eq!(
            store.backend().payloads.len(),
            1,
            "only the RUNNING job's payload stays apart"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while files() != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{} payload files stay",
                files()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(store.get(running.job.id).await.unwrap().payload, apart);
    }

    /// ListJobs by an indexed status walks the index's id set across its
    /// chunks, in id order, and skips jobs that changed status.
    #[tokio::test]
    async fn list_by_status_pages_through_the_status_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&Config::with_data(dir.path())).unwrap();
        let now = SystemTime::now();
        let batch = (0..3 * LIST_CHUNK + 7)
            .map(|_| new_job(b"{}".to_vec()))
            .collect();
        let jobs = store.enqueue_batch(batch, now).await.unwrap();
        let mut failed = Vec::new();
        for (n, e) in jobs.iter().enumerate() {
            if n % 3 == 0 {
                store.cancel(e.job.id, "x".into(), now).await.unwrap();
                failed.push(e.job.id);
            }
        }
        let (mut seen, mut after) = (Vec::new(), None);
        loop {
            let page = store
                .list(ListFilter {
                    status: Some(Status::Failed),
                    after,
                    limit: 100,
                    ..ListFilter::default()
                })
                .await
                .unwrap();
            assert!(page.jobs.iter().all(|j| j.status == Status::Failed));
            seen.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, failed);
        let pending = store
            .list(ListFilter {
                status: Some(Status::Pending),
                limit: 10_000,
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(pending.jobs.len(), jobs.len() - failed.len());
        assert_eq!(pending.next, None);
    }

    /// Every page of a listing, followed by its `next`.
    async fn list_all(store: &SledStore, filter: ListFilter) -> Vec<JobId> {
        let (mut seen, mut after) = (Vec::new(), None);
        loop {
            let page = store
                .list(ListFilter {
                    after,
                    ..filter.clone()
                })
                .await
                .unwrap();
            seen.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(next) => after = Some(next),
                None => return seen,
            }
        }
    }

    #[tokio::test]
    async fn list_by_queue_or_key_pages_through_the_queue_index_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::with_data(dir.path());
        let now = SystemTime::now();
        let queue_of = |n: usize| ["a", "b", "c"][n % 3];
        let mut expected: HashMap<(&str, Option<Status>), Vec<JobId>> = HashMap::new();
        let mut keyed = Vec::new();
        {
            let store = SledStore::open(&config).unwrap();
            let batch = (0..3 * LIST_CHUNK + 7)
                .map(|n| NewJob {
                    queue: queue_of(n).into(),
                    key: (n % 100 == 1).then(|| "order-4711".to_owned()),
                    ..new_job(b"{}".to_vec())
                })
                .collect();
            let jobs = store.enqueue_batch(batch, now).await.unwrap();
            // (An entry whose key is taken returns the existing job.)
            for (n, e) in jobs.iter().enumerate().filter(|(_, e)| e.created) {
                let status = match n % 4 == 0 {
                    true => {
                        store.cancel(e.job.id, "x".into(), now).await.unwrap();
                        Status::Failed
                    }
                    false => Status::Pending,
                };
                expected
                    .entry((queue_of(n), None))
                    .or_default()
                    .push(e.job.id);
                expected
                    .entry((queue_of(n), Some(status)))
                    .or_default()
                    .push(e.job.id);
                if e.job.key.is_some() {
                    keyed.push(e.job.id);
                }
            }
            store.close().await.unwrap();
        }
        // One job per queue holds the key: the first of each queue's.
        assert_eq!(keyed.len(), 3);
        for reopened in [false, true] {
            let store = SledStore::open(&config).unwrap();
            assert_eq!(
                store.backend().rebuilt() == Rebuilt::FromSaved,
                !reopened,
                "the first open reads the saved indexes"
            );
            for queue in ["a", "b", "c"] {
                for status in [None, Some(Status::Pending), Some(Status::Failed)] {
                    let filter = ListFilter {
                        queue: Some(queue.into()),
                        status,
                        limit: 100,
                        ..ListFilter::default()
                    };
                    assert_eq!(
                        list_all(&store, filter).await,
                        expected[&(queue, status)],
                        "{queue} {status:?}"
                    );
                }
            }
            let nothing = ListFilter {
                queue: Some("nosuch".into()),
                ..ListFilter::default()
            };
            assert!(list_all(&store, nothing).await.is_empty());
            let by_key = ListFilter {
                key: Some("order-4711".into()),
                limit: 2,
                ..ListFilter::default()
            };
            assert_eq!(list_all(&store, by_key).await, keyed);
            // No clean stop the second time: the indexes come from records.
            drop(store);
        }
    }

    /// A read that loaded a record just before the job was deleted (reads
    /// do not hold the lock) finds it gone, not corrupt.
    #[tokio::test]
    async fn a_payload_deleted_after_its_record_was_read_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(&Config::with_data(dir.path())).unwrap();
        let new = new_job(vec![b'p'; 4096]);
        let id = store.enqueue(new, SystemTime::now()).await.unwrap().job.id;
        let sled = store.backend();
        let (mut job, payload) = sled.load_record(id).unwrap();
        store.delete(id).await.unwrap();
        assert!(matches!(
            sled.fill(&mut job, payload),
            Err(Error::NotFound(gone)) if gone == id
        ));
        // A payload missing under a record that is still there is corrupt.
        let other = store
            .enqueue(new_job(vec![b'p'; 4096]), SystemTime::now())
            .await
            .unwrap()
            .job
            .id;
        sled.payloads.remove(record_key(other)).unwrap();
        assert!(matches!(store.get(other).await, Err(Error::Corrupt(_))));
    }

    // The vendored sled's leaf splits (`vendor/sled/JOBQ.md`, changes 5
    // and 6).

    /// Leaves on the lowest level of `tree`, from sled's own dump of it
    /// (a line per node, `\t\t<pid>: Node {..}`, under a `level N:` line
    /// per level; the leaves are the last level).
    fn leaves(tree: &sled::Tree) -> usize {
        let dump = format!("{tree:?}");
        let lowest = dump.rsplit("level ").next().unwrap();
        lowest.lines().filter(|l| l.starts_with("\t\t")).count()
    }

    /// A store whose payloads of `payload` bytes are in the `payloads`
    /// tree (over the record's inline limit, under the file threshold),
    /// with `jobs` of them enqueued. Returns their ids.
    async fn filled(config: &mut Config, jobs: usize, payload: &[u8]) -> Vec<JobId> {
        config.payload_file_bytes = 16 * 1024;
        assert!(payload.len() > record::INLINE_MAX && payload.len() < 16 * 1024);
        let store = SledStore::open(config).unwrap();
        let mut ids = Vec::new();
        for _ in 0..jobs {
            let job = new_job(payload.to_vec());
            ids.push(store.enqueue(job, SystemTime::now()).await.unwrap().job.id);
        }
        ids
    }

    /// Job ids ascend, so every enqueue lands in the rightmost leaf of
    /// `jobs` and of `payloads`. Split in half there, each leaf behind the
    /// tip stayed half full (9 of a split's 17): 144 leaves for 1,300
    /// records, each page with its own entry in sled's page table while
    /// paged out. Split unevenly, they keep 13: 100 leaves. `payloads`
    /// fills its leaves by bytes (`PAYLOAD_LEAF_BYTES`): the tip splits at
    /// its first 32 KiB, 32 payloads of 1 KiB, and keeps 28 of them, so
    /// 47 leaves (sled's rule made 100 here, and 144 before change 5).
    /// Every job reads back after a reopen.
    #[tokio::test]
    async fn ascending_ids_leave_the_leaves_behind_the_tip_full() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::with_data(dir.path());
        let (jobs, payload) = (1_300, vec![b'p'; 1024]);
        let ids = filled(&mut config, jobs, &payload).await;
        {
            let store = SledStore::open(&config).unwrap();
            let sled = store.backend();
            for (name, tree, expected) in [
                ("jobs", &sled.jobs, 100..=101),
                ("payloads", &sled.payloads, 47..=48),
            ] {
                let leaves = leaves(tree);
                assert!(
                    expected.contains(&leaves),
                    "{name}: {leaves} leaves for {jobs} records"
                );
            }
            for id in ids {
                assert_eq!(store.get(id).await.unwrap().payload, payload, "{id:?}");
            }
        }
    }

    /// sled writes a node bigger than a quarter of a log segment (~128 KiB)
    /// as a blob file, and its cache weighs such a node by the blob's
    /// pointer, so it is never evicted: 1 GiB of 15 KiB payloads held
    /// 1.4 GiB of RSS. A leaf of 8 or more items now also splits once it
    /// passes 64 KiB, so 15 KiB payloads (9 of them made a leaf of
    /// 135 KiB) split at 8, ~120 KiB, and leave no blob.
    #[tokio::test]
    async fn payloads_just_under_the_file_threshold_make_no_blob_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::with_data(dir.path());
        let payload = vec![b'p'; 15 * 1024];
        let ids = filled(&mut config, 200, &payload).await;
        let blobs = dir.path().join("blobs");
        let count = std::fs::read_dir(&blobs).map_or(0, |d| d.count());
        assert_eq!(count, 0, "sled blob files in {}", blobs.display());
        let store = SledStore::open(&config).unwrap();
        for id in ids {
            assert_eq!(store.get(id).await.unwrap().payload, payload, "{id:?}");
        }
    }
}
