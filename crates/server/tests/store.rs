//! sled-only store tests: what the contract suite (`tests/contract.rs`)
//! cannot say for every backend: group-commit flush rounds, payload and
//! blob files,
//! and a throughput measurement.

// The shared helpers are included whole; this file uses some of them.
#![allow(dead_code)]

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use jobq_server::{
    job::{Job, LeaseId, Leased, NewJob},
    machine::Backoff,
    store::{sled::SledStore, FailReport, Store},
    Config,
};
use tempfile::TempDir;
use tonic::Code;

include!("contract/helpers.rs");

fn open(dir: &TempDir) -> SledStore {
    open_with(dir, |_| {})
}

fn open_with(dir: &TempDir, set: impl FnOnce(&mut Config)) -> SledStore {
    let mut config = Config::with_data(dir.path());
    config.backoff_base = BACKOFF.base;
    config.backoff_cap = BACKOFF.cap;
    config.cache_bytes = 8 * 1024 * 1024;
    set(&mut config);
    SledStore::open(&config).expect("open the store")
}

fn fresh() -> (TempDir, SledStore) {
    let dir = TempDir::new().expect("temp dir");
    let store = open(&dir);
    (dir, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_share_flush_rounds() {
    let (_dir, store) = fresh();
    let store = Arc::new(store);
    let before = store.flush_rounds();
    let enqueues = (0..64).map(|i| {
        let store = store.clone();
        tokio::spawn(async move { store.enqueue(new_job("q", None, 0), at(i)).await })
    });
    for result in futures::future::join_all(enqueues).await {
        assert!(result.unwrap().unwrap().created);
    }
    let rounds = store.flush_rounds() - before;
    assert!(
        (1..64).contains(&rounds),
        "64 enqueues took {rounds} flush rounds"
    );
    store.flush().await.unwrap();
    assert!(
        store.flush_rounds() > before + rounds,
        "flush runs a round of its own"
    );
}

#[tokio::test]
async fn a_large_payload_survives_a_restart() {
    let payload: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
    // Over `--payload-file-bytes` it goes to a payload file of its own,
    // synced before its record is written.
    // Enqueues the payload into a fresh store, stopped after.
    let enqueue = |dir: &TempDir, set: fn(&mut Config)| {
        let store = open_with(dir, set);
        let new = NewJob {
            payload: payload.clone(),
            ..new_job("q", None, 0)
        };
        async move { store.enqueue(new, at(0)).await.unwrap().job }
    };
    let dir = TempDir::new().unwrap();
    let in_file = |c: &mut Config| c.payload_file_bytes = 16 * 1024;
    let job = enqueue(&dir, in_file).await;
    let file = dir.path().join("payloads").join(job.id.0.to_string());
    assert_eq!(std::fs::read(&file).unwrap().len(), payload.len());
    let store = open_with(&dir, in_file);
    assert!(store.get(job.id).await.unwrap().payload == payload);

    // Kept in sled (`--payload-file-bytes` above its size), over a quarter
    // of sled's 512 KiB segment a record goes to a blob file of its own,
    // which the flusher syncs separately.
    let dir = TempDir::new().unwrap();
    let in_sled = |c: &mut Config| c.payload_file_bytes = 1 << 30;
    let job = enqueue(&dir, in_sled).await;
    assert!(
        dir.path()
            .join("blobs")
            .read_dir()
            .unwrap()
            .next()
            .is_some(),
        "stored as a blob"
    );
    let store = open_with(&dir, in_sled);
    assert!(store.get(job.id).await.unwrap().payload == payload);
}

/// Rough numbers for the report: `cargo test -p jobq-server --release
/// --test store throughput -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, not a test"]
async fn throughput() {
    let (_dir, store) = fresh();
    let store = Arc::new(store);
    let start = std::time::Instant::now();
    for i in 0..500 {
        store.enqueue(new_job("seq", None, 0), at(i)).await.unwrap();
    }
    let seq = start.elapsed();
    println!("sequential enqueue: {:.0}/s", 500.0 / seq.as_secs_f64());

    for writers in [16u64, 64] {
        let (rounds, start) = (store.flush_rounds(), std::time::Instant::now());
        let per = 10_000 / writers;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..writers {
            let store = store.clone();
            tasks.spawn(async move {
                for i in 0..per {
                    store.enqueue(new_job("con", None, 0), at(i)).await.unwrap();
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        let took = start.elapsed();
        println!(
            "{writers} concurrent writers: {:.0} enqueues/s, {} flush rounds for {} enqueues",
            (per * writers) as f64 / took.as_secs_f64(),
            store.flush_rounds() - rounds,
            per * writers
        );
    }

    let start = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..16 {
        let store = store.clone();
        tasks.spawn(async move {
            let mut n = 0u64;
            let worker = format!("w{w}");
            while let Some(l) = store
                .take(
                    &qs(&["con"]),
                    &worker,
                    None,
                    Duration::from_secs(60),
                    at(1_000_000),
                )
                .await
                .unwrap()
            {
                store
                    .ack(l.job.id, l.lease_id, at(1_000_001))
                    .await
                    .unwrap();
                n += 1;
            }
            n
        });
    }
    let mut n = 0;
    while let Some(r) = tasks.join_next().await {
        n += r.unwrap();
    }
    println!(
        "16 workers take+ack: {:.0} jobs/s",
        n as f64 / start.elapsed().as_secs_f64()
    );
}
