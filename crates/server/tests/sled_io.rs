//! What a transition costs sled in write syscalls. Its own test binary, so
//! that `/proc/self/io` (which counts every thread of the process) sees
//! nothing but this store.
//!
//! A regression guard: single-record changes once went through
//! `Tree::apply_batch`, which in sled 0.34 rolls the log buffer twice per
//! call (two extra `pwrite`s and `sync_file_range`s on sled's I/O threads),
//! and the server got 2-3x slower without any test noticing. With plain
//! inserts, sled writes its log once per group-commit round.

use std::time::{Duration, SystemTime};

use jobq_server::{
    job::NewJob,
    store::{sled::SledStore, Store},
    Config,
};
use tempfile::TempDir;

/// Write-family syscalls made so far by this process (all threads).
fn write_syscalls() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("read /proc/self/io");
    io.lines()
        .find_map(|line| line.strip_prefix("syscw:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("syscw in /proc/self/io")
}

#[test]
fn one_job_changes_cost_one_log_write_per_commit_round() {
    // No I/O driver: a runtime that parks on epoll is woken through an
    // eventfd write, which /proc/self/io would count too.
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(changes());
}

async fn changes() {
    let dir = TempDir::new().unwrap();
    let mut config = Config::with_data(dir.path());
    config.cache_bytes = 8 * 1024 * 1024;
    let store = SledStore::open(&config).unwrap();
    let queues = vec!["q".to_string()];
    const JOBS: u64 = 200;

    let writes_before = write_syscalls();
    let rounds_before = store.flush_rounds();
    for n in 0..JOBS {
        let new = NewJob {
            queue: "q".into(),
            kind: "send-email".into(),
            payload: format!("order-{n}").into_bytes(),
            key: None,
            max_attempts: 3,
            delay: Duration::ZERO,
            priority: 0,
            metadata: Default::default(),
        };
        store.enqueue(new, SystemTime::now()).await.unwrap();
        let leased = store
            .take(
                &queues,
                "w",
                None,
                Duration::from_secs(30),
                SystemTime::now(),
            )
            .await
            .unwrap()
            .expect("the job just enqueued is due");
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
