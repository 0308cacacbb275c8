//! A leased job that waits in its stream because the worker is not reading
//! never left the server: over the PostgreSQL store, no other server's
//! reaper spends an attempt on it when its lease runs out (its own server
//! gives it back without one), and once its lease has ended, however it
//! ended, the stale `leased` event is never sent. Needs `JOBQ_TEST_PG`
//! (see `scripts/pg-test.sh`).

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use jobq::pb::{self, job_queue_server::JobQueue, lease_event::Event};
use jobq_server::{
    job::{JobId, NewJob, Status},
    leases::{LeaseEvents, LeaseHub},
    service::JobQueueService,
    store::{
        postgres::{testing, PgStore},
        Store,
    },
    Config,
};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::Request;

async fn store(url: &str) -> Arc<PgStore> {
    Arc::new(testing::store(testing::options(url)).await)
}

fn job(key: &str) -> NewJob {
    NewJob {
        key: Some(key.into()),
        ..testing::job("q")
    }
}

/// A server over `store`: its lease hub and service.
fn server(
    store: &Arc<PgStore>,
    shutdown: &CancellationToken,
) -> (Arc<LeaseHub<PgStore>>, JobQueueService<PgStore>) {
    let mut config = Config::with_data("unused");
    config.min_lease = Duration::from_millis(10);
    let config = Arc::new(config);
    let hub = LeaseHub::new(Arc::clone(store), Arc::clone(&config), shutdown.clone());
    let svc = JobQueueService::new(
        Arc::clone(store),
        Arc::clone(&hub),
        config,
        shutdown.clone(),
    );
    (hub, svc)
}

/// Opens a stream of capacity 1 with `lease`-long leases; the caller does
/// not read it until it says so.
async fn open(svc: &JobQueueService<PgStore>, lease: Duration) -> LeaseEvents {
    let request = pb::LeaseRequest {
        queues: vec!["q".into()],
        worker_id: "w".into(),
        capacity: 1,
        lease_duration: Some(lease.try_into().unwrap()),
        ..Default::default()
    };
    svc.lease(Request::new(request))
        .await
        .expect("lease")
        .into_inner()
}

/// Waits up to 10 s for `job` to be RUNNING; returns it.
async fn running(store: &PgStore, job: JobId) -> jobq_server::job::Job {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let j = store.peek(job).await.unwrap();
        if j.status == Status::Running {
            return j;
        }
        assert!(tokio::time::Instant::now() < deadline, "never taken: {j:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next event the worker reads, within 10 s.
async fn next(stream: &mut LeaseEvents) -> Event {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10 s")
        .expect("open")
        .expect("ok")
        .event
        .expect("an event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_servers_reaper_spends_no_attempt_on_a_lease_that_never_left_its_server() {
    let url = testing::fresh_database("jobq_unsent").await;
    let (a, b) = (store(&url).await, store(&url).await);
    let shutdown = CancellationToken::new();
    let (hub, svc) = server(&a, &shutdown);
    let one = a.enqueue(job("one"), SystemTime::now()).await.unwrap().job;
    let mut stream = open(&svc, Duration::from_millis(200)).await;
    let taken = running(&a, one.id).await;
    let first_lease = taken.lease_id().unwrap();
    let expires = taken.lease_expires_at().unwrap();
    while SystemTime::now() <= expires + Duration::from_millis(50) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // B's reaper leaves the lease of A's live stream to A.
    let by_b = b
        .reclaim_expired(SystemTime::now(), &|_| false)
        .await
        .unwrap();
    assert!(by_b.is_empty(), "B reclaimed A's stream lease: {by_b:?}");
    // A's reaper gives it back: its job never reached the worker.
    let undelivered = |lease| hub.undelivered(lease);
    let by_a = a
        .reclaim_expired(SystemTime::now(), &undelivered)
        .await
        .unwrap();
    assert_eq!(by_a.len(), 1);
    assert_eq!(
        a.peek(one.id).await.unwrap().attempts,
        0,
        "no attempt spent"
    );

    // The worker reads at last: the job again, under a new lease, and
    // never the stale one.
    match next(&mut stream).await {
        Event::Leased(l) => {
            assert_eq!(l.job.as_ref().unwrap().id, one.id.to_string());
            assert_ne!(
                l.lease_id,
                first_lease.to_string(),
                "the stale lease was sent"
            );
        }
        other => panic!("expected the job under a new lease, got {other:?}"),
    }
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_cancelled_before_its_worker_read_it_is_never_sent() {
    let url = testing::fresh_database("jobq_unsent_cancel").await;
    let a = store(&url).await;
    let shutdown = CancellationToken::new();
    let (_hub, svc) = server(&a, &shutdown);
    let one = a.enqueue(job("one"), SystemTime::now()).await.unwrap().job;
    let mut stream = open(&svc, Duration::from_secs(60)).await;
    running(&a, one.id).await;
    a.cancel(one.id, "no longer wanted".into(), SystemTime::now())
        .await
        .unwrap();
    let two = a.enqueue(job("two"), SystemTime::now()).await.unwrap().job;
    match next(&mut stream).await {
        Event::Leased(l) => assert_eq!(l.job.as_ref().unwrap().id, two.id.to_string()),
        other => panic!("expected job two, got {other:?}"),
    }
    shutdown.cancel();
}
