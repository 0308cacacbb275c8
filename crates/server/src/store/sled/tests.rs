//! The sled store's own behaviour: payload placement, saved indexes, the
//! startup scan and listing.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use super::{
    list::LIST_CHUNK,
    open::{scan, scan_parts, scan_range},
    *,
};
use crate::{
    job::{JobId, NewJob, Status},
    machine,
    store::{ListFilter, Store},
};

/// A job for queue `q` with `payload`.
pub(super) fn new_job(payload: Vec<u8>) -> NewJob {
    NewJob {
        queue: "q".into(),
        kind: "k".into(),
        payload,
        key: None,
        max_attempts: 3,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: crate::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
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
    let payload = format!(r#"{{"order":"order-4711","note":"{}"}}"#, "x".repeat(4096)).into_bytes();
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
            group: None,
            max_snoozes: crate::job::DEFAULT_MAX_SNOOZES,
            unique: Default::default(),
        },
        now,
    );
    {
        let db = sled::open(dir.path()).unwrap();
        let mut v3 = postcard::to_extend(&job, vec![0, 3]).unwrap();
        // Layout 3 had no group (`None`: one byte) nor snooze counts (0
        // and 100), the last fields.
        assert!(v3.ends_with(&[0, 0, 100]));
        v3.truncate(v3.len() - 3);
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

/// A reader without the lock that read a job's record before a debounce
/// replaced its payload (and cleared the old one's place) reads the new
/// record, not a "corrupt" job; a record that did not move still is.
#[tokio::test]
async fn a_reader_of_a_record_a_replace_moved_reads_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(&Config::with_data(dir.path())).unwrap();
    let keyed = |payload: Vec<u8>, replace: bool| NewJob {
        key: Some("doc-9".into()),
        unique: crate::job::Uniqueness {
            replace,
            ..Default::default()
        },
        ..new_job(payload)
    };
    let now = SystemTime::now();
    let id = store
        .enqueue(keyed(vec![7; 2_000], false), now)
        .await
        .unwrap()
        .job
        .id;
    let sled = store.backend();
    let (before, placed) = sled.load_record(id).unwrap();
    assert_eq!(placed, record::Payload::Apart(2_000));
    let replaced = store
        .enqueue(keyed(b"v2".to_vec(), true), now)
        .await
        .unwrap();
    assert!(replaced.replaced);
    let mut job = before.clone();
    sled.fill_settled(&mut job, placed).unwrap();
    assert_eq!(job.payload, b"v2");
    assert_eq!(store.get(id).await.unwrap().payload, b"v2");
    // The old place is cleared: read by the old record alone, without
    // reading the record again, the job would be taken for corrupt.
    let mut stale = before;
    assert!(matches!(
        sled.fill(&mut stale, placed),
        Err(Error::Corrupt(_))
    ));
}
