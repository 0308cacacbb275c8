//! The size and count limits, against a real server: what a client
//! is told when it goes over one, and that no reply is ever too big to send.

use std::time::Duration;

use jobq::pb;
use jobq_client::{EnqueueOptions, FailOptions};
use prost::Message;
use tonic::Code;

use crate::harness::TestServer;

/// Regression: a request over `--max-message-bytes` was answered
/// OUT_OF_RANGE (tonic's code for "decoded message length too large").
#[tokio::test]
async fn a_request_over_the_message_limit_is_resource_exhausted() {
    let server = TestServer::with(|c| {
        c.max_message_bytes = 256 * 1024;
        c.max_payload = 128 * 1024;
    })
    .await;
    let c = server.client().await;
    let err = c
        .enqueue("q", "k", vec![7; 300 * 1024], EnqueueOptions::new())
        .await
        .expect_err("over the message limit");
    assert_eq!(err.code(), Some(Code::ResourceExhausted), "{err}");
    // A request under the limit still goes through on the same connection.
    c.enqueue("q", "k", vec![7; 1024], EnqueueOptions::new())
        .await
        .expect("under the limit");
}

/// Regression: an EnqueueBatch just under the request limit stored
/// its jobs, then failed (OUT_OF_RANGE) because the reply echoed every
/// payload; a retry stored them again.
#[tokio::test]
async fn an_enqueue_batch_near_the_request_limit_succeeds_with_a_small_reply() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let limit = 16 * 1024 * 1024;
    let jobs: Vec<pb::EnqueueRequest> = (0..1000)
        .map(|i| pb::EnqueueRequest {
            queue: "big".into(),
            kind: "k".into(),
            key: format!("order-{i}"),
            payload: vec![b'x'; 16_500],
            ..Default::default()
        })
        .collect();
    let request = pb::EnqueueBatchRequest { jobs };
    let size = request.encoded_len();
    assert!(
        size > limit * 9 / 10 && size < limit,
        "{size} bytes: near the limit"
    );
    let reply = c
        .inner()
        .enqueue_batch(request)
        .await
        .expect("the batch is stored and answered")
        .into_inner();
    assert_eq!(reply.results.len(), 1000);
    assert!(reply.results.iter().all(|r| r.error_code == 0 && r.created));
    let job = reply.results[0].job.as_ref().expect("job");
    assert!(job.payload.is_empty(), "the reply echoes no payload");
    assert_eq!(
        (job.key.as_str(), job.status),
        ("order-0", pb::JobStatus::Pending as i32)
    );
    assert!(
        reply.encoded_len() < 256 * 1024,
        "reply of {} bytes",
        reply.encoded_len()
    );
    // The payload is stored, and GetJob still returns it whole.
    let stored = c.get_job(job.id.clone()).await.expect("get");
    assert_eq!(stored.payload.len(), 16_500);
}

/// The same for the other writes: Ack, Fail and Retry replies name
/// the job without its payload.
#[tokio::test]
async fn ack_fail_and_retry_replies_carry_no_payload() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let payload = vec![b'p'; 64 * 1024];
    for _ in 0..2 {
        let (job, _) = c
            .enqueue(
                "q",
                "k",
                payload.clone(),
                EnqueueOptions::new().max_attempts(1),
            )
            .await
            .expect("enqueue");
        assert!(job.payload.is_empty());
    }
    let take = || async {
        c.dequeue(["q"], "w1", Some(Duration::from_secs(60)), None)
            .await
            .expect("dequeue")
            .expect("a due job")
    };
    let first = take().await;
    assert_eq!(
        first.job.as_ref().expect("job").payload,
        payload,
        "delivery carries the payload"
    );
    let acked = c
        .ack(first.job.expect("job").id, first.lease_id)
        .await
        .expect("ack");
    assert!(acked.payload.is_empty());
    assert_eq!(acked.status, pb::JobStatus::Done as i32);
    let second = take().await;
    let id = second.job.expect("job").id;
    let failed = c
        .fail(id.clone(), second.lease_id, "boom", FailOptions::fatal())
        .await
        .expect("fail");
    assert!(failed.payload.is_empty());
    assert_eq!(failed.status, pb::JobStatus::Failed as i32);
    assert_eq!(failed.history.len(), 1, "the latest attempt");
    let retried = c.retry(id).await.expect("retry");
    assert!(retried.payload.is_empty());
    assert_eq!(retried.status, pb::JobStatus::Pending as i32);
}

