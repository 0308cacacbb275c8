//! Lease-ended events over the PostgreSQL store, where an apply waits for
//! the network: a caller who gives up after its Ack or CancelJob committed
//! must not take the event with it, and an event another server sent while
//! this one's LISTEN connection was down must not leave a stream's slot
//! taken for good; nor may a drained pool keep a live server from
//! heartbeating, or the others reclaim its streams' leases. Needs
//! `JOBQ_TEST_PG` (see `scripts/pg-test.sh`).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use jobq::pb::{self, job_queue_server::JobQueue, lease_event::Event};
use jobq_server::{
    job::{JobId, LeaseId, NewJob, Outcome},
    leases::{self, LeaseHub},
    service::JobQueueService,
    store::{
        postgres::{testing, PgOptions, PgStore},
        LeaseEnded, Store,
    },
    Config,
};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::Request;

const LEASE: Duration = Duration::from_secs(60);

async fn store(url: &str) -> Arc<PgStore> {
    Arc::new(testing::store(testing::options(url)).await)
}

fn job(key: &str) -> NewJob {
    NewJob {
        queue: "q".into(),
        kind: "k".into(),
        payload: vec![],
        key: Some(key.into()),
        max_attempts: 3,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: jobq_server::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    }
}

/// Polls `fut` exactly once, with a waker that does nothing, and drops
/// it: a client whose deadline passed while its call waited for the
/// database. Returns whether it was ready.
fn poll_once<F: std::future::Future>(fut: F) -> bool {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    fut.as_mut().poll(&mut cx).is_ready()
}

/// Waits up to 10 s for `check`, polling.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A plain connection to the test database, beside the stores.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// How many transactions the database has ended so far.
/// pg_stat_database lags a transaction's end by up to a second
/// (PGSTAT_MIN_INTERVAL): wait a second longer than what is measured, then
/// read it; the snapshot is cleared so each call counts anew.
async fn transactions(stats: &tokio_postgres::Client) -> i64 {
    stats
        .query_one(
            "SELECT pg_stat_clear_snapshot(), xact_commit + xact_rollback \
             FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(1)
}

/// Locks `job`'s row inside `tx` until it ends: a transaction that is
/// stuck, or whose server froze.
async fn lock_row(tx: &tokio_postgres::Transaction<'_>, job: JobId) {
    let id = i64::try_from(job.0).unwrap();
    tx.execute("SELECT 1 FROM jobq_jobs WHERE id = $1 FOR UPDATE", &[&id])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_or_cancel_whose_caller_left_still_ends_its_lease() {
    let url = testing::fresh_database("jobq_leases").await;
    let store = store(&url).await;
    let seen = Arc::new(Mutex::new(Vec::<LeaseEnded>::new()));
    let sink = Arc::clone(&seen);
    store.on_lease_ended(Arc::new(move |e: &LeaseEnded| {
        sink.lock().unwrap().push(e.clone());
    }));
    let queues = vec!["q".to_owned()];
    let now = SystemTime::now();
    for key in ["acked", "cancelled"] {
        store.enqueue(job(key), now).await.unwrap();
    }
    let first = store
        .take(&queues, "w", None, LEASE, now)
        .await
        .unwrap()
        .unwrap();
    let second = store
        .take(&queues, "w", None, LEASE, now)
        .await
        .unwrap()
        .unwrap();

    let ack = store.ack(first.job.id, first.lease_id, SystemTime::now());
    assert!(!poll_once(ack), "an ack waits for the database");
    let cancel = store.cancel(second.job.id, "no longer wanted".into(), SystemTime::now());
    assert!(!poll_once(cancel), "a cancel waits for the database");

    let ended = |job: JobId, lease: LeaseId, outcome: Outcome| {
        let seen = Arc::clone(&seen);
        move || {
            seen.lock()
                .unwrap()
                .iter()
                .any(|e| e.job == job && e.lease == lease && e.outcome == Some(outcome))
        }
    };
    eventually(
        "the ack's lease-ended event",
        ended(first.job.id, first.lease_id, Outcome::Acked),
    )
    .await;
    eventually(
        "the cancel's lease-ended event (revoked)",
        ended(second.job.id, second.lease_id, Outcome::Revoked),
    )
    .await;
}

/// Server A's stream holds its one slot's lease; A's LISTEN connection is
/// cut, and server B acks the job before A listens again, so A never hears
/// of it. Once A listens again it checks its streams' leases against the
/// database and frees the slot: the next job is pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ended_elsewhere_while_listen_was_down_frees_its_slot() {
    let url = testing::fresh_database("jobq_resync").await;
    let (a, b) = (store(&url).await, store(&url).await);
    let config = Arc::new(Config::with_data("unused"));
    let shutdown = CancellationToken::new();
    let hub = LeaseHub::new(Arc::clone(&a), Arc::clone(&config), shutdown.clone());
    tokio::spawn(leases::reconcile_on_resync(
        Arc::clone(&hub),
        shutdown.clone(),
    ));
    let svc = JobQueueService::new(Arc::clone(&a), hub, config, shutdown.clone());
    let now = SystemTime::now();
    let one = b.enqueue(job("one"), now).await.unwrap().job;
    let two = b.enqueue(job("two"), now).await.unwrap().job;

    let mut stream = svc
        .lease(Request::new(pb::LeaseRequest {
            queues: vec!["q".into()],
            worker_id: "w".into(),
            capacity: 1,
            ..Default::default()
        }))
        .await
        .expect("lease")
        .into_inner();
    let leased = |event: Option<Result<pb::LeaseEvent, tonic::Status>>| match event {
        Some(Ok(pb::LeaseEvent {
            event: Some(Event::Leased(l)),
        })) => l,
        other => panic!("expected a leased job, got {other:?}"),
    };
    let first = leased(stream.next().await);
    assert_eq!(first.job.as_ref().unwrap().id, one.id.to_string());

    // Both servers listen; cut every LISTEN connection of this database.
    let admin = connect(&url).await;
    let listening = "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND query LIKE 'LISTEN%'";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = admin.query_one(listening, &[]).await.unwrap().get(0);
        if n >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "both servers listen"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
            &[],
        )
        .await
        .unwrap();
    // A reconnects after a backoff of 500 ms; the ack lands before.
    let lease_id: u64 = first.lease_id.parse().unwrap();
    b.ack(one.id, LeaseId(lease_id), SystemTime::now())
        .await
        .expect("ack through B");

    let next = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the slot was freed and the next job pushed");
    let second = leased(next);
    assert_eq!(second.job.as_ref().unwrap().id, two.id.to_string());
    shutdown.cancel();
}

