//! Group commit: one thread makes sled's writes durable for every waiting
//! writer at once.
//!
//! A writer puts its change into sled (in memory, in sled's log buffer),
//! then awaits [`Flusher::durable`]. That registers for the next flush
//! *round that starts after the call*: a round that was already running may
//! have missed the write. The flusher thread runs one round for everybody
//! registered so far — `db.flush()` writes sled's log buffers, then one
//! `fdatasync` of the log file makes them stable — and publishes the
//! round's number. Under load, a round serves every writer that arrived
//! while the previous one ran, so the number of fsyncs grows with time, not
//! with the number of jobs.
//!
//! Why a std thread and blocking `db.flush()`: sled 0.34.7's `flush_async`
//! deadlocks with a handful of concurrent callers, and a flush must never
//! run while the store's state mutex is held.
//!
//! Why the extra `fdatasync`: sled writes its log with `sync_file_range`,
//! which neither flushes the drive's cache nor covers metadata such as a
//! grown file length. Large values (over a quarter of a segment) go to
//! `blobs/` files that sled never syncs, so a round syncs new blob files
//! too.
//!
//! A failed round is final: after a failed fsync the kernel may have
//! dropped the dirty pages, so a later successful fsync proves nothing
//! about them (PostgreSQL's "fsyncgate", 2018). Every waiter, then and
//! later, gets [`Error::Corrupt`], and [`Flusher::broken`] resolves: the
//! store fail-stops and the server exits, so that a supervisor restarts it
//! from what is really on disk.
//!
//! Blob files are synced by name *and length*: a blob that was still being
//! written when a round listed it is synced again by the next round.

use std::{
    collections::HashMap,
    ffi::OsString,
    fs::File,
    future::Future,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Condvar, Mutex, MutexGuard, PoisonError,
    },
    thread::JoinHandle,
};

use tokio::sync::watch;

use crate::{
    config::FaultSync,
    error::{Error, Result},
};

/// What the flusher has done so far, as seen by async waiters.
#[derive(Debug, Clone, Default)]
struct Progress {
    /// The number of the last round that completed successfully.
    completed: u64,
    /// Set when a round failed, or the flusher stopped: no later round
    /// will complete.
    failed: Option<Arc<str>>,
    /// Set when a round failed (not on a clean stop).
    broken: Option<Arc<str>>,
}

/// The rounds asked for and begun, shared by writers and the thread.
#[derive(Debug, Default)]
struct Rounds {
    /// The highest round number some writer waits for.
    requested: u64,
    /// The number of the last round the thread began.
    started: u64,
    /// Set by `Drop`: finish the requested rounds, then stop.
    shutdown: bool,
}

/// Called after each round with its duration and the writes it covered.
pub type RoundHook = Arc<dyn Fn(std::time::Duration, u64) + Send + Sync>;

struct Shared {
    rounds: Mutex<Rounds>,
    wake: Condvar,
    progress: watch::Sender<Progress>,
    /// Rounds run so far, for tests and benchmarks.
    flushes: AtomicU64,
    /// Durable writes asked for since the last round began.
    writes: AtomicU64,
    hook: std::sync::OnceLock<RoundHook>,
}

impl Shared {
    fn rounds(&self) -> MutexGuard<'_, Rounds> {
        // The thread and writers only do arithmetic under this lock; a
        // poisoned lock still holds consistent counters.
        self.rounds.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The group-commit flusher of one sled database. Dropping it finishes the
/// rounds already requested and stops its thread.
pub struct Flusher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Makes everything written to `db` (whose folder is `path`) durable, on
/// this thread: for startup, before the flusher runs.
///
/// # Errors
/// [`Error::Corrupt`] if sled cannot flush or the fsync fails.
pub fn sync_once(db: &sled::Db, path: &Path) -> Result<()> {
    db.flush()
        .map_err(|e| Error::Corrupt(format!("sled flush failed: {e}")))?;
    File::open(path.join("db"))
        .and_then(|log| log.sync_data())
        .map_err(|e| Error::Corrupt(format!("fsync of sled's log failed: {e}")))
}

impl Flusher {
    /// Starts the flusher thread for `db`, whose folder is `path`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if sled's log file cannot be opened or the thread
    /// cannot be started.
    /// `fault` injects a sync failure for tests of fail-stop.
    pub fn start(db: sled::Db, path: &Path, fault: Option<FaultSync>) -> Result<Flusher> {
        // sled 0.34 keeps its whole log in `<path>/db` (config.rs `db_path`).
        let log = File::options()
            .read(true)
            .write(true)
            .open(path.join("db"))
            .map_err(|e| Error::Corrupt(format!("cannot open sled's log file for fsync: {e}")))?;
        let shared = Arc::new(Shared {
            rounds: Mutex::new(Rounds::default()),
            wake: Condvar::new(),
            progress: watch::Sender::new(Progress::default()),
            flushes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            hook: std::sync::OnceLock::new(),
        });
        let syncer = Syncer {
            db,
            log,
            blobs: Blobs::new(path.join("blobs")),
            fault,
            synced: 0,
        };
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("jobq-flusher".into())
            .spawn(move || run(&thread_shared, syncer))
            .map_err(|e| Error::Corrupt(format!("cannot start the flusher thread: {e}")))?;
        Ok(Flusher {
            shared,
            thread: Some(thread),
        })
    }

