//! A server whose own heartbeat to PostgreSQL cannot get through (here its
//! row in `jobq_servers` is held by a stuck transaction; in production a
//! terminated connection, a connection limit, a black-holed socket) while
//! its pool still works: the other servers will soon take it for dead and
//! reclaim what its Lease streams hold. From half of `--server-timeout`
//! without a heartbeat it takes nothing: its Lease streams end with
//! UNAVAILABLE (their workers keep their leases, to declare them on
//! another server), Dequeue is UNAVAILABLE, and no attempt is spent. Once a
//! heartbeat succeeds again it takes jobs again. A real server on
//! 127.0.0.1:0 over `JOBQ_TEST_PG` (see `scripts/pg-test.sh`).

mod common;

use std::time::{Duration, Instant};

use common::{req, TestServer};
use jobq::pb::{self, lease_event::Event};
use jobq_server::store::postgres::testing;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_heartbeat_takes_nothing_until_it_can() {
    let url = testing::fresh_database("jobq_registry").await;
    let server = TestServer::with({
        let url = url.clone();
        move |c| {
            c.store = Some(url);
            c.server_timeout = Duration::from_secs(2);
        }
    })
    .await;
    let mut c = server.client().await;
    for _ in 0..2 {
        let job = pb::EnqueueRequest {
            queue: "in.beat".into(),
            kind: "k".into(),
            ..Default::default()
        };
        c.enqueue(req(job, Some("producer")))
            .await
            .expect("enqueue");
    }
    let lease = pb::LeaseRequest {
        queues: vec!["in.beat".into()],
        worker_id: "w".into(),
        capacity: 1,
        ..Default::default()
    };
    let mut stream = c
        .lease(req(lease.clone(), Some("consumer")))
        .await
        .expect("lease")
        .into_inner();
    let first = match stream.message().await.expect("stream").expect("open").event {
        Some(Event::Leased(l)) => l,
        other => panic!("expected a leased job, got {other:?}"),
    };

    // Hold the server's registry row: its heartbeats wait behind the lock.
    let (mut admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let stuck = admin.transaction().await.unwrap();
    let held = stuck
        .execute("SELECT 1 FROM jobq_servers FOR UPDATE", &[])
        .await
        .unwrap();
    assert_eq!(held, 1, "one server registered");

    let ended = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream ends within 10 s");
    match ended {
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        other => panic!("expected UNAVAILABLE, got {other:?}"),
    }
    let dequeue = pb::DequeueRequest {
        queues: vec!["in.beat".into()],
        worker_id: "w".into(),
        ..Default::default()
    };
    let refused = c
        .dequeue(req(dequeue.clone(), Some("consumer")))
        .await
        .expect_err("no take while the heartbeat is stale");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let reopened = c.lease(req(lease.clone(), Some("consumer"))).await;
    match reopened {
        Ok(r) => {
            let mut s = r.into_inner();
            let status = s.message().await.expect_err("a new stream ends at once");
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        }
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
    }
    // The worker kept its lease: nothing was reclaimed, no attempt spent.
    let job = c
        .get_job(req(
            pb::GetJobRequest {
                id: first.job.as_ref().unwrap().id.clone(),
            },
            Some("reader"),
        ))
        .await
        .expect("get")
        .into_inner();
    assert_eq!(job.status, pb::JobStatus::Running as i32);
    assert_eq!(job.attempts, 0);

    stuck.rollback().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.dequeue(req(dequeue.clone(), Some("consumer"))).await {
            Ok(r) => {
                assert!(r.into_inner().leased.is_some(), "job two is due");
                break;
            }
            Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        }
        assert!(Instant::now() < deadline, "never took again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.ack(req(
        pb::AckRequest {
            result: Vec::new(),
            job_id: first.job.as_ref().unwrap().id.clone(),
            lease_id: first.lease_id.clone(),
        },
        Some("consumer"),
    ))
    .await
    .expect("the kept lease still acks");
}
