//! The store on an unlucky day: callers that stop waiting, a disk that
//! fails or fills, a restart that outlasts leases, jobs that never reached
//! their worker. Real sled in a temporary folder; faults are injected into
//! its syncer (`--fault-sync-*`).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use jobq_server::{
    job::{Job, JobId, LeaseId, Leased, NewJob, Outcome, Status},
    store::{sled::SledStore, LeaseEnded, Store},
    Config,
};
use tempfile::TempDir;
use tonic::Code;

const LEASE: Duration = Duration::from_secs(1);

fn config(dir: &TempDir) -> Config {
    let mut config = Config::with_data(dir.path());
    config.cache_bytes = 8 * 1024 * 1024;
    config
}

fn new_job(key: Option<&str>) -> NewJob {
    NewJob {
        queue: "q".into(),
        kind: "send-email".into(),
        payload: b"order-4711".to_vec(),
        key: key.map(Into::into),
        max_attempts: 3,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: jobq_server::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    }
}

fn queues() -> Vec<String> {
    vec!["q".into()]
}

/// Collects every lease-ended event the store publishes.
fn record(store: &SledStore) -> Arc<Mutex<Vec<LeaseEnded>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    store.on_lease_ended(Arc::new(move |e: &LeaseEnded| {
        sink.lock().unwrap().push(e.clone());
    }));
    seen
}

/// Polls `fut` exactly once and drops it: a client whose deadline passed
/// while the change waited for its fsync.
async fn cancel_after_first_poll<F: std::future::Future>(fut: F) {
    let _ = tokio::time::timeout(Duration::ZERO, fut).await;
}

#[tokio::test]
async fn a_cancelled_ack_still_publishes_its_lease_ended_event() {
    let dir = TempDir::new().unwrap();
    let mut config = config(&dir);
    // Every fsync is slow, so the ack is still waiting when it is dropped.
    config.fault_sync_delay = Some(Duration::from_millis(300));
    let store = SledStore::open(&config).unwrap();
    let seen = record(&store);
    let job = store
        .enqueue(new_job(None), SystemTime::now())
        .await
        .unwrap()
        .job;
    let leased = store
        .take(&queues(), "w", None, LEASE, SystemTime::now())
        .await
        .unwrap()
        .expect("due");
    cancel_after_first_poll(store.ack(job.id, leased.lease_id, SystemTime::now())).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        1,
        "the ack's event is published before any wait"
    );
    assert_eq!(
        (seen[0].job, seen[0].lease, seen[0].outcome, seen[0].status),
        (job.id, leased.lease_id, Some(Outcome::Acked), Status::Done)
    );
    store.flush().await.unwrap();
    assert_eq!(store.get(job.id).await.unwrap().status, Status::Done);
}

#[tokio::test]
async fn every_way_a_lease_ends_is_published_once() {
    let dir = TempDir::new().unwrap();
    let store = SledStore::open(&config(&dir)).unwrap();
    let seen = record(&store);
    let t0 = SystemTime::now();
    for _ in 0..5 {
        store.enqueue(new_job(None), t0).await.unwrap();
    }
    let qs = queues();
    let take = || store.take(&qs, "w", None, LEASE, t0);
    let a = take().await.unwrap().unwrap();
    let b = take().await.unwrap().unwrap();
    let c = take().await.unwrap().unwrap();
    let d = take().await.unwrap().unwrap();
    let e = take().await.unwrap().unwrap();
    store.ack(a.job.id, a.lease_id, t0).await.unwrap();
    store
        .fail(
            b.job.id,
            jobq_server::store::FailReport {
                lease_id: b.lease_id,
                error: "smtp down".into(),
                retry_delay: None,
                fatal: false,
                snooze: None,
            },
            t0,
        )
        .await
        .unwrap();
    store
        .reclaim(c.job.id, c.lease_id, Outcome::WorkerDisconnected, t0)
        .await
        .unwrap();
    store.give_back(d.job.id, d.lease_id, t0).await.unwrap();
    let expired = store.reclaim_expired(t0 + LEASE, &|_| false).await.unwrap();
    assert_eq!(expired.len(), 1);
    // A heartbeat ends nothing.
    store.enqueue(new_job(None), t0).await.unwrap();
    let f = take().await.unwrap().unwrap();
    store
        .extend(&[(f.job.id, f.lease_id)], &[], None, t0)
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let got: Vec<(JobId, LeaseId, Option<Outcome>)> =
        seen.iter().map(|e| (e.job, e.lease, e.outcome)).collect();
    assert_eq!(
        got,
        vec![
            (a.job.id, a.lease_id, Some(Outcome::Acked)),
            (b.job.id, b.lease_id, Some(Outcome::Failed)),
            (c.job.id, c.lease_id, Some(Outcome::WorkerDisconnected)),
            (d.job.id, d.lease_id, None),
            (e.job.id, e.lease_id, Some(Outcome::LeaseExpired)),
        ]
    );
}

