//! The operator's calls end to end: a real server, a real Lease
//! stream and a real Worker.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use jobq::pb::{self, lease_event::Event};
use jobq_client::{Client, EnqueueOptions, HandlerError, JobContext, Worker};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::harness::{http, http_get, until, ServerProcess, TestServer};

async fn open(c: &Client, queue: &str, lease: Duration) -> tonic::Streaming<pb::LeaseEvent> {
    let req = pb::LeaseRequest {
        queues: vec![queue.into()],
        worker_id: "w1".into(),
        capacity: 1,
        lease_duration: Some(lease.try_into().expect("duration")),
        held: vec![],
    };
    c.inner().lease(req).await.expect("lease").into_inner()
}

async fn next(stream: &mut tonic::Streaming<pb::LeaseEvent>, limit: Duration) -> Event {
    tokio::time::timeout(limit, stream.message())
        .await
        .expect("an event in time")
        .expect("stream ok")
        .expect("stream open")
        .event
        .expect("event set")
}

fn code<T: std::fmt::Debug>(r: jobq_client::Result<T>) -> Code {
    r.expect_err("expected an error")
        .code()
        .expect("a gRPC status")
}

#[tokio::test]
async fn cancel_revokes_a_running_job_on_its_lease_stream() {
    let data = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(data.path(), &[]);
    let c = server.client().await;
    let (job, _) = c
        .enqueue("q", "k", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let mut stream = open(&c, "q", Duration::from_secs(600)).await;
    let Event::Leased(leased) = next(&mut stream, Duration::from_secs(10)).await else {
        panic!("expected a leased job");
    };
    let cancelled = c
        .cancel_job(job.id.clone(), "customer left")
        .await
        .expect("cancel");
    let sent = Instant::now();
    assert_eq!(cancelled.status, pb::JobStatus::Failed as i32);
    assert_eq!(cancelled.last_error, "cancelled: customer left");
    // The contract: the holder is told within a second.
    match next(&mut stream, Duration::from_secs(1)).await {
        Event::Revoked(r) => {
            assert_eq!(
                (r.job_id, r.lease_id),
                (job.id.clone(), leased.lease_id.clone())
            );
            assert_eq!(r.reason, "revoked (cancelled: customer left)");
        }
        other => panic!("expected revoked, got {other:?}"),
    }
    assert!(sent.elapsed() < Duration::from_secs(1));
    assert_eq!(
        code(c.ack(job.id.clone(), leased.lease_id.clone()).await),
        Code::Aborted
    );
    let lease = pb::LeaseRef {
        job_id: job.id.clone(),
        lease_id: leased.lease_id.clone(),
        progress: None,
    };
    let lost = c
        .heartbeat("w1", vec![lease], None)
        .await
        .expect("heartbeat");
    assert_eq!(lost.len(), 1, "the heartbeat reports the lease lost");
    let got = c.get_job(job.id.clone()).await.expect("get");
    assert_eq!(
        got.history.last().expect("attempt").outcome,
        pb::AttemptOutcome::Revoked as i32
    );
    assert_eq!(
        code(c.cancel_job(job.id.clone(), "again").await),
        Code::FailedPrecondition
    );
    assert_eq!(code(c.cancel_job("999999", "").await), Code::NotFound);
    assert_eq!(
        code(c.cancel_job("not-an-id", "").await),
        Code::InvalidArgument
    );
    let (_, metrics) = http_get(server.http, "/metrics").await;
    assert!(
        metrics.contains(r#"jobq_reclaimed_total{queue="q",reason="revoked"} 1"#),
        "{metrics}"
    );
    // Retry brings it back, and the same stream (its slot freed) gets it.
    let back = c.retry(job.id.clone()).await.expect("retry");
    assert_eq!(back.status, pb::JobStatus::Pending as i32);
    let Event::Leased(again) = next(&mut stream, Duration::from_secs(10)).await else {
        panic!("expected the job again");
    };
    assert_eq!(again.job.expect("job").id, job.id);
    c.ack(job.id.clone(), again.lease_id).await.expect("ack");
}

#[tokio::test]
async fn a_worker_handler_sees_the_cancel_within_a_second() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let started = Arc::new(tokio::sync::Notify::new());
    let cancelled_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let (s, at) = (Arc::clone(&started), Arc::clone(&cancelled_at));
    let w = Worker::builder(server.url())
        .queues(["q"])
        .capacity(1)
        .lease(Duration::from_secs(600))
        .drain_timeout(Duration::from_secs(10))
        .shutdown(shutdown.clone())
        .handler("slow", move |ctx: JobContext| {
            let (s, at) = (Arc::clone(&s), Arc::clone(&at));
            async move {
                // The worker drops this future after its cancel grace; the token tells
                // work spawned elsewhere.
                let token = ctx.cancellation_token();
                tokio::spawn(async move {
                    token.cancelled().await;
                    *at.lock().unwrap() = Some(Instant::now());
                });
                s.notify_one();
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let run = tokio::spawn(w.run());
    let (job, _) = c
        .enqueue("q", "slow", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(20), started.notified())
        .await
        .expect("the handler starts");
    let sent = Instant::now();
    c.cancel_job(job.id.clone(), "stop").await.expect("cancel");
    let seen = until(Duration::from_secs(5), "the handler's cancellation", || {
        let at = Arc::clone(&cancelled_at);
        async move { *at.lock().unwrap() }
    })
    .await;
    assert!(
        seen.duration_since(sent) < Duration::from_secs(1),
        "cancelled after {:?}",
        seen.duration_since(sent)
    );
    let got = c.get_job(job.id.clone()).await.expect("get");
    assert_eq!(got.status, pb::JobStatus::Failed as i32);
    assert_eq!(got.last_error, "cancelled: stop");
    assert_eq!(
        got.history.last().expect("attempt").outcome,
        pb::AttemptOutcome::Revoked as i32
    );
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the worker stops")
        .expect("worker task")
        .expect("worker result");
}

/// Nothing arrives on the stream for `quiet` (the one wait on absence: what
/// is checked is that nothing happens).
async fn silent(stream: &mut tonic::Streaming<pb::LeaseEvent>, quiet: Duration) -> bool {
    tokio::time::timeout(quiet, stream.message()).await.is_err()
}

async fn dequeue_now(c: &Client, queue: &str) -> Option<pb::LeasedJob> {
    c.dequeue(vec![queue.to_owned()], "w2", None, None)
        .await
        .expect("dequeue")
}

#[tokio::test]
async fn a_pause_holds_across_a_restart_and_resume_delivers_everything() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(data.path(), &[]);
    let c = server.client().await;
    c.pause_queue("q").await.expect("pause");
    let mut ids = Vec::new();
    for i in 0..3 {
        let (job, created) = c
            .enqueue("q", "k", format!("{i}"), EnqueueOptions::new())
            .await
            .expect("enqueue is accepted while paused");
        assert!(created);
        ids.push(job.id);
    }
    let mut stream = open(&c, "q", Duration::from_secs(600)).await;
    assert!(dequeue_now(&c, "q").await.is_none(), "Dequeue is empty");
    assert!(
        silent(&mut stream, Duration::from_secs(2)).await,
        "a paused queue pushes nothing"
    );
    let stats = c.stats(Some("q")).await.expect("stats");
    assert!(stats[0].paused);
    assert_eq!(stats[0].pending, 3);
    let (status, page) = http_get(server.http, "/").await;
    assert_eq!(status, 200);
    assert!(
        page.contains(r#"class="paused""#),
        "the dashboard shows the pause"
    );
    drop(stream);

    let addr = server.addr.to_string();
    server.terminate();
    let server = ServerProcess::start_at(data.path(), &addr, &[]);
    let c = server.client().await;
    assert!(
        c.stats(Some("q")).await.expect("stats")[0].paused,
        "still paused"
    );
    assert!(dequeue_now(&c, "q").await.is_none());
    let req = pb::LeaseRequest {
        queues: vec!["q".into()],
        worker_id: "w1".into(),
        capacity: 3,
        lease_duration: Some(Duration::from_secs(600).try_into().expect("duration")),
        held: vec![],
    };
    let mut stream = c.inner().lease(req).await.expect("lease").into_inner();
    c.resume_queue("q").await.expect("resume");
    let mut got = Vec::new();
    for _ in 0..3 {
        match next(&mut stream, Duration::from_secs(10)).await {
            Event::Leased(l) => got.push(l.job.expect("job").id),
            other => panic!("expected a leased job, got {other:?}"),
        }
    }
    got.sort();
    ids.sort();
    assert_eq!(got, ids, "the waiting stream gets all three on resume");
    assert!(!c.stats(Some("q")).await.expect("stats")[0].paused);
}

/// `jobq --server URL --json ARGS...`: (exit code, stdout, stderr).
async fn jobq(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(crate::harness::JOBQ)
        .arg("--server")
        .arg(url)
        .arg("--json")
        .args(args)
        .env_remove("JOBQ_SERVER")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("jobq finished in time")
        .expect("jobq output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

#[tokio::test]
async fn the_operator_commands_of_the_cli() {
    let server = TestServer::start().await;
    let (url, c) = (server.url(), server.client().await);
    let mut ids = Vec::new();
    for i in 0..3 {
        let (job, _) = c
            .enqueue("q", "k", format!("{i}"), EnqueueOptions::new())
            .await
            .expect("enqueue");
        ids.push(job.id);
    }

    let (rc, out, err) = jobq(&url, &["cancel", &ids[0], "--reason", "refunded"]).await;
    assert_eq!(rc, 0, "{err}");
    let v = json(&out);
    assert_eq!(
        (v["status"].as_str(), v["last_error"].as_str()),
        (Some("FAILED"), Some("cancelled: refunded"))
    );
    let (rc, _, err) = jobq(&url, &["cancel", &ids[0]]).await;
    assert_eq!(rc, 1);
    assert!(err.contains("FAILED_PRECONDITION"), "{err}");

    let (rc, out, err) = jobq(&url, &["pause", "q"]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(json(&out)["paused"], true);
    let (_, out, _) = jobq(&url, &["stats", "--queue", "q"]).await;
    assert_eq!(json(&out)[0]["paused"], true, "{out}");
    assert!(dequeue_now(&c, "q").await.is_none());
    let (rc, _, err) = jobq(&url, &["resume", "q"]).await;
    assert_eq!(rc, 0, "{err}");
    let leased = dequeue_now(&c, "q").await.expect("resumed");
    let running = leased.job.expect("job").id;

    let (rc, _, err) = jobq(&url, &["delete", &running]).await;
    assert_eq!(rc, 1);
    assert!(err.contains("cancel it first"), "{err}");
    let pending = ids
        .iter()
        .find(|id| **id != running && **id != ids[0])
        .expect("one left");
    let (rc, out, err) = jobq(&url, &["delete", pending]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(json(&out)["deleted"], true);
    assert_eq!(code(c.get_job(pending.clone()).await), Code::NotFound);

    let (rc, _, _) = jobq(&url, &["purge", "--queue", "q", "--status", "running"]).await;
    assert_eq!(rc, 2, "RUNNING jobs are never purged: a usage error");
    let (rc, _, err) = jobq(
        &url,
        &[
            "purge",
            "--queue",
            "q",
            "--status",
            "pending",
            "--older-than",
            "1h",
        ],
    )
    .await;
    assert_eq!(rc, 2, "a PENDING job has not finished: {err}");
    let (rc, out, err) = jobq(&url, &["purge", "--queue", "q", "--older-than", "1h"]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(json(&out)["deleted"], 0, "the cancelled job is too new");
    let (rc, out, err) = jobq(&url, &["purge", "--queue", "q", "--status", "failed"]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(json(&out)["deleted"], 1);
    let (keyed, _) = c
        .enqueue("q", "k", "junk", EnqueueOptions::new().key("junk-1"))
        .await
        .expect("enqueue");
    let (rc, out, err) = jobq(&url, &["purge", "--queue", "q", "--status", "pending"]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(json(&out)["deleted"], 1, "the keyed PENDING job");
    let (again, created) = c
        .enqueue("q", "k", "junk", EnqueueOptions::new().key("junk-1"))
        .await
        .expect("enqueue");
    assert!(created, "the purged job's key is free");
    assert_ne!(again.id, keyed.id);
    assert_eq!(
        c.get_job(running.clone()).await.expect("kept").status,
        pb::JobStatus::Running as i32
    );
}

#[tokio::test]
async fn a_cancel_without_a_reason_says_cancelled_and_the_dashboard_lists_it_by_status_in_any_case()
{
    let data = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(data.path(), &[]);
    let c = server.client().await;
    let (job, _) = c
        .enqueue("q", "k", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let cancelled = c.cancel_job(job.id.clone(), "").await.expect("cancel");
    assert_eq!(cancelled.status, pb::JobStatus::Failed as i32);
    assert_eq!(cancelled.last_error, "cancelled", "no dangling colon");
    for status in ["FAILED", "failed", "Failed"] {
        let (code, head, page) = http(
            server.http,
            "GET",
            &format!("/jobs?status={status}"),
            &[],
            "",
        )
        .await;
        assert_eq!(code, 200, "status={status}: {page}");
        assert!(
            page.contains(&format!(r#"data-id="{}""#, job.id)),
            "status={status} lists the cancelled job"
        );
        assert!(
            page.contains(r#"action="/retry""#),
            "status={status} offers to retry the dead letters"
        );
        // No other site may frame the dashboard (clickjacking its buttons).
        let head = head.to_ascii_lowercase();
        assert!(head.contains("x-frame-options: deny"), "{head}");
        assert!(head.contains("frame-ancestors 'none'"), "{head}");
    }
    let (code, _) = http_get(server.http, "/jobs?status=nope").await;
    assert_eq!(code, 400, "an unknown status is still refused");
}

#[tokio::test]
async fn the_job_page_shows_a_big_payload_cut_short() {
    let data = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(data.path(), &[]);
    let c = server.client().await;
    // Nested JSON: pretty-printed whole, each element on its own deeply
    // indented line, 1 MiB of it made a page of over 100 MB.
    let depth = 100;
    let body = vec!["0"; 200_000].join(",");
    let payload = format!("{}{body}{}", "[".repeat(depth), "]".repeat(depth));
    let (job, _) = c
        .enqueue("q", "k", payload.clone(), EnqueueOptions::new())
        .await
        .expect("enqueue");
    let (code, page) = http_get(server.http, &format!("/jobs/{}", job.id)).await;
    assert_eq!(code, 200);
    assert!(page.len() < 200 * 1024, "a page of {} bytes", page.len());
    assert!(
        page.contains(&format!(
            "{} more bytes not shown",
            payload.len() - 64 * 1024
        )),
        "says what it left out"
    );
}

/// `--max-paused-queues` through the binary: one pause past it is
/// RESOURCE_EXHAUSTED and pauses nothing, a paused queue can be paused
/// again, and the count holds across a restart.
#[tokio::test]
async fn pauses_stop_at_max_paused_queues_across_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(data.path(), &["--max-paused-queues", "2"]);
    let c = server.client().await;
    c.pause_queue("a").await.expect("pause a");
    c.pause_queue("b").await.expect("pause b");
    assert_eq!(code(c.pause_queue("c").await), Code::ResourceExhausted);
    c.pause_queue("a")
        .await
        .expect("pausing a paused queue stays OK");
    let paused = |stats: Vec<pb::QueueStats>| -> Vec<String> {
        stats
            .into_iter()
            .filter(|s| s.paused)
            .map(|s| s.queue)
            .collect()
    };
    assert_eq!(paused(c.stats(None).await.expect("stats")), ["a", "b"]);

    let addr = server.addr.to_string();
    server.terminate();
    let server = ServerProcess::start_at(data.path(), &addr, &["--max-paused-queues", "2"]);
    let c = server.client().await;
    assert_eq!(
        code(c.pause_queue("c").await),
        Code::ResourceExhausted,
        "still two paused after the restart"
    );
    c.resume_queue("b").await.expect("resume b");
    c.pause_queue("c").await.expect("room again");
    assert_eq!(paused(c.stats(None).await.expect("stats")), ["a", "c"]);
}