    /// Waits until everything written to sled before this call is on disk.
    ///
    /// The round is registered when `durable` is called, not when the
    /// future is first polled, so call it right after the write.
    ///
    /// # Errors
    /// [`Error::Corrupt`] if the round (or an earlier one) failed, or the
    /// flusher stopped.
    pub fn durable(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        let target = self.request();
        let mut progress = self.shared.progress.subscribe();
        async move {
            let seen = progress
                .wait_for(|p| p.completed >= target || p.failed.is_some())
                .await
                .map_err(|_| Error::Corrupt("the flusher stopped".into()))?;
            match &seen.failed {
                // A round that completed before the failure still counts.
                Some(_) if seen.completed >= target => Ok(()),
                Some(cause) => Err(Error::Corrupt(cause.to_string())),
                None => Ok(()),
            }
        }
    }

    /// Asks for a round that covers everything written before this call,
    /// without waiting for it; returns the round's number. For writes whose
    /// reply does not promise durability but should reach the disk soon.
    pub fn request(&self) -> u64 {
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
        let target = {
            let mut rounds = self.shared.rounds();
            // The running round (number `started`) may have begun before our
            // write; only a round that starts after this point covers it.
            let target = rounds.started + 1;
            rounds.requested = rounds.requested.max(target);
            target
        };
        self.shared.wake.notify_one();
        target
    }

    /// Sets the hook told about every round (metrics); the first one set
    /// stays.
    pub fn on_round(&self, hook: RoundHook) {
        let _ = self.shared.hook.set(hook);
    }

    /// How many flush rounds have run so far.
    pub fn rounds(&self) -> u64 {
        self.shared.flushes.load(Ordering::Relaxed)
    }

    /// Resolves with the cause once a round failed (nothing more will be
    /// made durable); pending otherwise. Not for a clean stop.
    pub fn broken(&self) -> impl Future<Output = String> + Send + 'static {
        let mut progress = self.shared.progress.subscribe();
        async move {
            let cause = match progress.wait_for(|p| p.broken.is_some()).await {
                Ok(p) => p.broken.as_deref().map(str::to_owned),
                Err(_) => None,
            };
            match cause {
                Some(cause) => cause,
                None => std::future::pending().await,
            }
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.shared.rounds().shutdown = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the flusher thread panicked");
            }
        }
    }
}