#[tokio::test]
async fn a_cancelled_enqueue_still_wakes_the_waiters_once_durable() {
    let dir = TempDir::new().unwrap();
    let mut config = config(&dir);
    config.fault_sync_delay = Some(Duration::from_millis(200));
    let store = SledStore::open(&config).unwrap();
    let mut changes = store.changes();
    changes.borrow_and_update();
    cancel_after_first_poll(store.enqueue(new_job(None), SystemTime::now())).await;
    assert!(
        !changes.has_changed().unwrap(),
        "no wake-up before the job is durable"
    );
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("the waiters are woken although the enqueue's caller left")
        .unwrap();
}

/// `--deliver-before-fsync`: the waiters are woken, and the job can be
/// taken, while its enqueue still waits for its round; the enqueue's reply
/// still waits for durability.
#[tokio::test]
async fn with_deliver_before_fsync_a_job_is_taken_before_its_enqueue_is_durable() {
    let dir = TempDir::new().unwrap();
    let mut config = config(&dir);
    config.deliver_before_fsync = true;
    // Long enough that the round cannot finish before the take below.
    config.fault_sync_delay = Some(Duration::from_secs(3));
    let store = Arc::new(SledStore::open(&config).unwrap());
    let mut changes = store.changes();
    changes.borrow_and_update();
    let rounds = store.flush_rounds();
    let enqueue = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.enqueue(new_job(None), SystemTime::now()).await }
    });
    tokio::time::timeout(Duration::from_secs(2), changes.changed())
        .await
        .expect("woken before the round (3 s) completes")
        .unwrap();
    let leased = store
        .take(&queues(), "w", None, LEASE, SystemTime::now())
        .await
        .unwrap()
        .expect("the job is due before it is durable");
    assert_eq!(
        store.flush_rounds(),
        rounds,
        "no round has completed: the job was handed out before its fsync"
    );
    assert!(
        !enqueue.is_finished(),
        "the enqueue's reply waits for its round"
    );
    let enqueued = enqueue.await.unwrap().unwrap();
    assert_eq!(enqueued.job.id, leased.job.id);
}

/// A store whose rounds take 300 ms, with one job leased and an Ack of it
/// applied in memory, its round still running (the Ack's task returned).
async fn acked_not_yet_durable(
    dir: &TempDir,
) -> (
    Arc<SledStore>,
    Job,
    Leased,
    tokio::task::JoinHandle<jobq_server::Result<Job>>,
) {
    let mut config = config(dir);
    config.fault_sync_delay = Some(Duration::from_millis(300));
    let store = Arc::new(SledStore::open(&config).unwrap());
    let job = store
        .enqueue(new_job(None), SystemTime::now())
        .await
        .unwrap()
        .job;
    let leased = store
        .take(&queues(), "w", None, LEASE, SystemTime::now())
        .await
        .unwrap()
        .expect("due");
    let ack = tokio::spawn({
        let (store, lease) = (Arc::clone(&store), leased.lease_id);
        async move { store.ack(job.id, lease, SystemTime::now()).await }
    });
    // Applied in memory, its round (300 ms) still running.
    while store.get(job.id).await.unwrap().status != Status::Done {
        tokio::task::yield_now().await;
    }
    (store, job, leased, ack)
}