async fn enqueue_big(c: &jobq_client::Client, n: usize, size: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let (job, _) = c
            .enqueue(
                "big",
                "k",
                vec![b'0' + i as u8; size],
                EnqueueOptions::new(),
            )
            .await
            .expect("enqueue");
        ids.push(job.id);
    }
    ids
}

async fn list_all(c: &jobq_client::Client, omit_payload: bool) -> Vec<pb::ListJobsResponse> {
    let mut pages = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .list_jobs(pb::ListJobsRequest {
                queue: "big".into(),
                page_size: 100,
                page_token,
                omit_payload,
                ..Default::default()
            })
            .await
            .expect("list");
        page_token = page.next_page_token.clone();
        pages.push(page);
        if page_token.is_empty() {
            return pages;
        }
        assert!(pages.len() < 100, "paging makes progress");
    }
}

/// Regression: 8 jobs of 900 KiB broke `jobq list` (OUT_OF_RANGE:
/// decoded message length too large), and the server built the whole page
/// in memory first.
#[tokio::test]
async fn big_jobs_are_listed_in_pages_bounded_by_bytes() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let ids = enqueue_big(&c, 8, 900 * 1024).await;
    // Bounded by --max-page-bytes (2 MiB): two such jobs a page, every one
    // with its payload, and paging goes on to the end.
    let pages = list_all(&c, false).await;
    let listed: Vec<&pb::Job> = pages.iter().flat_map(|p| &p.jobs).collect();
    assert_eq!(listed.iter().map(|j| j.id.clone()).collect::<Vec<_>>(), ids);
    assert!(listed.iter().all(|j| j.payload.len() == 900 * 1024));
    for page in &pages {
        assert!(!page.jobs.is_empty());
        assert!(
            page.encoded_len() <= 2 * 1024 * 1024 + 64 * 1024,
            "page of {} bytes",
            page.encoded_len()
        );
    }
    // Without payloads, one page holds them all.
    let pages = list_all(&c, true).await;
    assert_eq!(pages.len(), 1);
    assert_eq!(pages[0].jobs.len(), 8);
    assert!(pages[0].jobs.iter().all(|j| j.payload.is_empty()));
    // The CLI's table asks for no payloads; --json gets them, page by page,
    // through the client's raised decode limit.
    for json in [false, true] {
        let mut cmd = tokio::process::Command::new(crate::harness::JOBQ);
        cmd.arg("--server").arg(server.url());
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .args(["list", "--queue", "big", "--limit", "0"])
            .env_remove("JOBQ_SERVER")
            .output()
            .await
            .expect("run jobq list");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if json {
            let all: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
            let listed: Vec<&str> = all
                .as_array()
                .expect("an array")
                .iter()
                .map(|j| j["id"].as_str().expect("id"))
                .collect();
            assert_eq!(listed, ids);
        } else {
            assert_eq!(stdout.lines().count(), 9, "a header and 8 rows:\n{stdout}");
        }
    }
}

/// A job bigger than the byte bound still makes a page of its own, so
/// paging never stalls.
#[tokio::test]
async fn a_job_over_the_page_byte_bound_makes_a_page_of_its_own() {
    let server = TestServer::with(|c| c.max_page_bytes = 1000).await;
    let c = server.client().await;
    let ids = enqueue_big(&c, 3, 10 * 1024).await;
    let pages = list_all(&c, false).await;
    assert_eq!(pages.len(), 3);
    assert!(pages.iter().all(|p| p.jobs.len() == 1));
    let listed: Vec<String> = pages
        .iter()
        .flat_map(|p| &p.jobs)
        .map(|j| j.id.clone())
        .collect();
    assert_eq!(listed, ids);
}

