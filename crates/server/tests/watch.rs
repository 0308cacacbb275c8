//! WatchJob against a real server: the current state first, then each
//! change (a progress report among them), the result with the final state, then the end of the stream;
//! the read role on the job's queue; bounded ids and streams.

mod common;

use std::time::Duration;

use common::{code, req, TestServer};
use jobq::pb;
use tokio_stream::StreamExt;
use tonic::{Code, Streaming};

async fn enqueue(c: &mut common::Cli, queue: &str) -> String {
    c.enqueue(req(
        pb::EnqueueRequest {
            queue: queue.into(),
            kind: "send-email".into(),
            payload: b"order-4711".to_vec(),
            ..Default::default()
        },
        Some("producer"),
    ))
    .await
    .unwrap()
    .into_inner()
    .job
    .unwrap()
    .id
}

async fn watch(c: &mut common::Cli, ids: &[&str], token: &str) -> Streaming<pb::Job> {
    c.watch_job(req(
        pb::WatchJobRequest {
            ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        },
        Some(token),
    ))
    .await
    .expect("watch")
    .into_inner()
}

async fn next(stream: &mut Streaming<pb::Job>) -> Option<pb::Job> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10 s")
        .map(|r| r.expect("a state"))
}

#[tokio::test]
async fn a_watcher_sees_each_state_then_the_result_then_the_end() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let id = enqueue(&mut c, "in.w").await;
    let mut states = watch(&mut c, &[&id], "reader").await;
    let first = next(&mut states).await.expect("the current state");
    assert_eq!(first.status, pb::JobStatus::Pending as i32);
    assert!(first.payload.is_empty(), "states leave the payload out");

    let leased = c
        .dequeue(req(
            pb::DequeueRequest {
                queues: vec!["in.w".into()],
                worker_id: "w".into(),
                ..Default::default()
            },
            Some("consumer"),
        ))
        .await
        .unwrap()
        .into_inner()
        .leased
        .expect("leased");
    let running = next(&mut states).await.expect("RUNNING");
    assert_eq!(running.status, pb::JobStatus::Running as i32);
    assert_eq!(running.worker_id, "w");
    // A heartbeat moves the lease's deadline only: not a state to send.
    c.heartbeat(req(
        pb::HeartbeatRequest {
            worker_id: "w".into(),
            leases: vec![pb::LeaseRef {
                job_id: id.clone(),
                lease_id: leased.lease_id.clone(),
                progress: None,
            }],
            ..Default::default()
        },
        Some("consumer"),
    ))
    .await
    .unwrap();
    // One that reports progress is.
    c.heartbeat(req(
        pb::HeartbeatRequest {
            worker_id: "w".into(),
            leases: vec![pb::LeaseRef {
                job_id: id.clone(),
                lease_id: leased.lease_id.clone(),
                progress: Some(pb::Progress {
                    percent: 60,
                    message: "rendered".into(),
                    reported_at: None,
                }),
            }],
            ..Default::default()
        },
        Some("consumer"),
    ))
    .await
    .unwrap();
    let reported = next(&mut states).await.expect("the progress");
    assert_eq!(reported.status, pb::JobStatus::Running as i32);
    let progress = reported.progress.expect("progress");
    assert_eq!(
        (progress.percent, progress.message.as_str()),
        (60, "rendered")
    );
    c.ack(req(
        pb::AckRequest {
            job_id: id.clone(),
            lease_id: leased.lease_id,
            result: br#"{"message_id":"<4711@mail>"}"#.to_vec(),
        },
        Some("consumer"),
    ))
    .await
    .unwrap();
    let done = next(&mut states).await.expect("DONE");
    assert_eq!(done.status, pb::JobStatus::Done as i32);
    assert_eq!(done.result, br#"{"message_id":"<4711@mail>"}"#);
    assert_eq!(done.progress.expect("kept").percent, 60);
    assert!(
        next(&mut states).await.is_none(),
        "the stream ends after a final state"
    );

    // A finished job: its final state, then the end.
    let mut again = watch(&mut c, &[&id, &id], "reader").await;
    assert_eq!(
        next(&mut again).await.expect("final").status,
        pb::JobStatus::Done as i32
    );
    assert!(next(&mut again).await.is_none());
}

#[tokio::test]
async fn several_jobs_end_when_the_last_is_final_and_a_deleted_one_is_not_found() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let a = enqueue(&mut c, "in.w").await;
    let b = enqueue(&mut c, "in.w").await;
    let mut states = watch(&mut c, &[&a, &b], "reader").await;
    let mut seen = vec![
        next(&mut states).await.unwrap().id,
        next(&mut states).await.unwrap().id,
    ];
    seen.sort();
    let mut want = vec![a.clone(), b.clone()];
    want.sort();
    assert_eq!(seen, want);
    for id in [&a, &b] {
        c.cancel_job(req(
            pb::CancelJobRequest {
                id: id.clone(),
                reason: "refunded".into(),
            },
            Some("admin"),
        ))
        .await
        .unwrap();
    }
    let mut failed = Vec::new();
    while let Some(job) = next(&mut states).await {
        assert_eq!(job.status, pb::JobStatus::Failed as i32);
        assert_eq!(job.last_error, "cancelled: refunded");
        failed.push(job.id);
    }
    failed.sort();
    assert_eq!(failed, want);

    let d = enqueue(&mut c, "in.w").await;
    let mut states = watch(&mut c, &[&d], "reader").await;
    next(&mut states).await.expect("PENDING");
    c.delete_job(req(pb::DeleteJobRequest { id: d.clone() }, Some("admin")))
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), states.next())
        .await
        .expect("an end")
        .expect("an item");
    assert_eq!(end.expect_err("deleted").code(), Code::NotFound);
}

#[tokio::test]
async fn watching_is_read_access_and_bounded() {
    let server = TestServer::with(|c| {
        c.max_watch_ids = 2;
        c.max_watchers = 1;
    })
    .await;
    let mut c = server.client().await;
    let id = enqueue(&mut c, "in.w").await;
    let other = enqueue(&mut c, "in.w").await;
    let call = |ids: Vec<String>, token: Option<&str>| req(pb::WatchJobRequest { ids }, token);
    assert_eq!(
        code(c.watch_job(call(vec![id.clone()], None)).await),
        Code::Unauthenticated
    );
    assert_eq!(
        code(c.watch_job(call(vec![id.clone()], Some("producer"))).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(c.watch_job(call(vec![], Some("reader"))).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.watch_job(call(vec!["x".into()], Some("reader"))).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.watch_job(call(
                vec![id.clone(), other.clone(), "99999".into()],
                Some("reader")
            ))
            .await
        ),
        Code::InvalidArgument,
        "three ids over a limit of two"
    );
    let held = watch(&mut c, &[&id, &other], "reader").await;
    assert_eq!(
        code(c.watch_job(call(vec![id.clone()], Some("reader"))).await),
        Code::ResourceExhausted,
        "one stream at most"
    );
    drop(held);
    // The place comes back once the server sees the stream go.
    let mut reopened = false;
    for _ in 0..500 {
        if c.watch_job(call(vec![id.clone()], Some("reader")))
            .await
            .is_ok()
        {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reopened, "a closed stream's place was never freed");
}