/// A repeated Ack (its first reply lost) is refused as "already DONE": that
/// answer must not come before the first Ack is durable, or a crash could
/// undo what the refusal reported done.
#[tokio::test]
async fn a_refusal_waits_until_the_state_it_read_is_durable() {
    let dir = TempDir::new().unwrap();
    let (store, job, leased, first) = acked_not_yet_durable(&dir).await;
    let rounds = store.flush_rounds();
    let again = store
        .ack(job.id, leased.lease_id, SystemTime::now())
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again}");
    assert!(
        store.flush_rounds() > rounds,
        "the refusal came before the first ack was durable"
    );
    first.await.unwrap().unwrap();
}

/// A heartbeat whose every lease is refused (the ack that ended it applied,
/// its round still running) replies "lost" only once that state is
/// durable: the worker drops the job, and a crash must not bring the lease
/// back.
#[tokio::test]
async fn a_heartbeat_whose_leases_are_all_refused_waits_for_durability() {
    let dir = TempDir::new().unwrap();
    let (store, job, leased, ack) = acked_not_yet_durable(&dir).await;
    let rounds = store.flush_rounds();
    let results = store
        .extend(&[(job.id, leased.lease_id)], &[], None, SystemTime::now())
        .await
        .unwrap();
    assert!(results[0].is_err(), "{results:?}");
    assert!(
        store.flush_rounds() > rounds,
        "the heartbeat said lost before the ack that ended the lease was durable"
    );
    ack.await.unwrap().unwrap();
}

/// A payload big enough for a file of its own makes the enqueue wait for
/// that file's fsync before it writes anything else: a caller who leaves
/// meanwhile still gets the job enqueued and the waiters woken.
#[tokio::test]
async fn a_cancelled_enqueue_of_a_big_payload_still_completes() {
    let dir = TempDir::new().unwrap();
    let mut config = config(&dir);
    config.payload_file_bytes = 16 * 1024;
    let store = SledStore::open(&config).unwrap();
    let mut changes = store.changes();
    changes.borrow_and_update();
    let big = NewJob {
        payload: vec![b'p'; 64 * 1024],
        ..new_job(None)
    };
    cancel_after_first_poll(store.enqueue(big, SystemTime::now())).await;
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("the waiters are woken although the enqueue's caller left")
        .unwrap();
    let leased = store
        .take(&queues(), "w", None, LEASE, SystemTime::now())
        .await
        .unwrap()
        .expect("the job was enqueued");
    assert!(leased.job.payload == vec![b'p'; 64 * 1024]);
    let files = std::fs::read_dir(dir.path().join("payloads"))
        .unwrap()
        .count();
    assert_eq!(files, 1);
}