/// Every pooled connection waits on a row lock (a stuck transaction
/// elsewhere); the server's heartbeat still goes through, on a connection
/// of its own, well within `--server-timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_pool_does_not_stop_the_servers_heartbeat() {
    let url = testing::fresh_database("jobq_beat").await;
    let store = Arc::new(
        testing::store(PgOptions {
            pool_size: 2,
            group_commit: 1,
            ..testing::options(&url)
        })
        .await,
    );
    let now = SystemTime::now();
    store.enqueue(job("locked"), now).await.unwrap();
    let leased = store
        .take(&["q".to_owned()], "w", None, LEASE, now)
        .await
        .unwrap()
        .unwrap();

    let mut admin = connect(&url).await;
    let lock = admin.transaction().await.unwrap();
    lock_row(&lock, leased.job.id).await;
    // Two heartbeats of the job's lease take both pooled connections and
    // wait on the lock.
    let blocked: Vec<_> = (0..2)
        .map(|_| {
            let store = Arc::clone(&store);
            let held = [(leased.job.id, leased.lease_id)];
            tokio::spawn(async move { store.extend(&held, &[], None, SystemTime::now()).await })
        })
        .collect();
    let waiting = connect(&url).await;
    testing::until_lock_waiters(&waiting, 2, "both pooled connections wait", || false).await;

    tokio::time::timeout(Duration::from_secs(2), store.heartbeat())
        .await
        .expect("the heartbeat does not wait for the pool")
        .expect("heartbeat");

    lock.rollback().await.unwrap();
    for call in blocked {
        call.await
            .unwrap()
            .expect("the heartbeats go through once the lock is gone");
    }
}