/// The thread's loop: wait for a request, run a round, publish it.
fn run(shared: &Shared, mut syncer: Syncer) {
    // Whatever ends the loop (shutdown, a failed round, a panic), waiters
    // must not wait forever.
    struct Stopped<'a>(&'a Shared);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            // A panic is a failure nothing will retry: fail-stop now, as a
            // failed round does, rather than at the next durable write.
            let panicked = std::thread::panicking();
            self.0.progress.send_modify(|p| {
                p.failed
                    .get_or_insert_with(|| Arc::from("the flusher stopped"));
                if panicked {
                    p.broken
                        .get_or_insert_with(|| Arc::from("the flusher thread panicked"));
                }
            });
        }
    }
    let _stopped = Stopped(shared);

    loop {
        let round = {
            let mut rounds = shared.rounds();
            while rounds.requested <= rounds.started && !rounds.shutdown {
                rounds = shared
                    .wake
                    .wait(rounds)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if rounds.requested <= rounds.started {
                return; // shutting down, nothing left to do
            }
            rounds.started += 1;
            rounds.started
        };
        let batch = shared.writes.swap(0, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let result = syncer.sync();
        shared.flushes.fetch_add(1, Ordering::Relaxed);
        if let Some(hook) = shared.hook.get() {
            hook(started.elapsed(), batch);
        }
        match result {
            Ok(()) => shared.progress.send_modify(|p| p.completed = round),
            Err(cause) => {
                tracing::error!(%cause, round, "flush failed; no further writes will be acknowledged");
                shared.progress.send_modify(|p| {
                    p.failed = Some(Arc::from(cause.as_str()));
                    p.broken = Some(Arc::from(cause.as_str()));
                });
                return;
            }
        }
    }
}

/// What one round does.
struct Syncer {
    db: sled::Db,
    log: File,
    blobs: Blobs,
    /// An injected failure (tests of fail-stop).
    fault: Option<FaultSync>,
    /// Successful syncs so far.
    synced: u64,
}

impl Syncer {
    fn sync(&mut self) -> Result<(), String> {
        // A slow disk (injected): before anything is written out, so that
        // a kill during the delay loses the round's writes.
        if let Some(delay) = self.fault.and_then(|f| f.delay) {
            std::thread::sleep(delay);
        }
        self.db
            .flush()
            .map_err(|e| format!("sled flush failed: {e}"))?;
        self.blobs.sync()?;
        if let Some(fault) = self.fault {
            if fault.after.is_some_and(|after| self.synced >= after) {
                let err = std::io::Error::from_raw_os_error(fault.errno);
                return Err(format!("fsync of sled's log failed: {err} (injected)"));
            }
        }
        self.log
            .sync_data()
            .map_err(|e| format!("fsync of sled's log failed: {e}"))?;
        self.synced += 1;
        Ok(())
    }
}

/// sled's blob folder and what of it has been synced.
struct Blobs {
    dir: PathBuf,
    /// Blob files already synced, with the length they had then. A blob
    /// listed while sled was still writing it is synced again once it grew.
    synced: HashMap<OsString, u64>,
}

impl Blobs {
    fn new(dir: PathBuf) -> Blobs {
        Blobs {
            dir,
            synced: HashMap::new(),
        }
    }

    /// Syncs blob files written (or grown) since the last round, and the
    /// folder that names them; returns how many files it synced. Usually
    /// the folder is empty and this is one `readdir`.
    fn sync(&mut self) -> Result<usize, String> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(format!("cannot list sled's blobs: {e}")),
        };
        let mut present = HashMap::new();
        let mut synced = 0;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list sled's blobs: {e}"))?;
            let name = entry.file_name();
            // A blob synced before at the length it still has needs nothing:
            // one stat, not an open, a stat and a close (this runs every
            // round, over every blob of the store).
            if let (Some(&len), Ok(meta)) = (self.synced.get(&name), entry.metadata()) {
                if meta.len() == len {
                    present.insert(name, len);
                    continue;
                }
            }
            // The length is read from the open file *before* the sync, so a
            // blob still growing is recorded short and synced again later.
            let result = File::open(entry.path()).and_then(|f| {
                let len = f.metadata()?.len();
                if self.synced.get(&name) != Some(&len) {
                    f.sync_data()?;
                    synced += 1;
                }
                Ok(len)
            });
            match result {
                Ok(len) => {
                    present.insert(name, len);
                }
                // sled removed it meanwhile: nothing left to make durable.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("fsync of a sled blob failed: {e}")),
            }
        }
        self.synced = present;
        if synced > 0 {
            File::open(&self.dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| format!("fsync of sled's blob folder failed: {e}"))?;
        }
        Ok(synced)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::Blobs;

    #[test]
    fn a_blob_that_grows_after_it_was_synced_is_synced_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut blobs = Blobs::new(dir.path().join("blobs"));
        assert_eq!(blobs.sync(), Ok(0), "no folder yet");
        std::fs::create_dir(dir.path().join("blobs")).expect("mkdir");
        let path = dir.path().join("blobs").join("1");
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(b"half a blob").expect("write");
        assert_eq!(blobs.sync(), Ok(1), "a new blob is synced");
        assert_eq!(blobs.sync(), Ok(0), "an unchanged blob is not");
        // sled was still writing it when it was listed.
        file.write_all(b" and the rest").expect("write");
        assert_eq!(blobs.sync(), Ok(1), "the grown blob is synced again");
        assert_eq!(blobs.sync(), Ok(0));
    }
}
