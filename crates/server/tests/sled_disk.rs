//! What the sled store leaves on disk: replacing or deleting a schedule
//! frees its payload's storage as deleting a job does, so the data folder
//! stays bounded across a thousand replacements (and creates and deletes)
//! of schedules with 100 KB payloads, and a restart finds no leftover.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use jobq_server::{
    schedule::Schedule,
    store::{sled::SledStore, Store},
    Config,
};
use tempfile::TempDir;

/// The bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("list") {
        let entry = entry.expect("entry");
        let meta = entry.metadata().expect("metadata");
        total += if meta.is_dir() {
            disk_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

/// The files in sled's `blobs` folder (values too big for its log).
fn blob_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("blobs")).map_or(0, Iterator::count)
}

const MIB: u64 = 1024 * 1024;

/// A payload of 100 KB that differs with `seed` and does not compress.
fn payload(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..100_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn schedule(name: &str, seed: u64) -> Schedule {
    Schedule {
        name: name.into(),
        queue: "rq".into(),
        kind: "k".into(),
        payload: payload(seed),
        cron: "0 3 * * *".into(),
        timezone: "UTC".into(),
        max_attempts: 3,
        created_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seed),
        last_tick: None,
    }
}

async fn put(store: &SledStore, schedule: Schedule) {
    store
        .put_schedule(schedule, |_| Ok(()))
        .await
        .expect("put a schedule");
}

fn open(dir: &TempDir) -> SledStore {
    SledStore::open(&Config::with_data(dir.path())).expect("open the store")
}

/// Most the data folder may grow over the steady state it reached after
/// the warm-up: a few sled log segments (it grew by 0.5 MiB), far from the
/// 100 MB that the thousand payloads written would take if any were kept
/// (before chunks: 357 MiB, a blob file per write).
const SLACK: u64 = 8 * MIB;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_or_deleting_a_schedule_frees_its_payload() {
    let dir = TempDir::new().expect("tempdir");
    let store = open(&dir);
    let mut seed = 0;
    let mut next = || {
        seed += 1;
        seed
    };
    // Warm-up: sled's log reaches its working size.
    for _ in 0..50 {
        put(&store, schedule("r", next())).await;
    }
    let base = disk_bytes(dir.path());
    let mut most = base;
    for i in 0..1000 {
        put(&store, schedule("r", next())).await;
        if i % 50 == 49 {
            most = most.max(disk_bytes(dir.path()));
        }
    }
    eprintln!(
        "1,000 replacements: {base} bytes after the warm-up, at most {most}, {} blob files",
        blob_files(dir.path())
    );
    assert!(
        most <= base + SLACK,
        "the data folder grew from {base} to {most} bytes over 1,000 replacements"
    );
    for i in 0..1000 {
        put(&store, schedule("d", next())).await;
        let gone = store.delete_schedule("d").await.expect("delete");
        assert!(gone.is_some());
        if i % 50 == 49 {
            most = most.max(disk_bytes(dir.path()));
        }
    }
    eprintln!(
        "1,000 creates and deletes: at most {most} bytes, {} blob files",
        blob_files(dir.path())
    );
    assert!(
        most <= base + SLACK,
        "the data folder grew from {base} to {most} bytes over 1,000 creates and deletes"
    );
    assert!(store.delete_schedule("r").await.expect("delete").is_some());
    store.close().await.expect("close");
    drop(store);

    // A restart finds nothing left of the schedules.
    let store = open(&dir);
    assert!(store.schedules().await.expect("schedules").is_empty());
    let after = disk_bytes(dir.path());
    eprintln!(
        "after a restart: {after} bytes, {} blob files",
        blob_files(dir.path())
    );
    assert_eq!(blob_files(dir.path()), 0, "no schedule payload is left");
    assert!(after <= base + SLACK, "{after} bytes after a restart");
}

/// sled's own handle on the store's folder, once the store is dropped
/// (its I/O threads may hold the lock file for a moment).
fn raw(dir: &TempDir) -> sled::Db {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match sled::Config::new()
            .path(dir.path())
            .flush_every_ms(None)
            .open()
        {
            Ok(db) => return db,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("lock"), "{e}");
                std::thread::yield_now();
            }
            Err(e) => panic!("open sled: {e}"),
        }
    }
}

/// A record written before payloads went to chunks (the whole schedule in
/// JSON) still reads, and is freed when replaced; chunks that no record
/// refers to (a write cut short by a crash) are removed at startup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_record_reads_and_orphan_payload_chunks_go_at_startup() {
    let dir = TempDir::new().expect("tempdir");
    drop(open(&dir));
    let old = schedule("old", 1);
    {
        let db = raw(&dir);
        let schedules = db.open_tree("schedules").unwrap();
        let encoded = serde_json::to_vec(&old).unwrap();
        schedules.insert(b"old", encoded).unwrap();
        let chunks = db.open_tree("schedule_payloads").unwrap();
        let mut orphan = 777_u64.to_be_bytes().to_vec();
        orphan.extend_from_slice(&0_u32.to_be_bytes());
        chunks.insert(orphan, vec![7; 100]).unwrap();
        db.flush().unwrap();
    }
    {
        let store = open(&dir);
        let read = store.schedules().await.expect("schedules");
        assert_eq!(read, vec![old.clone()], "the old record reads whole");
        put(&store, schedule("old", 2)).await;
        let replaced = store.schedules().await.expect("schedules");
        assert_eq!(replaced, vec![schedule("old", 2)]);
        store.close().await.expect("close");
    }
    let db = raw(&dir);
    let chunks = db.open_tree("schedule_payloads").unwrap();
    let ids: std::collections::BTreeSet<[u8; 8]> = chunks
        .iter()
        .keys()
        .map(|k| k.unwrap()[..8].try_into().unwrap())
        .collect();
    assert_eq!(ids.len(), 1, "only the live payload's chunks: {ids:?}");
    assert!(!ids.contains(&777_u64.to_be_bytes()), "the orphan is gone");
    let record = db.open_tree("schedules").unwrap().get(b"old").unwrap();
    assert!(
        record.unwrap().len() < 1_000,
        "the record no longer holds its payload"
    );
}
