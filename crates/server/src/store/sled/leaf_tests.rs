//! The vendored sled's leaf splits (`vendor/sled/JOBQ.md`, changes 5
//! and 6), seen from the store.

use std::time::SystemTime;

use super::{tests::new_job, *};
use crate::store::Store;

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
