//! A lease that moves to another stream, and a stream that stalled on an
//! expired lease. Real servers on 127.0.0.1:0, on sled and on PostgreSQL
//! (`JOBQ_TEST_PG`, see `scripts/pg-test.sh`), and two servers sharing
//! one PostgreSQL database.
//!
//! - A worker that declares a lease in `held` on a new stream takes it
//!   over: the stream that held it frees its slot and is sent `revoked`,
//!   with a reason that says where the lease went, on the same server or
//!   another.
//! - A declaration under another worker id takes nothing over.
//! - A stream stalled by an expired lease takes jobs again once its worker
//!   acks that lease, although the ack itself is refused as stale.

mod common;

use std::time::Duration;

use common::{req, Cli, TestServer};
use jobq::pb::{self, lease_event::Event};
use jobq_server::store::postgres::testing;
use tonic::{Code, Streaming};

/// Which store the servers of a test run on.
#[derive(Clone, Copy, Debug)]
enum On {
    Sled,
    Postgres,
}

/// A server on `on`; `url` is the PostgreSQL database to share.
async fn server(on: On, url: Option<&str>, lease: Duration) -> TestServer {
    let url = url.map(str::to_owned);
    TestServer::with(move |c| {
        c.default_lease = lease;
        if let On::Postgres = on {
            c.store = url;
        }
    })
    .await
}

async fn database(on: On) -> Option<String> {
    match on {
        On::Sled => None,
        On::Postgres => Some(testing::fresh_database("jobq_takeover").await),
    }
}

async fn open(
    c: &mut Cli,
    queue: &str,
    worker: &str,
    held: Vec<pb::LeaseRef>,
) -> Streaming<pb::LeaseEvent> {
    let request = pb::LeaseRequest {
        queues: vec![queue.into()],
        worker_id: worker.into(),
        capacity: 1,
        held,
        ..Default::default()
    };
    c.lease(req(request, Some("consumer")))
        .await
        .expect("lease")
        .into_inner()
}

async fn enqueue(c: &mut Cli, queue: &str, n: usize) {
    for _ in 0..n {
        let job = pb::EnqueueRequest {
            queue: queue.into(),
            kind: "k".into(),
            ..Default::default()
        };
        c.enqueue(req(job, Some("producer")))
            .await
            .expect("enqueue");
    }
}

/// The next event on `stream`, within 10 s.
async fn next(stream: &mut Streaming<pb::LeaseEvent>) -> Event {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event within 10 s")
        .expect("stream")
        .expect("open")
        .event
        .expect("an event")
}

async fn next_leased(stream: &mut Streaming<pb::LeaseEvent>) -> pb::LeasedJob {
    match next(stream).await {
        Event::Leased(leased) => leased,
        other => panic!("expected a leased job, got {other:?}"),
    }
}

fn lease_ref(leased: &pb::LeasedJob) -> pb::LeaseRef {
    pb::LeaseRef {
        job_id: leased.job.as_ref().unwrap().id.clone(),
        lease_id: leased.lease_id.clone(),
        progress: None,
    }
}

async fn ack(c: &mut Cli, leased: &pb::LeasedJob) -> Result<(), tonic::Status> {
    let request = pb::AckRequest {
        result: Vec::new(),
        job_id: leased.job.as_ref().unwrap().id.clone(),
        lease_id: leased.lease_id.clone(),
    };
    c.ack(req(request, Some("consumer"))).await.map(|_| ())
}

const LONG: Duration = Duration::from_secs(60);

