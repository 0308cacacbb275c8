//! What a transition costs sled in write syscalls and bytes. Its own test
//! binary, so that `/proc/self/io` (which counts every thread of the
//! process) sees nothing but these stores, one test at a time.
//!
//! A regression guard: single-record changes once went through
//! `Tree::apply_batch`, which in sled 0.34 rolls the log buffer twice per
//! call (two extra `pwrite`s and `sync_file_range`s on sled's I/O threads),
//! and the server got 2-3x slower without any test noticing. With plain
//! inserts, sled writes its log once per group-commit round.
//!
//! Linux only: `/proc/self/io`, and `fallocate` (the vendored sled's
//! segment allocation).
#![cfg(target_os = "linux")]

use std::time::{Duration, SystemTime};

use jobq_server::{
    job::Leased,
    job::{JobId, NewJob},
    store::{sled::SledStore, Store},
    Config,
};
use tempfile::TempDir;

/// The counters are the whole process's: the tests here take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A counter of this process (all threads) from `/proc/self/io`.
fn io_counter(name: &str) -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("read /proc/self/io");
    io.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /proc/self/io"))
}

/// Write-family syscalls made so far.
fn write_syscalls() -> u64 {
    io_counter("syscw")
}

/// Bytes passed to write-family syscalls so far.
fn bytes_written() -> u64 {
    io_counter("wchar")
}

/// A current-thread runtime without an I/O driver: one that parks on epoll
/// is woken through an eventfd write, which /proc/self/io would count too.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn new_job(payload: Vec<u8>) -> NewJob {
    NewJob {
        queue: "q".into(),
        kind: "send-email".into(),
        payload,
        key: None,
        max_attempts: 3,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: jobq_server::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    }
}

/// Leases the first due job of queue `q`.
async fn take(store: &SledStore) -> Option<Leased> {
    store
        .take(
            &["q".to_string()],
            "w",
            None,
            Duration::from_secs(30),
            SystemTime::now(),
        )
        .await
        .unwrap()
}

fn open(dir: &TempDir) -> SledStore {
    let mut config = Config::with_data(dir.path());
    config.cache_bytes = 8 * 1024 * 1024;
    SledStore::open(&config).unwrap()
}

#[test]
fn one_job_changes_cost_one_log_write_per_commit_round() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(changes());
}

async fn changes() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    const JOBS: u64 = 200;

    let writes_before = write_syscalls();
    let rounds_before = store.flush_rounds();
    for n in 0..JOBS {
        let new = new_job(format!("order-{n}").into_bytes());
        store.enqueue(new, SystemTime::now()).await.unwrap();
        let leased = take(&store).await.expect("the job just enqueued is due");
        store
            .ack(leased.job.id, leased.lease_id, SystemTime::now())
            .await
            .unwrap();
    }
    let writes = write_syscalls() - writes_before;
    let rounds = store.flush_rounds() - rounds_before;

    // 600 changes, each awaited: about one round apiece (a take becomes
    // durable with the next round, so sometimes fewer).
    assert!(
        rounds >= JOBS,
        "{rounds} rounds for {JOBS} enqueues and acks"
    );
    // One log write per round (measured: exactly that), plus slack for a
    // segment header; apply_batch per change measured about 2.2 per round.
    assert!(
        writes <= rounds + JOBS / 10,
        "{writes} write syscalls for {rounds} commit rounds over {} changes",
        3 * JOBS
    );
}

#[test]
fn a_take_and_a_heartbeat_write_the_same_bytes_whatever_the_payload_size() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    runtime().block_on(async {
        let small = take_and_heartbeat_bytes(100).await;
        let large = take_and_heartbeat_bytes(256 * 1024).await;
        println!(
            "bytes written per take, per lease per heartbeat: {small:?} with 100 B payloads (in the record), {large:?} with 256 KiB (apart)"
        );
        // The target: at most 1 KiB per job plus its history entry, and no
        // more for a big payload than for a small one (sled's log frames
        // vary by a few bytes, so allow a little).
        for (what, small, large) in [("take", small.0, large.0), ("heartbeat", small.1, large.1)] {
            assert!(large <= 2048, "{large} bytes per {what}");
            assert!(
                large <= small + 256,
                "a {what} over 256 KiB payloads wrote {large} bytes per lease, over 100 B ones {small}"
            );
        }
    });
}

/// Leases 20 jobs with `payload` bytes each, then heartbeats them 10
/// times. Returns the bytes written per take and per lease per heartbeat,
/// each counted from a flushed store up to the flush after them.
async fn take_and_heartbeat_bytes(payload: usize) -> (u64, u64) {
    const LEASES: u64 = 20;
    const BEATS: u64 = 10;
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let batch = (0..LEASES).map(|_| new_job(vec![b'x'; payload])).collect();
    store.enqueue_batch(batch, SystemTime::now()).await.unwrap();
    store.flush().await.unwrap();
    let before = bytes_written();
    let mut leases = Vec::new();
    for _ in 0..LEASES {
        let leased = take(&store).await.expect("due");
        assert_eq!(
            leased.job.payload.len(),
            payload,
            "a take hands the payload out"
        );
        leases.push((leased.job.id, leased.lease_id));
    }
    store.flush().await.unwrap();
    let taken = bytes_written() - before;
    let before = bytes_written();
    for _ in 0..BEATS {
        let extended = store
            .extend(&leases, &[], None, SystemTime::now())
            .await
            .unwrap();
        assert!(extended.iter().all(Result::is_ok));
    }
    store.flush().await.unwrap();
    let written = bytes_written() - before;
    // The payload is still there, whole.
    let job = store.get(leases[0].0).await.unwrap();
    assert_eq!(job.payload, vec![b'x'; payload]);
    (taken / LEASES, written / (LEASES * BEATS))
}

