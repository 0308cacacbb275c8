//! Takes cannot use up the PostgreSQL store's pool: with every take of a
//! queue waiting on the database (a burst of Lease streams woken together,
//! stuck behind a lock here), an ack of another job still gets a
//! connection at once, before its lease could run out. Needs `JOBQ_TEST_PG`
//! (see `scripts/pg-test.sh`).

mod common;

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use jobq_server::store::{
    postgres::{testing, PgOptions},
    Store,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_takes_leave_connections_for_acks() {
    let url = testing::fresh_database("jobq_pool").await;
    let store = Arc::new(
        testing::store(PgOptions {
            pool_size: 4,
            group_commit: 1,
            ..testing::options(&url)
        })
        .await,
    );
    let now = SystemTime::now();
    store.enqueue(testing::job("free"), now).await.unwrap();
    for _ in 0..8 {
        store.enqueue(testing::job("busy"), now).await.unwrap();
    }
    let leased = store
        .take(
            &["free".to_owned()],
            "w",
            None,
            Duration::from_secs(60),
            now,
        )
        .await
        .unwrap()
        .unwrap();

    // Every take of "busy" waits on its queue's lock.
    let (mut admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let lock = admin.transaction().await.unwrap();
    let (a, b) = testing::take_lock("busy");
    lock.execute("SELECT pg_advisory_xact_lock($1, $2)", &[&a, &b])
        .await
        .unwrap();
    let takes: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                store
                    .take_streamed(
                        &["busy".to_owned()],
                        "w",
                        None,
                        Duration::from_secs(60),
                        SystemTime::now(),
                    )
                    .await
            })
        })
        .collect();
    let (watcher, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    testing::until_lock_waiters(&watcher, 1, "a take to wait on the lock", || false).await;

    let started = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(5),
        store.ack(leased.job.id, leased.lease_id, SystemTime::now()),
    )
    .await
    .expect("the ack found a connection while the takes waited")
    .expect("ack");
    println!("ack with 8 takes waiting: {:?}", started.elapsed());

    lock.rollback().await.unwrap();
    for take in takes {
        take.await
            .unwrap()
            .expect("the takes go through once the lock is gone");
    }
}

/// Every connection the server holds to PostgreSQL is terminated (a
/// database restart, an administrator's `pg_terminate_backend`): a Lease
/// stream whose take meets a dead connection retries with a backoff
/// instead of ending, and is pushed the next job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_outlives_its_servers_connections() {
    use jobq::pb::{self, lease_event::Event};

    let url = testing::fresh_database("jobq_pool_cut").await;
    let server = common::TestServer::with({
        let url = url.clone();
        move |c| c.store = Some(url)
    })
    .await;
    let mut c = server.client().await;
    let mut stream = c
        .lease(common::req(
            pb::LeaseRequest {
                queues: vec!["in.cut".into()],
                worker_id: "w".into(),
                capacity: 1,
                ..Default::default()
            },
            Some("consumer"),
        ))
        .await
        .expect("lease")
        .into_inner();

    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let cut: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(cut > 0);

    // The producer retries, as clients do on UNAVAILABLE.
    let deadline = Instant::now() + Duration::from_secs(10);
    let job = loop {
        let request = pb::EnqueueRequest {
            queue: "in.cut".into(),
            kind: "k".into(),
            ..Default::default()
        };
        match c.enqueue(common::req(request, Some("producer"))).await {
            Ok(r) => break r.into_inner().job.unwrap(),
            Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        }
        assert!(Instant::now() < deadline, "never enqueued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event within 10 s")
        .expect("the stream did not end")
        .expect("open")
        .event;
    match event {
        Some(Event::Leased(l)) => assert_eq!(l.job.unwrap().id, job.id),
        other => panic!("expected the job, got {other:?}"),
    }
}
