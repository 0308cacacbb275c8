//! Opening the store: the startup scan that rebuilds the indexes from
//! every record (in parts, on several threads), and the indexes saved at a
//! clean stop, which spare the next start that scan (see the module docs of
//! [`super`]).

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, OnceLock,
    },
    time::Instant,
};

use super::{
    decode, flusher, flusher::Flusher, index::Index, payload_files::PayloadFiles, record,
    record_key, schedules, Rebuilt, Sled, SledError, PAYLOAD_LEAF_BYTES, SAVED_FILE,
    SAVED_TOKEN_KEY, SAVED_TOKEN_TAG,
};
use crate::{
    config::{Config, FaultSync},
    error::{Error, Result},
};

/// What the sled engine is opened with: its own settings, not the whole
/// server configuration.
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// The data folder (`--data`).
    pub data: std::path::PathBuf,
    /// sled's page cache (`--cache-bytes`).
    pub cache_bytes: u64,
    /// The smallest payload kept in a file of its own
    /// (`--payload-file-bytes`).
    pub payload_file_bytes: u64,
    /// Injected fsync faults (tests only).
    pub fault: Option<FaultSync>,
}

impl SledOptions {
    /// The engine's settings from the server's configuration.
    pub fn of(config: &Config) -> SledOptions {
        SledOptions {
            data: config.data.clone(),
            cache_bytes: config.cache_bytes,
            payload_file_bytes: config.payload_file_bytes,
            fault: config.fault_sync(),
        }
    }
}

impl Sled {
    /// Opens (or creates) the database in `options.data` and rebuilds the
    /// in-memory indexes from the records.
    ///
    /// # Errors
    /// [`Error::Storage`] if sled cannot open the folder, [`Error::Corrupt`]
    /// if a record does not decode or the flusher cannot start.
    pub fn open(options: &SledOptions) -> Result<Sled> {
        std::fs::create_dir_all(&options.data).map_err(|e| {
            Error::Corrupt(format!("cannot create {}: {e}", options.data.display()))
        })?;
        let open = || {
            sled::Config::new()
                .path(&options.data)
                .cache_capacity(options.cache_bytes)
                // Our flusher makes every acknowledged write durable; sled's
                // own periodic fsync would only compete with it.
                .flush_every_ms(None)
                .mode(sled::Mode::HighThroughput)
                .open()
                .map_err(SledError::from)
        };
        let mut db = reopen(open)?;
        let mut jobs = db.open_tree("jobs").map_err(SledError::from)?;
        let saved_file = options.data.join(SAVED_FILE);
        let started = Instant::now();
        let (mut index, rebuilt) = match take_saved(&db, &jobs, &options.data, &saved_file)? {
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
        let file_min = usize::try_from(options.payload_file_bytes)
            .unwrap_or(usize::MAX)
            .max(record::INLINE_MAX + 1);
        let files = PayloadFiles::open(&options.data, file_min)?;
        // A file is its job's while the job's record says so: not after an
        // enqueue a crash cut short, nor after a replace put the job's new
        // payload in its record.
        // (A record that cannot be read keeps its file: only a record read
        // in another layout frees it.)
        let orphans = files.collect(|id| {
            index.contains(id)
                && match jobs.get(record_key(id)) {
                    Ok(Some(value)) => decode(&record_key(id), &value)
                        .map_or(true, |(_, payload)| {
                            matches!(payload, record::Payload::File(_))
                        }),
                    Ok(None) | Err(_) => true,
                }
        })?;
        if orphans > 0 {
            tracing::info!(
                orphans,
                "removed payload files of enqueues or replaces cut short by a crash"
            );
        }
        let results = db.open_tree("results").map_err(SledError::from)?;
        let progress = db.open_tree("progress").map_err(SledError::from)?;
        let paused_tree = db.open_tree("paused").map_err(SledError::from)?;
        for record in paused_tree.iter() {
            let (key, _) = record.map_err(SledError::from)?;
            let queue = String::from_utf8(key.to_vec())
                .map_err(|_| Error::Corrupt(format!("undecodable paused queue {key:?}")))?;
            index.set_paused(&queue, true);
        }
        let policies_tree = db.open_tree("policies").map_err(SledError::from)?;
        for record in policies_tree.iter() {
            let (key, value) = record.map_err(SledError::from)?;
            let queue = String::from_utf8(key.to_vec())
                .map_err(|_| Error::Corrupt(format!("undecodable policy queue {key:?}")))?;
            let policy = postcard::from_bytes(&value)
                .map_err(|e| Error::Corrupt(format!("undecodable policy of {queue:?}: {e}")))?;
            index.set_policy(&queue, policy);
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
        let flusher = Flusher::start(db.clone(), &options.data, options.fault)?;
        Ok(Sled {
            flusher,
            db,
            jobs,
            payloads,
            files,
            results,
            progress,
            paused_tree,
            policies_tree,
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
    pub(super) fn seal(&self) {
        let _index = self.lock();
        self.sealed.store(true, Ordering::Relaxed);
    }

    /// Saves the indexes of a sealed store whose every write is durable:
    /// the file first, durably; then its token, which the caller's next
    /// commit round makes durable. Saving is an optimisation: if it fails
    /// the next start reads the records, so the failure is only logged.
    pub(super) fn save(&self) {
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
pub(super) fn scan(jobs: &sled::Tree) -> Result<Index> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(SCAN_THREADS));
    scan_parts(jobs, threads, SCAN_SPLIT_MIN)
}

/// [`scan`] on up to `threads` threads, if the ids span `split_min` or
/// more.
pub(super) fn scan_parts(jobs: &sled::Tree, threads: usize, split_min: u64) -> Result<Index> {
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
pub(super) fn scan_range(jobs: &sled::Tree, start: Option<u64>, end: Option<u64>) -> Result<Index> {
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