/// Regression: the server refused any heartbeat naming more leases
/// than `--max-capacity`, while the client sent 500 a call; with a max
/// below 500 every lease expired. The per-call limit is now one constant,
/// shared by client and server, and independent of capacity.
#[tokio::test]
async fn heartbeats_are_bounded_per_call_not_by_max_capacity() {
    let server = TestServer::with(|c| c.max_capacity = 10).await;
    let c = server.client().await;
    let (job, _) = c
        .enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect("enqueue");
    let leased = c
        .dequeue(["q"], "w1", Some(Duration::from_secs(60)), None)
        .await
        .expect("dequeue")
        .expect("a job");
    let held = pb::LeaseRef {
        job_id: job.id.clone(),
        lease_id: leased.lease_id.clone(),
        progress: None,
    };
    let stranger = |i: usize| pb::LeaseRef {
        job_id: (1_000_000 + i).to_string(),
        lease_id: "1".into(),
        progress: None,
    };
    let mut refs: Vec<pb::LeaseRef> = (0..599).map(stranger).collect();
    refs.push(held.clone());
    let lost = c
        .heartbeat("w1", refs, None)
        .await
        .expect("600 leases in one call, over --max-capacity 10");
    assert_eq!(lost.len(), 599, "only the held lease is still held");
    assert!(!lost.contains(&held));
    let over: Vec<pb::LeaseRef> = (0..=jobq::MAX_HEARTBEAT_LEASES).map(stranger).collect();
    // The server's limit, on one raw call.
    let err = c
        .inner()
        .heartbeat(pb::HeartbeatRequest {
            worker_id: "w1".into(),
            leases: over.clone(),
            ..Default::default()
        })
        .await
        .expect_err("over the per-call limit");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains(&jobq::MAX_HEARTBEAT_LEASES.to_string()),
        "{err:?}"
    );
    // The typed client sends as many calls as the limit needs.
    let lost = c
        .heartbeat("w1", over, None)
        .await
        .expect("one call per MAX_HEARTBEAT_LEASES leases");
    assert_eq!(lost.len(), jobq::MAX_HEARTBEAT_LEASES + 1);
}

/// Limits that contradict each other, or that would put a job's times
/// beyond what a store can hold (PostgreSQL's driver overflows, sled's
/// index saturates), are refused at start, naming the flags, before the
/// data folder is touched.
#[test]
fn serve_refuses_contradicting_or_unreachable_limits() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (flags, says) in [
        (
            &["--max-delay", "1000years"][..],
            "--max-delay 1000years is over the longest jobq accepts",
        ),
        (
            &["--backoff-cap", "200years"][..],
            "--backoff-cap 200years is over",
        ),
        (
            &["--pg-statement-timeout", "30days"][..],
            "--pg-statement-timeout 30days is over the longest PostgreSQL takes",
        ),
        (
            &["--default-lease", "1h", "--max-lease", "30m"][..],
            "--default-lease 1h is longer than --max-lease 30m",
        ),
        (
            &["--min-lease", "0s"][..],
            "--min-lease must be longer than 0s",
        ),
        (
            &["--default-max-attempts", "5", "--max-attempts-limit", "3"][..],
            "--default-max-attempts 5 must be between 1 and --max-attempts-limit 3",
        ),
        (
            &["--max-attempts-limit", "4000000000"][..],
            "--max-attempts-limit 4000000000 is over the most jobq stores",
        ),
        (
            &["--max-payload", "16777216"][..],
            "--max-message-bytes 16777216 cannot carry a job with --max-payload 16777216",
        ),
        (
            &["--max-page-bytes", "33554432"][..],
            "is over --max-message-bytes 16777216",
        ),
        (
            &["--backoff-base", "1h", "--backoff-cap", "1m"][..],
            "--backoff-base 1h is longer than --backoff-cap 1m",
        ),
    ] {
        let out = crate::harness::serve_refused(&data, flags);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} started");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(!data.exists(), "{flags:?} created the data folder");
    }
}