/// A take is written before its payload file is read. A Dequeue whose
/// caller leaves during that read, or a file that cannot be read, must not
/// strand the job RUNNING under a lease nobody holds with the reaper asleep:
/// the lease re-arms the reaper and is made durable as soon as it is
/// written, so the job is reclaimed when the lease runs out.
#[tokio::test]
async fn a_take_cut_short_while_its_payload_file_is_read_still_arms_the_reaper() {
    for how in ["cancelled", "unreadable"] {
        // A store of its own each: the first lease armed the reaper.
        let dir = TempDir::new().unwrap();
        let mut config = config(&dir);
        config.payload_file_bytes = 16 * 1024;
        let store = SledStore::open(&config).unwrap();
        let big = NewJob {
            payload: vec![b'p'; 64 * 1024],
            ..new_job(None)
        };
        let t0 = SystemTime::now();
        let job = store.enqueue(big, t0).await.unwrap().job;
        let mut lease_changes = store.lease_changes();
        lease_changes.borrow_and_update();
        let rounds = store.flush_rounds();
        if how == "cancelled" {
            let queues = queues();
            let take = store.take(&queues, "w", None, LEASE, t0);
            // Dropped after one poll, while it waits for its payload file
            // (a blocking thread quick enough to finish before that poll
            // leaves a whole take, which must pass the same checks).
            let _ = poll_once(take);
        } else {
            // The file is there but cannot be read (EISDIR).
            let file = dir.path().join("payloads").join(job.id.to_string());
            std::fs::remove_file(&file).unwrap();
            std::fs::create_dir(&file).unwrap();
            let err = store
                .take(&queues(), "w", None, LEASE, t0)
                .await
                .expect_err("the payload cannot be read");
            assert!(!err.to_string().is_empty());
        }
        let got = store.get(job.id).await;
        let status = got.map(|j| j.status).unwrap_or(Status::Running);
        assert_eq!(status, Status::Running, "{how}: the take was written");
        assert!(
            lease_changes.has_changed().unwrap(),
            "{how}: the reaper was told about the new lease"
        );
        tokio::time::timeout(Duration::from_secs(5), async {
            while store.flush_rounds() == rounds {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{how}: the lease was made durable without another call"));
        let reaped = store.reclaim_expired(t0 + LEASE, &|_| false).await.unwrap();
        assert_eq!(reaped.len(), 1, "{how}");
        assert_eq!(reaped[0].0.id, job.id);
        assert_eq!(reaped[0].0.status, Status::Pending);
    }
}

/// Polls `fut` exactly once, with a waker that does nothing, and drops
/// it; returns whether it was ready.
fn poll_once<F: std::future::Future>(fut: F) -> bool {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    fut.as_mut().poll(&mut cx).is_ready()
}

#[tokio::test]
async fn a_given_back_job_spends_no_attempt_and_keeps_its_place() {
    let dir = TempDir::new().unwrap();
    let store = SledStore::open(&config(&dir)).unwrap();
    let t0 = SystemTime::now();
    let first = store.enqueue(new_job(None), t0).await.unwrap().job;
    let second = store.enqueue(new_job(None), t0).await.unwrap().job;
    let leased = store
        .take(&queues(), "w", None, LEASE, t0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leased.job.id, first.id);
    let back = store
        .give_back(first.id, leased.lease_id, t0)
        .await
        .unwrap();
    assert_eq!((back.status, back.attempts), (Status::Pending, 0));
    assert!(back.history.is_empty());
    let again = store
        .take(&queues(), "w", None, LEASE, t0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.job.id, first.id, "still ahead of {}", second.id);
    // The reaper gives back an expired lease that was never delivered.
    let expired = store
        .reclaim_expired(t0 + LEASE, &|lease| lease == again.lease_id)
        .await
        .unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(
        (expired[0].0.status, expired[0].0.attempts),
        (Status::Pending, 0)
    );
}

#[tokio::test]
async fn a_lease_that_ran_out_during_a_restart_gets_a_grace() {
    let dir = TempDir::new().unwrap();
    let t0 = SystemTime::now();
    let (job, lease) = {
        let store = SledStore::open(&config(&dir)).unwrap();
        let job = store.enqueue(new_job(None), t0).await.unwrap().job;
        let leased = store
            .take(&queues(), "w", None, LEASE, t0)
            .await
            .unwrap()
            .unwrap();
        store.flush().await.unwrap();
        (job, leased.lease_id)
    };
    // The server was down for a minute, far past the 1 s lease.
    let restart = t0 + Duration::from_secs(60);
    let store = SledStore::open(&config(&dir)).unwrap();
    let graced = store.restart_grace(None, restart).await.unwrap();
    assert_eq!(graced, 1);
    assert!(
        store
            .reclaim_expired(restart, &|_| false)
            .await
            .unwrap()
            .is_empty(),
        "a restart is not a worker death"
    );
    let held = store
        .extend(
            &[(job.id, lease)],
            &[],
            None,
            restart + Duration::from_millis(500),
        )
        .await
        .unwrap();
    assert!(held[0].is_ok(), "the worker can still heartbeat: {held:?}");
    let done = store
        .ack(job.id, lease, restart + Duration::from_millis(600))
        .await
        .unwrap();
    assert_eq!((done.status, done.attempts), (Status::Done, 0));
}

async fn fail_stop_after_a_failed_sync(error: &str) {
    let dir = TempDir::new().unwrap();
    let mut config = config(&dir);
    config.fault_sync_after = Some(3);
    config.fault_sync_error = error.into();
    let store = SledStore::open(&config).unwrap();
    let stopped = store.fail_stopped();
    let t0 = SystemTime::now();
    let mut acked = 0;
    let err = loop {
        match store.enqueue(new_job(None), t0).await {
            Ok(_) => acked += 1,
            Err(err) => break err,
        }
        assert!(acked < 10, "the injected failure never came");
    };
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(stopped.is_cancelled(), "the server is told to stop");
    let cause = store.fail_cause().expect("a cause");
    assert!(cause.contains("injected"), "{cause}");
    // Nothing more is served: no take, no read of what may not be on disk.
    let take = store.take(&queues(), "w", None, LEASE, t0).await;
    assert_eq!(take.unwrap_err().code(), Code::Unavailable);
    assert_eq!(
        store.get(JobId(1)).await.unwrap_err().code(),
        Code::Unavailable
    );
    assert_eq!(
        store.enqueue(new_job(None), t0).await.unwrap_err().code(),
        Code::Unavailable
    );
    drop(store);
    // What was acknowledged is on disk.
    config.fault_sync_after = None;
    let store = SledStore::open(&config).unwrap();
    let stats = store.stats(Some("q"), t0).await.unwrap();
    assert!(
        stats[0].pending >= acked,
        "{stats:?} vs {acked} acknowledged"
    );
}

#[tokio::test]
async fn a_failed_fsync_stops_the_store_for_good() {
    fail_stop_after_a_failed_sync("EIO").await;
}

#[tokio::test]
async fn a_full_disk_stops_the_store_for_good() {
    fail_stop_after_a_failed_sync("ENOSPC").await;
}

#[tokio::test]
async fn a_failed_background_sync_stops_the_store_without_any_waiter() {
    let dir = TempDir::new().unwrap();
    let mut config = config(&dir);
    config.fault_sync_after = Some(1);
    let store = Arc::new(SledStore::open(&config).unwrap());
    let watcher = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.watch_engine().await }
    });
    let t0 = SystemTime::now();
    store
        .enqueue(new_job(None), t0)
        .await
        .expect("the first sync works");
    // A take asks for a round without waiting for it; that round fails.
    store
        .take(&queues(), "w", None, LEASE, t0)
        .await
        .unwrap()
        .expect("due");
    tokio::time::timeout(Duration::from_secs(5), store.fail_stopped().cancelled())
        .await
        .expect("fail-stop");
    watcher.abort();
    assert!(store.fail_cause().is_some());
}

