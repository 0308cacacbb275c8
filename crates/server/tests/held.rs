//! Leases a Lease request declares in `held` that do not match (a wrong
//! job id, a lease declared twice) are ignored, as the proto says, and
//! change nothing: in particular they do not take the lease from the
//! stream that holds it, whose slot its ack must still free. A real
//! server on 127.0.0.1:0.

mod common;

use std::time::Duration;

use common::{req, Cli, TestServer};
use jobq::pb::{self, lease_event::Event};
use tonic::Streaming;

fn lease_req(queue: &str, held: Vec<pb::LeaseRef>) -> pb::LeaseRequest {
    pb::LeaseRequest {
        queues: vec![queue.into()],
        worker_id: "w".into(),
        capacity: 1,
        held,
        ..Default::default()
    }
}

/// Opens a Lease stream of capacity 1 on `queue`, declaring `held`.
async fn open(c: &mut Cli, queue: &str, held: Vec<pb::LeaseRef>) -> Streaming<pb::LeaseEvent> {
    c.lease(req(lease_req(queue, held), Some("consumer")))
        .await
        .expect("lease")
        .into_inner()
}

async fn enqueue(c: &mut Cli, queue: &str, n: usize) {
    for _ in 0..n {
        c.enqueue(req(
            pb::EnqueueRequest {
                queue: queue.into(),
                kind: "k".into(),
                ..Default::default()
            },
            Some("producer"),
        ))
        .await
        .expect("enqueue");
    }
}

/// The next leased job on `stream`, within 10 s.
async fn next_leased(stream: &mut Streaming<pb::LeaseEvent>) -> pb::LeasedJob {
    let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a job is pushed")
        .expect("stream")
        .expect("open");
    match event.event {
        Some(Event::Leased(leased)) => leased,
        other => panic!("expected a leased job, got {other:?}"),
    }
}

async fn ack(c: &mut Cli, leased: &pb::LeasedJob) {
    c.ack(req(
        pb::AckRequest {
            result: Vec::new(),
            job_id: leased.job.as_ref().unwrap().id.clone(),
            lease_id: leased.lease_id.clone(),
        },
        Some("consumer"),
    ))
    .await
    .expect("ack");
}

#[tokio::test]
async fn a_declaration_with_a_wrong_job_does_not_take_another_streams_lease() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    enqueue(&mut c, "in.steal", 3).await;
    let mut a = open(&mut c, "in.steal", vec![]).await;
    let first = next_leased(&mut a).await;

    // Another stream declares A's lease under a job that does not hold it.
    // Whether A's ack lands before that declaration is checked or after,
    // A's slot is freed.
    let bogus = pb::LeaseRef {
        job_id: "99999".into(),
        lease_id: first.lease_id.clone(),
        progress: None,
    };
    let _b = open(&mut c, "in.other", vec![bogus]).await;
    ack(&mut c, &first).await;
    let second = next_leased(&mut a).await;
    assert_ne!(second.job.unwrap().id, first.job.unwrap().id);
}

#[tokio::test]
async fn a_lease_declared_twice_counts_once() {
    // The first stream's lease waits for its worker to come back, rather
    // than being reclaimed the moment the stream ends.
    let server = TestServer::with(|c| c.disconnect_grace = Duration::from_secs(30)).await;
    let mut c = server.client().await;
    enqueue(&mut c, "in.twice", 3).await;
    let mut first_stream = open(&mut c, "in.twice", vec![]).await;
    let first = next_leased(&mut first_stream).await;
    drop(first_stream);

    // The worker reconnects and declares its lease twice, the second time
    // under another job id.
    let job_id = first.job.as_ref().unwrap().id.clone();
    let held = vec![
        pb::LeaseRef {
            job_id,
            lease_id: first.lease_id.clone(),
            progress: None,
        },
        pb::LeaseRef {
            job_id: "99999".into(),
            lease_id: first.lease_id.clone(),
            progress: None,
        },
    ];
    let mut again = open(&mut c, "in.twice", held).await;
    // The lease fills its one slot: nothing more is pushed meanwhile.
    let early = tokio::time::timeout(Duration::from_millis(500), again.message()).await;
    assert!(early.is_err(), "pushed past capacity 1: {early:?}");
    // Its ack frees the slot: the next job comes.
    ack(&mut c, &first).await;
    let second = next_leased(&mut again).await;
    assert_ne!(second.job.unwrap().id, first.job.unwrap().id);
}

/// A heartbeat that names a stream's lease under a wrong job is told the
/// lease is lost (that job does not hold it), and frees nothing: the
/// stream's slot stays taken until the real job's ack.
#[tokio::test]
async fn a_heartbeat_with_a_wrong_job_frees_no_slot() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    enqueue(&mut c, "in.beat", 2).await;
    let mut a = open(&mut c, "in.beat", vec![]).await;
    let first = next_leased(&mut a).await;
    let lost = c
        .heartbeat(req(
            pb::HeartbeatRequest {
                worker_id: "w".into(),
                leases: vec![pb::LeaseRef {
                    job_id: "99999".into(),
                    lease_id: first.lease_id.clone(),
                    progress: None,
                }],
                ..Default::default()
            },
            Some("consumer"),
        ))
        .await
        .expect("heartbeat")
        .into_inner()
        .lost;
    assert_eq!(lost.len(), 1, "job 99999 holds no such lease");
    let early = tokio::time::timeout(Duration::from_millis(500), a.message()).await;
    assert!(early.is_err(), "the slot was freed: {early:?}");
    ack(&mut c, &first).await;
    let second = next_leased(&mut a).await;
    assert_ne!(second.job.unwrap().id, first.job.unwrap().id);
}