/// An expired lease whose row another transaction holds (a stuck one
/// here) is skipped by the reaper's pass, yet is the next expiry: the
/// reaper looks again after a pause, not thousands of times a second, and
/// reclaims the lease once the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_does_not_spin_on_an_expired_lease_it_cannot_lock() {
    let url = testing::fresh_database("jobq_spin").await;
    let store = store(&url).await;
    let now = SystemTime::now();
    store.enqueue(job("held"), now).await.unwrap();
    let short = Duration::from_millis(100);
    let leased = store
        .take(&["q".to_owned()], "w", None, short, now)
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(short * 2).await;

    let mut admin = connect(&url).await;
    let lock = admin.transaction().await.unwrap();
    lock_row(&lock, leased.job.id).await;
    let stats = connect(&url).await;
    let commits = || transactions(&stats);

    let config = Arc::new(Config::with_data("unused"));
    let shutdown = CancellationToken::new();
    let hub = LeaseHub::new(Arc::clone(&store), Arc::clone(&config), shutdown.clone());
    let before = commits().await;
    let reaper = tokio::spawn(jobq_server::reaper::run(
        Arc::clone(&store),
        hub,
        config,
        shutdown.clone(),
        shutdown.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Let the statistics catch up with the two seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let during = commits().await - before;
    println!("transactions in 2 s with the expired lease's row held: {during}");
    assert!(
        during < 400,
        "{during} transactions in 2 s: the reaper spins on a lease it cannot lock"
    );

    lock.rollback().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let job = store.get(leased.job.id).await.unwrap();
        if job.status == jobq_server::job::Status::Pending {
            assert_eq!(job.attempts, 1);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reclaimed once free"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    reaper.await.unwrap();
}

/// A server frozen in the middle of a transaction (here: a transaction
/// opened on one of its pooled connections, a job's row locked, then
/// nothing) holds that row only until its session has idled in the
/// transaction for `--server-timeout` (at least 5 s): PostgreSQL ends the
/// session, and another server's change to the job goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_frozen_inside_a_transaction_does_not_hold_its_locks_for_good() {
    let url = testing::fresh_database("jobq_frozen").await;
    let frozen = Arc::new(
        testing::store(PgOptions {
            pool_size: 2,
            group_commit: 1,
            server_timeout: Duration::from_secs(1),
            ..testing::options(&url)
        })
        .await,
    );
    let other = store(&url).await;
    let now = SystemTime::now();
    other.enqueue(job("frozen"), now).await.unwrap();
    let leased = other
        .take(&["q".to_owned()], "w", None, LEASE, now)
        .await
        .unwrap()
        .unwrap();

    let mut client = frozen.backend().pool().get().await.expect("client");
    let tx = client.transaction().await.unwrap();
    lock_row(&tx, leased.job.id).await;
    // Frozen: the transaction stays open, doing nothing.
    let started = tokio::time::Instant::now();
    let acked = tokio::time::timeout(
        Duration::from_secs(20),
        other.ack(leased.job.id, leased.lease_id, SystemTime::now()),
    )
    .await
    .expect("the frozen session's lock is released")
    .expect("ack");
    assert_eq!(acked.status, jobq_server::job::Status::Done);
    assert!(
        started.elapsed() >= Duration::from_millis(4500),
        "the ack waited for the lock ({:?})",
        started.elapsed()
    );
    assert!(tx.commit().await.is_err(), "the frozen session was ended");
}

/// A due job whose row another transaction holds (a frozen server's) is
/// counted due, and skipped by the take: a waiting Dequeue (and a hungry
/// Lease stream, by the same rule) looks again after a pause, not in a
/// tight loop of queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_take_does_not_spin_on_a_due_job_it_cannot_lock() {
    let url = testing::fresh_database("jobq_wait_spin").await;
    let store = store(&url).await;
    let job = store
        .enqueue(job("held"), SystemTime::now())
        .await
        .unwrap()
        .job;
    let mut admin = connect(&url).await;
    let lock = admin.transaction().await.unwrap();
    lock_row(&lock, job.id).await;
    let stats = connect(&url).await;
    let before = transactions(&stats).await;
    let spec = jobq_server::validate::TakeSpec {
        queues: vec!["q".into()],
        worker_id: "w".into(),
        owner: None,
        lease: LEASE,
    };
    let shutdown = CancellationToken::new();
    let got = jobq_server::waiter::take_waiting(&*store, &spec, Duration::from_secs(2), &shutdown)
        .await
        .unwrap();
    assert!(got.is_none(), "the locked job is not taken");
    // Let the statistics catch up with the two seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let during = transactions(&stats).await - before;
    println!("transactions in a 2 s wait on a locked due job: {during}");
    assert!(
        during < 600,
        "{during} transactions in 2 s: the waiter spins on a job it cannot take"
    );
    lock.rollback().await.unwrap();
}