type Hub = Arc<jobq_server::leases::LeaseHub<SledStore>>;

/// A sled store holding one PENDING job, and a Lease hub over it.
async fn one_job_and_a_hub() -> (
    TempDir,
    Arc<SledStore>,
    Hub,
    tokio_util::sync::CancellationToken,
    Job,
) {
    let dir = TempDir::new().unwrap();
    let config = Arc::new(config(&dir));
    let store = Arc::new(SledStore::open(&config).unwrap());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let hub = jobq_server::leases::LeaseHub::new(
        Arc::clone(&store),
        Arc::clone(&config),
        shutdown.clone(),
    );
    let job = store
        .enqueue(new_job(None), SystemTime::now())
        .await
        .unwrap()
        .job;
    (dir, store, hub, shutdown, job)
}

/// A stream of capacity 1 on the test queues, leasing for `lease`.
fn stream_of_one(lease: Duration) -> jobq_server::validate::StreamSpec {
    jobq_server::validate::StreamSpec {
        take: jobq_server::validate::TakeSpec {
            queues: queues(),
            worker_id: "w".into(),
            owner: None,
            lease,
        },
        capacity: 1,
        held: vec![],
        caller: None,
    }
}

/// A leased job waits in its stream's channel until the transport pulls it
/// (a worker that does not read, a full HTTP/2 window). If its lease runs
/// out there, the reaper gives it back without an attempt; the stale push
/// must then never reach the worker: the job may be someone else's by then.
#[tokio::test]
async fn a_job_given_back_unpulled_is_never_sent_under_its_old_lease() {
    use tokio_stream::StreamExt;

    let (_dir, store, hub, shutdown, job) = one_job_and_a_hub().await;
    let spec = stream_of_one(Duration::from_millis(100));
    // Opened, never read (yet).
    let (mut events, _token) = hub.open(spec, (), || None).expect("open");
    let first = loop {
        let got = store.get(job.id).await.unwrap();
        if let Some(lease) = got.lease_id() {
            break (lease, got.lease_expires_at().unwrap());
        }
        tokio::task::yield_now().await;
    };
    while SystemTime::now() <= first.1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let reaped = store
        .reclaim_expired(SystemTime::now(), &|lease| hub.undelivered(lease))
        .await
        .unwrap();
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].0.attempts, 0, "given back, no attempt spent");
    // The worker reads now: whatever it gets holds the job's current lease,
    // never the one given back.
    let event = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("the stream takes the job again and pushes it")
        .expect("open")
        .expect("an event");
    let Some(jobq::pb::lease_event::Event::Leased(leased)) = event.event else {
        panic!("expected a leased job, got {event:?}");
    };
    assert_ne!(
        leased.lease_id,
        first.0.to_string(),
        "sent under the old lease"
    );
    let now = store.get(job.id).await.unwrap();
    assert_eq!(now.lease_id().map(|l| l.to_string()), Some(leased.lease_id));
    shutdown.cancel();
}