/// Stream A of worker `w` holds job 1; the same worker declares it on a
/// new stream B (on `b_server`): A is told where it went and is pushed
/// job 2; B's ack of job 1 is the one that counts.
async fn taken_over(a_server: &TestServer, b_server: &TestServer, reason: &str) {
    let mut ca = a_server.client().await;
    let mut cb = b_server.client().await;
    enqueue(&mut ca, "in.to", 2).await;
    let mut a = open(&mut ca, "in.to", "w", vec![]).await;
    let first = next_leased(&mut a).await;

    let mut b = open(&mut cb, "in.to.none", "w", vec![lease_ref(&first)]).await;
    match next(&mut a).await {
        Event::Revoked(r) => {
            assert_eq!(r.lease_id, first.lease_id);
            assert!(r.reason.contains(reason), "reason: {}", r.reason);
        }
        other => panic!("expected revoked, got {other:?}"),
    }
    let second = next_leased(&mut a).await;
    assert_ne!(
        second.job.as_ref().unwrap().id,
        first.job.as_ref().unwrap().id
    );
    ack(&mut cb, &first).await.expect("the new holder acks");
    ack(&mut ca, &second).await.expect("A acks its new job");
    // B's stream stays open and quiet: its queue is empty.
    let quiet = tokio::time::timeout(Duration::from_millis(200), b.message()).await;
    assert!(quiet.is_err(), "B was sent {quiet:?}");
}

/// Worker A holds job 1; worker C declares A's lease: ignored. C's one
/// slot stays free (it is pushed job 2), and A's ack still counts.
async fn not_taken_by_another_worker(on: On) {
    let url = database(on).await;
    let s = server(on, url.as_deref(), LONG).await;
    let mut c = s.client().await;
    enqueue(&mut c, "in.other", 2).await;
    let mut a = open(&mut c, "in.other", "A", vec![]).await;
    let first = next_leased(&mut a).await;
    let mut thief = open(&mut c, "in.other", "C", vec![lease_ref(&first)]).await;
    let second = next_leased(&mut thief).await;
    assert_ne!(
        second.job.as_ref().unwrap().id,
        first.job.as_ref().unwrap().id
    );
    ack(&mut c, &first).await.expect("A still holds its lease");
    let quiet = tokio::time::timeout(Duration::from_millis(200), a.message()).await;
    assert!(quiet.is_err(), "A was told {quiet:?}");
}

/// A stream whose one lease expired without a heartbeat is stalled; its
/// worker's ack of that lease is refused as stale, yet shows the worker
/// alive: the stream is pushed a job again.
async fn a_stale_ack_resumes_a_stalled_stream(on: On) {
    let url = database(on).await;
    let s = server(on, url.as_deref(), Duration::from_millis(300)).await;
    let mut c = s.client().await;
    enqueue(&mut c, "in.stall", 1).await;
    let mut a = open(&mut c, "in.stall", "w", vec![]).await;
    let first = next_leased(&mut a).await;
    match next(&mut a).await {
        Event::Revoked(r) => assert_eq!(r.lease_id, first.lease_id, "{r:?}"),
        other => panic!("expected the lease to expire, got {other:?}"),
    }
    let refused = ack(&mut c, &first).await.expect_err("a stale ack");
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    // The job is due again (one attempt spent); the stream takes it.
    let again = next_leased(&mut a).await;
    assert_eq!(
        again.job.as_ref().unwrap().id,
        first.job.as_ref().unwrap().id
    );
    assert_ne!(again.lease_id, first.lease_id);
}

#[tokio::test]
async fn a_lease_taken_over_by_the_same_worker_frees_the_old_streams_slot_on_sled() {
    let s = server(On::Sled, None, LONG).await;
    taken_over(&s, &s, "newer stream").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_over_by_the_same_worker_frees_the_old_streams_slot_on_postgres() {
    let url = database(On::Postgres).await;
    let s = server(On::Postgres, url.as_deref(), LONG).await;
    taken_over(&s, &s, "newer stream").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_over_on_another_server_frees_the_old_streams_slot() {
    let url = database(On::Postgres).await;
    let one = server(On::Postgres, url.as_deref(), LONG).await;
    let two = server(On::Postgres, url.as_deref(), LONG).await;
    taken_over(&one, &two, "another server").await;
}

#[tokio::test]
async fn another_workers_declaration_takes_nothing_on_sled() {
    not_taken_by_another_worker(On::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_workers_declaration_takes_nothing_on_postgres() {
    not_taken_by_another_worker(On::Postgres).await;
}

#[tokio::test]
async fn a_stale_ack_resumes_a_stalled_stream_on_sled() {
    a_stale_ack_resumes_a_stalled_stream(On::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_ack_resumes_a_stalled_stream_on_postgres() {
    a_stale_ack_resumes_a_stalled_stream(On::Postgres).await;
}