/// sled's segments, which the vendored sled allocates whole when its log
/// grows past the end of its file (vendor/sled/JOBQ.md, change 3).
const SEGMENT: u64 = 512 * 1024;

/// Whether the filesystem under `dir` can allocate ahead (`fallocate`). On
/// one that cannot, the vendored sled grows its log write by write, as
/// sled does; the tests check that fallback instead (every job still
/// there), not the whole segments.
fn can_allocate_ahead(dir: &std::path::Path) -> bool {
    use std::os::unix::io::AsRawFd;

    let probe = std::fs::File::create(dir.join("probe")).unwrap();
    // SAFETY: a valid descriptor, owned by `probe` for the call.
    let rc = unsafe { libc::fallocate(probe.as_raw_fd(), 0, 0, 4096) };
    if rc != 0 {
        // As the vendored sled does, whatever the error (EOPNOTSUPP on a
        // filesystem without it, others on unusual mounts).
        eprintln!(
            "no fallocate here ({}): checking the fallback",
            std::io::Error::last_os_error()
        );
    }
    std::fs::remove_file(dir.join("probe")).unwrap();
    rc == 0
}

/// Copies the folder `from` (sled's files, jobq's own) to `to`, as a crash
/// leaves it: what the kernel holds for those files, whatever was synced.
fn copy_folder(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_folder(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Enqueues 4 KiB jobs until sled's log spans three segments. If `whole`
/// (the filesystem allocates ahead), checks after every durable reply that
/// the log ends at a segment's end: that reply's fdatasync had no new file
/// size to commit. Returns their ids.
async fn fill_three_segments(store: &SledStore, log: &std::path::Path, whole: bool) -> Vec<JobId> {
    let mut ids = Vec::new();
    // 4 KiB payloads stay in sled's log (payload files start at 16 KiB).
    while std::fs::metadata(log).unwrap().len() < 3 * SEGMENT {
        let new = new_job(vec![b'x'; 4096]);
        ids.push(store.enqueue(new, SystemTime::now()).await.unwrap().job.id);
        let len = std::fs::metadata(log).unwrap().len();
        if whole {
            assert_eq!(
                len % SEGMENT,
                0,
                "log length {len} after {} jobs",
                ids.len()
            );
        }
    }
    ids
}

/// Every job of `ids` is in the store with its payload, and a new job gets
/// a new id.
async fn all_there(store: &SledStore, ids: &[JobId]) {
    for id in ids {
        let job = store.get(*id).await.unwrap();
        assert_eq!(job.payload.len(), 4096, "job {id}");
    }
    let next = store.enqueue(new_job(b"after".to_vec()), SystemTime::now());
    let next = next.await.unwrap().job.id;
    assert!(!ids.contains(&next), "id {next} handed out again");
}

#[test]
fn the_log_grows_by_whole_allocated_segments_and_reopens_whole() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new().unwrap();
    let whole = can_allocate_ahead(dir.path());
    let log = dir.path().join("db");
    let ids = runtime().block_on(async { fill_three_segments(&open(&dir), &log, whole).await });
    // Reopened after the store is dropped (without `close`, so every
    // record is read again), the zeros past the last write read as the
    // log's end.
    runtime().block_on(async { all_there(&open(&dir), &ids).await });
}

#[test]
fn a_crash_inside_an_allocated_segment_or_before_its_first_write_loses_nothing_durable() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new().unwrap();
    let whole = can_allocate_ahead(dir.path());
    let crashed = TempDir::new().unwrap();
    let ahead = TempDir::new().unwrap();
    let ids = runtime().block_on(async {
        let store = open(&dir);
        let ids = fill_three_segments(&store, &dir.path().join("db"), whole).await;
        // The store is still open: these copies are what SIGKILL leaves.
        copy_folder(dir.path(), crashed.path());
        copy_folder(dir.path(), ahead.path());
        ids
    });
    // The copy as it was: the log ends inside its last, allocated segment.
    runtime().block_on(async { all_there(&open(&crashed), &ids).await });
    // One more segment allocated, and the crash before its first write.
    let log = std::fs::OpenOptions::new()
        .write(true)
        .open(ahead.path().join("db"))
        .unwrap();
    let len = log.metadata().unwrap().len();
    log.set_len(len.next_multiple_of(SEGMENT) + SEGMENT)
        .unwrap();
    drop(log);
    runtime().block_on(async { all_there(&open(&ahead), &ids).await });
}
