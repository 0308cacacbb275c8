//! Limits that hold under abuse, against a real server: Lease
//! streams per token, the in-flight request bytes budget, and lease ids
//! that knowing job ids does not help guess.

mod common;

use std::{collections::HashSet, time::Duration};

use common::{code, req, TestServer};
use jobq::pb;
use tonic::Code;

fn lease_req(queue: &str) -> pb::LeaseRequest {
    pb::LeaseRequest {
        queues: vec![queue.into()],
        worker_id: "w".into(),
        capacity: 1,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_token_holds_at_most_max_streams_per_token() {
    let server = TestServer::with(|c| c.max_streams_per_token = 2).await;
    let mut c = server.client().await;
    let first = c
        .lease(req(lease_req("in.s"), Some("consumer")))
        .await
        .unwrap();
    let _second = c
        .lease(req(lease_req("in.s"), Some("consumer")))
        .await
        .unwrap();
    let third = c.lease(req(lease_req("in.s"), Some("consumer"))).await;
    assert_eq!(code(third), Code::ResourceExhausted);
    // Another token is not held back by the first one's streams.
    let _other = c
        .lease(req(lease_req("in.s"), Some("consumer2")))
        .await
        .unwrap();
    // A closed stream frees its slot (once the server sees it end).
    drop(first);
    let mut opened = None;
    for _ in 0..500 {
        if let Ok(s) = c.lease(req(lease_req("in.s"), Some("consumer"))).await {
            opened = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(opened.is_some(), "the closed stream's slot was never freed");
}

/// A worker whose connection dropped reconnects within --disconnect-grace
/// to keep its leases: its old stream's quota slot must be free by then,
/// not held until the grace is over.
#[tokio::test]
async fn a_dropped_stream_frees_its_quota_slot_before_the_disconnect_grace() {
    use jobq::pb::lease_event::Event;
    let server = TestServer::with(|c| {
        c.max_streams_per_token = 1;
        c.disconnect_grace = Duration::from_secs(60);
    })
    .await;
    let mut c = server.client().await;
    c.enqueue(req(
        pb::EnqueueRequest {
            queue: "in.grace".into(),
            kind: "k".into(),
            ..Default::default()
        },
        Some("producer"),
    ))
    .await
    .unwrap();
    let mut first = c
        .lease(req(lease_req("in.grace"), Some("consumer")))
        .await
        .unwrap()
        .into_inner();
    let leased = match first.message().await.unwrap().unwrap().event {
        Some(Event::Leased(leased)) => leased,
        other => panic!("expected a leased job, got {other:?}"),
    };
    drop(first);
    let held = pb::LeaseRef {
        job_id: leased.job.as_ref().unwrap().id.clone(),
        lease_id: leased.lease_id.clone(),
        progress: None,
    };
    let mut reopened = None;
    for _ in 0..500 {
        let mut ask = lease_req("in.grace");
        ask.held = vec![held.clone()];
        match c.lease(req(ask, Some("consumer"))).await {
            Ok(stream) => {
                reopened = Some(stream);
                break;
            }
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        reopened.is_some(),
        "the slot was still held within the grace"
    );
    // The lease was kept: its ack lands.
    c.ack(req(
        pb::AckRequest {
            result: Vec::new(),
            job_id: held.job_id,
            lease_id: held.lease_id,
        },
        Some("consumer"),
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn requests_over_the_inflight_bytes_budget_are_resource_exhausted() {
    let server = TestServer::with(|c| c.max_inflight_request_bytes = 64 * 1024).await;
    let mut c = server.client().await;
    let big = pb::EnqueueRequest {
        queue: "in.big".into(),
        kind: "k".into(),
        payload: vec![7; 200 * 1024],
        ..Default::default()
    };
    for _ in 0..3 {
        let status = c
            .enqueue(req(big.clone(), Some("producer")))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    }
    // Nothing was stored, and the budget was given back: small calls pass.
    let stats = c
        .stats(req(pb::StatsRequest::default(), Some("root")))
        .await
        .unwrap()
        .into_inner();
    assert!(stats.queues.is_empty());
    for i in 0..50 {
        let small = pb::EnqueueRequest {
            queue: "in.small".into(),
            kind: "k".into(),
            payload: vec![i; 16 * 1024],
            ..Default::default()
        };
        c.enqueue(req(small, Some("producer"))).await.unwrap();
    }
}

#[tokio::test]
async fn an_open_reflection_stream_does_not_pin_the_inflight_bytes_budget() {
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, ServerReflectionRequest,
    };
    let server = TestServer::with(|c| c.max_inflight_request_bytes = 64 * 1024).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    // Reflection needs no token and its request stream stays open as long
    // as the caller likes: 3 requests of 3 KiB each (together over the
    // 4 KiB that such a call may hold), every one answered.
    let (send, asks) = tokio::sync::mpsc::channel(8);
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(asks))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..3 {
        send.send(ServerReflectionRequest {
            message_request: Some(MessageRequest::ListServices("x".repeat(3 * 1024))),
            host: String::new(),
        })
        .await
        .unwrap();
        answers.message().await.unwrap().expect("an answer");
    }
    // With the stream still open, a 16 KiB enqueue fits the 64 KiB budget:
    // the reflection requests' bytes were released once answered (and came
    // from the budget of calls that need no token anyway).
    let mut c = server.client().await;
    let small = pb::EnqueueRequest {
        queue: "in.small".into(),
        kind: "k".into(),
        payload: vec![1; 16 * 1024],
        ..Default::default()
    };
    c.enqueue(req(small, Some("producer"))).await.unwrap();
    drop(send);
}

#[tokio::test]
async fn lease_ids_are_random_not_sequential_nor_derived_from_job_ids() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let batch = pb::EnqueueBatchRequest {
        jobs: (0..200)
            .map(|_| pb::EnqueueRequest {
                queue: "in.ids".into(),
                kind: "k".into(),
                ..Default::default()
            })
            .collect(),
    };
    c.enqueue_batch(req(batch, Some("root"))).await.unwrap();
    let mut pairs = Vec::new();
    for _ in 0..200 {
        let leased = c
            .dequeue(req(
                pb::DequeueRequest {
                    queues: vec!["in.ids".into()],
                    worker_id: "w".into(),
                    ..Default::default()
                },
                Some("root"),
            ))
            .await
            .unwrap()
            .into_inner()
            .leased
            .expect("a due job");
        let job: u64 = leased.job.unwrap().id.parse().unwrap();
        let lease: u64 = leased.lease_id.parse().unwrap();
        pairs.push((job, lease));
    }
    let leases: Vec<u64> = pairs.iter().map(|p| p.1).collect();
    assert_eq!(
        leases.iter().collect::<HashSet<_>>().len(),
        200,
        "lease ids repeat"
    );
    for (job, lease) in &pairs {
        assert_ne!(job, lease, "a lease id equals its job id");
        // Not a small offset from the job id either.
        assert!(
            lease.abs_diff(*job) > 1 << 20,
            "lease {lease} is near job {job}"
        );
    }
    // Consecutive takes are not consecutive (or nearby) numbers.
    let near = leases
        .windows(2)
        .filter(|w| w[0].abs_diff(w[1]) < 1 << 32)
        .count();
    assert_eq!(near, 0, "consecutive lease ids are close: {leases:?}");
    // They use the whole 64-bit range: random high bits.
    let high = leases.iter().filter(|&&l| l >> 63 == 1).count();
    assert!(
        (50..=150).contains(&high),
        "{high} of 200 have the top bit set"
    );
}

/// An EnqueueRequest as a client that does not follow the schema might
/// send it: its `queue` (field 1, a string) as arbitrary bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawEnqueue {
    #[prost(bytes = "vec", tag = "1")]
    queue: Vec<u8>,
}

/// Its `queue` as a fixed 64-bit number: the wrong wire type.
#[derive(Clone, PartialEq, prost::Message)]
struct WrongWire {
    #[prost(fixed64, tag = "1")]
    queue: u64,
}

/// A request that is not a valid protobuf message (a string that is not
/// UTF-8, a field of the wrong wire type) is bad input: INVALID_ARGUMENT,
/// as docs/src/design.md §2 has it, not the INTERNAL that tonic reports and that
/// here means the server's storage failed. Nothing is enqueued.
#[tokio::test]
async fn undecodable_requests_are_invalid_argument() {
    let server = TestServer::with(|_| {}).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/jobq.v1.JobQueue/Enqueue");
    async fn send<M: prost::Message + Default + Send + Sync + 'static>(
        channel: &tonic::transport::Channel,
        path: &tonic::codegen::http::uri::PathAndQuery,
        raw: M,
    ) -> tonic::Status {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.unwrap();
        grpc.unary::<_, pb::EnqueueResponse, _>(
            req(raw, Some("producer")),
            path.clone(),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("an undecodable request is refused")
    }
    let not_utf8 = send(
        &channel,
        &path,
        RawEnqueue {
            queue: vec![0xff, 0xfe],
        },
    )
    .await;
    let wrong_wire = send(&channel, &path, WrongWire { queue: 7 }).await;
    for (what, status) in [("not UTF-8", not_utf8), ("wrong wire type", wrong_wire)] {
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains("decode"),
            "{what}: {}",
            status.message()
        );
    }
    let mut c = server.client().await;
    let stats = c
        .stats(req(pb::StatsRequest::default(), Some("root")))
        .await
        .unwrap()
        .into_inner();
    assert!(stats.queues.is_empty(), "nothing was enqueued");
}

/// Enqueues one job in `queue` and takes it: its id and lease.
async fn one_running(c: &mut common::Cli, queue: &str) -> (String, pb::LeasedJob) {
    c.enqueue(req(
        pb::EnqueueRequest {
            queue: queue.into(),
            kind: "k".into(),
            ..Default::default()
        },
        Some("producer"),
    ))
    .await
    .unwrap();
    let leased = c
        .dequeue(req(
            pb::DequeueRequest {
                queues: vec![queue.into()],
                worker_id: "w".into(),
                ..Default::default()
            },
            Some("consumer"),
        ))
        .await
        .unwrap()
        .into_inner()
        .leased
        .expect("a job");
    (leased.job.as_ref().unwrap().id.clone(), leased)
}

async fn get_job(c: &mut common::Cli, id: &str) -> pb::Job {
    c.get_job(req(pb::GetJobRequest { id: id.into() }, Some("admin")))
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_result_over_max_result_bytes_is_refused_and_the_job_stays_running() {
    let server = TestServer::with(|c| c.max_result_bytes = 1024).await;
    let mut c = server.client().await;
    let (job_id, leased) = one_running(&mut c, "in.results").await;
    let ack = |result: Vec<u8>| {
        req(
            pb::AckRequest {
                job_id: job_id.clone(),
                lease_id: leased.lease_id.clone(),
                result,
            },
            Some("consumer"),
        )
    };
    let refused = c.ack(ack(vec![1; 1025])).await;
    assert_eq!(code(refused), Code::InvalidArgument);
    let still = get_job(&mut c, &job_id).await;
    assert_eq!(still.status, pb::JobStatus::Running as i32, "not acked");
    c.ack(ack(vec![2; 1024])).await.expect("at the limit");
    let done = get_job(&mut c, &job_id).await;
    assert_eq!(done.status, pb::JobStatus::Done as i32);
    assert_eq!(done.result, vec![2; 1024]);
}

#[tokio::test]
async fn a_progress_over_100_percent_is_refused_and_a_long_message_is_cut() {
    let server = TestServer::with(|c| c.max_progress_message_bytes = 16).await;
    let mut c = server.client().await;
    let (job_id, leased) = one_running(&mut c, "in.progress").await;
    let before = leased.lease_expires_at.unwrap();
    let beat = |percent: u32, message: &str| {
        req(
            pb::HeartbeatRequest {
                worker_id: "w".into(),
                leases: vec![pb::LeaseRef {
                    job_id: job_id.clone(),
                    lease_id: leased.lease_id.clone(),
                    progress: Some(pb::Progress {
                        percent,
                        message: message.into(),
                        reported_at: None,
                    }),
                }],
                ..Default::default()
            },
            Some("consumer"),
        )
    };
    let refused = c.heartbeat(beat(101, "too far")).await;
    assert_eq!(code(refused), Code::InvalidArgument);
    let job = get_job(&mut c, &job_id).await;
    assert_eq!(job.progress, None, "nothing kept");
    assert_eq!(job.lease_expires_at, Some(before), "nothing extended");
    // Words for people, as a Fail's error: cut (on a character boundary,
    // marked), a NUL kept as U+FFFD, never refused.
    let lost = c
        .heartbeat(beat(100, "ab\0défghijklmnopqrstuvwxyz"))
        .await
        .expect("kept")
        .into_inner()
        .lost;
    assert!(lost.is_empty());
    let progress = get_job(&mut c, &job_id).await.progress.expect("kept");
    assert_eq!(progress.percent, 100);
    assert_eq!(progress.message, "ab\u{fffd}défghij…");
    assert!(progress.message.len() <= 16);
    assert!(progress.reported_at.is_some());
}