/// A server frozen (SIGSTOP, a paused VM) with a leased job waiting in a
/// stream's channel thaws with a stale heartbeat: the others may have
/// reclaimed that lease meanwhile. The job must not leave for the wire,
/// whether the transport runs before the heartbeat loop has noticed, or
/// after a heartbeat succeeded again; the stream ends UNAVAILABLE and the
/// job comes back without an attempt.
#[tokio::test]
async fn a_server_whose_heartbeat_went_stale_never_sends_a_lease_it_buffered() {
    use tokio_stream::StreamExt;

    let (_dir, store, hub, shutdown, job) = one_job_and_a_hub().await;
    let spec = stream_of_one(Duration::from_secs(30));
    // Opened, not read: the job waits in the channel.
    let (mut events, _token) = hub.open(spec, (), || None).expect("open");
    while store.get(job.id).await.unwrap().lease_id().is_none() {
        tokio::task::yield_now().await;
    }
    // The heartbeat's deadline passed while the worker's transport waited
    // (a freeze); then a heartbeat succeeded again before it read.
    store.liveness().renew(Duration::ZERO, Duration::ZERO);
    store
        .liveness()
        .renew(Duration::from_secs(60), Duration::ZERO);
    let first = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("the stream answers")
        .expect("one item");
    let status = first.expect_err("no leased job from a stale server");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(events.next().await.is_none(), "the stream ended");
    drop(events);
    let back = loop {
        let got = store.get(job.id).await.unwrap();
        if got.status == Status::Pending {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(back.attempts, 0, "never sent: no attempt spent");
    shutdown.cancel();
}
