//! Results through a real server: a Rust Worker's handler sets the job's
//! result, the ack stores it, and a producer reads it back with the job, or
//! waits for it; a result over the server's `--max-result-bytes` fails the
//! job for good, saying why, rather than acking it without its result.

use std::time::Duration;

use jobq_client::{EnqueueOptions, HandlerError, JobContext, Status, Worker};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::harness::{until, TestServer};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    message_id: String,
}

#[tokio::test]
async fn a_handlers_result_is_stored_by_its_ack_and_read_back_with_the_job() {
    let server = TestServer::with(|c| c.max_result_bytes = 4096).await;
    let c = server.client().await;
    let (sent, _) = c
        .enqueue("emails", "send-email", "order-4711", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let (huge, _) = c
        .enqueue("emails", "send-huge", "order-4712", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let shutdown = CancellationToken::new();
    let w = Worker::builder(server.url())
        .queues(["emails"])
        .shutdown(shutdown.clone())
        .handler("send-email", |ctx: JobContext| async move {
            let order = String::from_utf8_lossy(ctx.payload()).into_owned();
            ctx.set_result_json(&Receipt {
                order,
                message_id: "<4711@mail.example>".into(),
            })?;
            Ok::<(), HandlerError>(())
        })
        .handler("send-huge", |ctx: JobContext| async move {
            ctx.set_result(vec![b'x'; 4097]);
            Ok::<(), HandlerError>(())
        })
        .build();
    let run = tokio::spawn(w.run());
    let (done, failed) = until(Duration::from_secs(20), "both jobs settled", || async {
        let done = c.job(sent.id.clone()).await.expect("get");
        let failed = c.job(huge.id.clone()).await.expect("get");
        (done.status == Status::Done && failed.status == Status::Failed).then_some((done, failed))
    })
    .await;
    let receipt: Receipt = done.result_json().expect("a result").expect("JSON");
    assert_eq!(
        receipt,
        Receipt {
            order: "order-4711".into(),
            message_id: "<4711@mail.example>".into()
        }
    );
    assert_eq!(failed.result, None);
    let error = failed.last_error.unwrap_or_default();
    assert!(
        error.contains("the server refused the result") && error.contains("--max-result-bytes"),
        "{error}"
    );
    shutdown.cancel();
    run.await.expect("join").expect("worker");
}

#[tokio::test]
async fn wait_returns_the_done_job_says_failed_or_times_out() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (sent, _) = c
        .enqueue("waits", "send-email", "order-4711", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let (refunded, _) = c
        .enqueue("waits", "send-email", "order-4712", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let (never, _) = c
        .enqueue("nobody-works-here", "k", "", EnqueueOptions::new())
        .await
        .expect("enqueue");
    // Waiting before any worker runs: the wait follows the job.
    let waiting = {
        let c = c.clone();
        let id = sent.id.clone();
        tokio::spawn(async move { c.wait(id, Duration::from_secs(20)).await })
    };
    c.cancel(refunded.id.clone(), "order refunded")
        .await
        .expect("cancel");
    let shutdown = CancellationToken::new();
    let w = Worker::builder(server.url())
        .queues(["waits"])
        .shutdown(shutdown.clone())
        .handler("send-email", |ctx: JobContext| async move {
            ctx.set_result_json(&Receipt {
                order: String::from_utf8_lossy(ctx.payload()).into_owned(),
                message_id: "<4711@mail.example>".into(),
            })?;
            Ok::<(), HandlerError>(())
        })
        .build();
    let run = tokio::spawn(w.run());
    let done = waiting.await.expect("join").expect("DONE");
    assert_eq!(done.status, Status::Done);
    let receipt: Receipt = done.result_json().expect("a result").expect("JSON");
    assert_eq!(receipt.order, "order-4711");
    match c.wait(refunded.id.clone(), Duration::from_secs(5)).await {
        Err(jobq_client::Error::JobFailed(job)) => {
            assert_eq!(job.last_error.as_deref(), Some("cancelled: order refunded"));
        }
        other => panic!("expected JobFailed, got {other:?}"),
    }
    match c.wait(never.id.clone(), Duration::from_millis(300)).await {
        Err(jobq_client::Error::WaitTimedOut { id, .. }) => assert_eq!(id, never.id),
        other => panic!("expected WaitTimedOut, got {other:?}"),
    }
    shutdown.cancel();
    run.await.expect("join").expect("worker");
}

/// A handler's progress rides on the worker's heartbeats: a producer sees
/// the latest report while the job runs and after it is DONE. A message
/// longer than the server's `--max-progress-message-bytes` is cut there,
/// as an error is, and the lease is extended all the same.
#[tokio::test]
async fn a_handlers_progress_reaches_the_producer_with_its_heartbeats() {
    let server = TestServer::with(|c| c.max_progress_message_bytes = 32).await;
    let c = server.client().await;
    let (import, _) = c
        .enqueue("imports", "import", "customers.csv", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let go_on = std::sync::Arc::new(tokio::sync::Notify::new());
    let shutdown = CancellationToken::new();
    let handler_go_on = go_on.clone();
    let w = Worker::builder(server.url())
        .queues(["imports"])
        .lease(Duration::from_secs(3))
        .shutdown(shutdown.clone())
        .handler("import", move |ctx: JobContext| {
            let go_on = handler_go_on.clone();
            async move {
                ctx.progress(10, "x".repeat(100));
                go_on.notified().await;
                ctx.progress(250, "row 4,000 of 10,000");
                go_on.notified().await;
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let run = tokio::spawn(w.run());
    let first = until(Duration::from_secs(20), "the first report", || async {
        c.job(import.id.clone()).await.expect("get").progress
    })
    .await;
    assert_eq!(first.percent, 10);
    assert_eq!(first.message, format!("{}…", "x".repeat(29)));
    go_on.notify_one();
    let progress = until(Duration::from_secs(20), "the second report", || async {
        c.job(import.id.clone())
            .await
            .expect("get")
            .progress
            .filter(|p| p.percent == 100)
    })
    .await;
    assert_eq!(progress.message, "row 4,000 of 10,000");
    let reported = progress.reported_at.expect("stamped");
    go_on.notify_one();
    let done = until(Duration::from_secs(20), "the job is DONE", || async {
        let job = c.job(import.id.clone()).await.expect("get");
        (job.status == Status::Done).then_some(job)
    })
    .await;
    let kept = done.progress.expect("kept after the ack");
    assert_eq!(kept.reported_at, Some(reported));
    assert_eq!(done.history.len(), 1);
    assert_eq!(done.attempts, 0, "no lease lost");
    shutdown.cancel();
    run.await.expect("join").expect("worker");
}
