//! The server over gRPC: durability across `kill -9`, the rules of
//! docs/src/design.md §1 through the wire, bad input, long polls, the reaper, and
//! graceful shutdown.

use std::time::{Duration, Instant};

use jobq::pb;
use jobq_client::{Client, EnqueueOptions, FailOptions};
use tonic::Code;

use crate::harness::{until, ServerProcess, TestServer};

fn secs(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

fn ms(ms: u64) -> Option<Duration> {
    Some(Duration::from_millis(ms))
}

async fn take(c: &Client, queue: &str, lease: Option<Duration>) -> Option<pb::LeasedJob> {
    c.dequeue([queue], "w1", lease, None)
        .await
        .expect("dequeue")
}

fn code(err: jobq_client::Error) -> Code {
    err.code().unwrap_or_else(|| panic!("not a status: {err}"))
}

#[tokio::test]
async fn an_acknowledged_enqueue_survives_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    const N: usize = 200;
    let mut ids = Vec::new();
    for i in 0..N {
        let (job, created) = c
            .enqueue(
                "emails",
                "send-email",
                format!("order-{i}"),
                EnqueueOptions::new(),
            )
            .await
            .expect("enqueue");
        assert!(created);
        ids.push(job.id);
    }
    // One job is taken and acked before the crash: it must stay DONE.
    let first = take(&c, "emails", None).await.expect("a job");
    c.ack(
        first.job.as_ref().expect("job").id.clone(),
        first.lease_id.clone(),
    )
    .await
    .expect("ack");
    // Right after the last reply: no graceful shutdown, no final flush.
    server.kill9();

    let server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    let done = c.get_job(ids[0].clone()).await.expect("job 0");
    assert_eq!(
        done.status,
        pb::JobStatus::Done as i32,
        "a DONE job is still DONE"
    );
    let mut seen = Vec::new();
    while let Some(leased) = take(&c, "emails", None).await {
        let job = leased.job.expect("job");
        seen.push(job.id.clone());
        assert_eq!(
            job.payload,
            format!("order-{}", seen.len()).into_bytes(),
            "in enqueue order"
        );
    }
    assert_eq!(
        seen,
        ids[1..].to_vec(),
        "every acknowledged job is back, in order"
    );
}

/// Big payloads live in files of their own, each written before its
/// record. A `kill -9` in the middle of a stream of such enqueues loses no
/// acknowledged payload, and files no record names (an enqueue cut short
/// between its file and its record; here also one planted) are gone after
/// the restart. (A `kill -9` keeps the kernel's page cache: this checks
/// the order of the writes, not the fsyncs.)
#[tokio::test]
async fn payload_files_survive_kill_9_mid_enqueue_and_leave_no_orphans() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(&data, &["--payload-file-bytes", "1024"]);
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut producers = Vec::new();
    for p in 0..8u32 {
        let (c, acked) = (server.client().await, acked.clone());
        producers.push(tokio::spawn(async move {
            for i in 0u32.. {
                let payload = format!("{p}-{i}-").repeat(400).into_bytes();
                match c
                    .enqueue("big", "k", payload.clone(), EnqueueOptions::new())
                    .await
                {
                    Ok((job, _)) => acked.lock().unwrap().push((job.id, payload)),
                    Err(_) => return,
                }
            }
        }));
    }
    until(Duration::from_secs(30), "200 acknowledged enqueues", || {
        let enough = acked.lock().unwrap().len() >= 200;
        async move { enough.then_some(()) }
    })
    .await;
    server.kill9();
    for producer in producers {
        producer.await.expect("producer");
    }

    std::fs::write(data.join("payloads").join("999999999"), b"orphan").expect("plant");
    let server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    let acked = acked.lock().unwrap().clone();
    for (id, payload) in &acked {
        let job = c.get_job(id.clone()).await.expect("an acknowledged job");
        assert!(job.payload == *payload, "job {id:?}: its whole payload");
    }
    let pending = c.stats(Some("big")).await.expect("stats")[0].pending;
    assert!(pending >= acked.len() as u64);
    let files = std::fs::read_dir(data.join("payloads"))
        .expect("payloads")
        .count();
    assert_eq!(files as u64, pending, "one file per job, no orphans");
}

#[tokio::test]
async fn sigterm_drains_flushes_and_exits_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    let (job, _) = c
        .enqueue("q", "k", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let status = server.terminate();
    assert!(status.success(), "exit status {status:?}");
    let server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    assert_eq!(
        c.get_job(job.id).await.expect("get").status,
        pb::JobStatus::Pending as i32
    );
}

/// A second SIGTERM while the graceful stop still waits (here for an
/// enqueue stuck on a stalled disk) ends the process at once, killed by
/// that signal; what was acknowledged is on disk, and the next start
/// serves.
#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(
        &data,
        &["--fault-sync-delay", "60s", "--shutdown-timeout", "120s"],
    );
    let c = server.client().await;
    let stuck = tokio::spawn({
        let c = c.clone();
        async move { c.enqueue("q", "k", "x", EnqueueOptions::new()).await }
    });
    until(Duration::from_secs(10), "the enqueue is applied", || {
        let c = c.clone();
        async move {
            let page = c.list_jobs(pb::ListJobsRequest::default()).await.ok()?;
            (!page.jobs.is_empty()).then_some(())
        }
    })
    .await;
    crate::harness::signal(&server.child, libc::SIGTERM);
    until(Duration::from_secs(10), "the first signal is seen", || {
        std::future::ready(
            server
                .logged("signal received; shutting down")
                .then_some(()),
        )
    })
    .await;
    crate::harness::signal(&server.child, libc::SIGTERM);
    let status = until(
        Duration::from_secs(20),
        "the server exits, not after the stall",
        || std::future::ready(server.child.try_wait().expect("try_wait")),
    )
    .await;
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGTERM),
        "killed by the second signal, as a shell should see it: {status:?}"
    );
    assert!(server.logged("second signal received; exiting without waiting"));
    assert!(
        stuck.await.expect("join").is_err(),
        "the enqueue got no reply"
    );
    let server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    c.stats(None).await.expect("the next start serves");
}

/// A SIGTERM saves the indexes (`index.saved`); the next start serves
/// from them (and removes the file): counts, keys and the priority order
/// are as before, and so after a later `kill -9`, whose start reads every
/// record instead.
#[tokio::test]
async fn a_clean_stop_saves_the_indexes_and_a_crash_after_it_reads_the_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let saved = data.join("index.saved");
    let mut server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    let (mut by_priority, mut ids) = (Vec::new(), Vec::new());
    for (i, priority) in [0, 5, -5, 5].into_iter().enumerate() {
        let (job, _) = c
            .enqueue(
                "q",
                "k",
                format!("{i}"),
                EnqueueOptions::new()
                    .key(format!("order-{i}"))
                    .priority(priority),
            )
            .await
            .expect("enqueue");
        by_priority.push((-priority, job.id.clone()));
        ids.push(job.id);
    }
    by_priority.sort();
    let acked = take(&c, "q", secs(60)).await.expect("a job");
    c.ack(acked.job.clone().expect("job").id, acked.lease_id)
        .await
        .expect("ack");
    assert!(server.terminate().success());
    assert!(saved.exists(), "a clean stop saves the indexes");
    // A start that refuses its configuration does so before it opens the
    // store, so the saved indexes are still there for the next one.
    let refused =
        crate::harness::serve_refused(&data, &["--auth-tokens", "/nonexistent/tokens.toml"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("tokens file"));
    assert!(saved.exists(), "a refused start leaves the saved indexes");

    for restart in ["after a clean stop", "after a crash"] {
        let mut server = ServerProcess::start(&data, &[]);
        let c = server.client().await;
        assert!(
            !saved.exists(),
            "{restart}: the saved indexes serve one start"
        );
        let stats = c.stats(Some("q")).await.expect("stats");
        assert_eq!((stats[0].pending, stats[0].done), (3, 1), "{restart}");
        let (again, created) = c
            .enqueue("q", "k", "dup", EnqueueOptions::new().key("order-2"))
            .await
            .expect("enqueue");
        assert!(!created, "{restart}: the key is still held");
        assert_eq!(again.id, ids[2], "{restart}");
        if restart == "after a clean stop" {
            server.kill9();
            continue;
        }
        let mut order = Vec::new();
        while let Some(l) = take(&c, "q", secs(60)).await {
            order.push(l.job.expect("job").id);
        }
        let expected: Vec<_> = by_priority[1..].iter().map(|(_, id)| id.clone()).collect();
        assert_eq!(order, expected, "{restart}: priority order");
    }
}

#[tokio::test]
async fn a_running_lease_survives_a_server_restart_and_still_acks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    c.enqueue("q", "k", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let leased = take(&c, "q", secs(60)).await.expect("job");
    // A take is made durable by the next flush round, not before the reply;
    // the worker's first heartbeat (a durable write) is past that round.
    let held = pb::LeaseRef {
        job_id: leased.job.clone().expect("job").id,
        lease_id: leased.lease_id.clone(),
        progress: None,
    };
    assert!(c
        .heartbeat("w1", vec![held], None)
        .await
        .expect("heartbeat")
        .is_empty());
    server.kill9();
    let server = ServerProcess::start(&data, &[]);
    let c = server.client().await;
    let job = c
        .ack(leased.job.expect("job").id, leased.lease_id)
        .await
        .expect("ack after restart");
    assert_eq!(job.status, pb::JobStatus::Done as i32);
}

#[tokio::test]
async fn the_status_machine_over_grpc() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (job, _) = c
        .enqueue(
            "emails",
            "send-email",
            "4711",
            EnqueueOptions::new().max_attempts(3),
        )
        .await
        .expect("enqueue");
    assert_eq!(job.status, pb::JobStatus::Pending as i32);

    // PENDING -> RUNNING; a second dequeue does not return it.
    let leased = take(&c, "emails", None).await.expect("job");
    let running = leased.job.clone().expect("job");
    assert_eq!(running.status, pb::JobStatus::Running as i32);
    assert!(running.taken_at.is_some());
    assert!(
        take(&c, "emails", None).await.is_none(),
        "held by one lease at a time"
    );

    // Fail: attempts + 1, due again now (retry_delay 0), next dequeue returns it.
    let failed = c
        .fail(
            job.id.clone(),
            leased.lease_id.clone(),
            "smtp down",
            FailOptions::retry_after(Duration::ZERO),
        )
        .await
        .expect("fail");
    assert_eq!(
        (failed.status, failed.attempts),
        (pb::JobStatus::Pending as i32, 1)
    );
    let again = take(&c, "emails", None).await.expect("due again");
    // The old lease is stale now: ABORTED for ack, fail and heartbeat.
    assert_eq!(
        code(
            c.ack(job.id.clone(), leased.lease_id.clone())
                .await
                .expect_err("stale")
        ),
        Code::Aborted
    );
    assert_eq!(
        code(
            c.fail(
                job.id.clone(),
                leased.lease_id.clone(),
                "x",
                FailOptions::retry()
            )
            .await
            .expect_err("stale")
        ),
        Code::Aborted
    );
    let lost = c
        .heartbeat(
            "w1",
            vec![pb::LeaseRef {
                job_id: job.id.clone(),
                lease_id: leased.lease_id.clone(),
                progress: None,
            }],
            None,
        )
        .await
        .expect("heartbeat");
    assert_eq!(lost.len(), 1, "the stale lease is reported lost");

    // RUNNING -> DONE; a second ack is FAILED_PRECONDITION.
    let done = c
        .ack(job.id.clone(), again.lease_id.clone())
        .await
        .expect("ack");
    assert_eq!(done.status, pb::JobStatus::Done as i32);
    assert_eq!(
        code(
            c.ack(job.id.clone(), again.lease_id.clone())
                .await
                .expect_err("twice")
        ),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(c.retry(job.id.clone()).await.expect_err("retry DONE")),
        Code::FailedPrecondition
    );
    // The ack's reply carries the latest attempt; GetJob the whole history.
    assert_eq!(done.history.len(), 1);
    assert_eq!(done.history[0].outcome, pb::AttemptOutcome::Acked as i32);
    let done = c.get_job(job.id.clone()).await.expect("get");
    assert_eq!(done.history.len(), 2);
    assert_eq!(done.history[0].outcome, pb::AttemptOutcome::Failed as i32);
    assert_eq!(done.history[1].outcome, pb::AttemptOutcome::Acked as i32);
    server.stop().await;
}

#[tokio::test]
async fn the_third_fail_is_a_dead_letter_until_retried() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (job, _) = c
        .enqueue("q", "k", "x", EnqueueOptions::new().max_attempts(3))
        .await
        .expect("enqueue");
    for attempt in 1..=3 {
        let leased = take(&c, "q", None)
            .await
            .unwrap_or_else(|| panic!("attempt {attempt}"));
        let after = c
            .fail(
                job.id.clone(),
                leased.lease_id,
                format!("boom {attempt}"),
                FailOptions::retry_after(Duration::ZERO),
            )
            .await
            .expect("fail");
        assert_eq!(after.attempts, attempt);
    }
    let dead = c.get_job(job.id.clone()).await.expect("get");
    assert_eq!(dead.status, pb::JobStatus::Failed as i32);
    assert_eq!(dead.last_error, "boom 3");
    assert!(
        take(&c, "q", None).await.is_none(),
        "a FAILED job is never delivered"
    );
    let retried = c.retry(job.id.clone()).await.expect("retry");
    assert_eq!(
        (retried.status, retried.attempts),
        (pb::JobStatus::Pending as i32, 0)
    );
    assert!(take(&c, "q", None).await.is_some());
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_on_time_with_one_more_attempt() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (job, _) = c
        .enqueue("q", "k", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let started = Instant::now();
    take(&c, "q", ms(200)).await.expect("job");
    let back = until(
        Duration::from_secs(5),
        "the reaper to reclaim the lease",
        || {
            let (c, id) = (c.clone(), job.id.clone());
            async move {
                let j = c.get_job(id).await.expect("get");
                (j.status == pb::JobStatus::Pending as i32).then_some(j)
            }
        },
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "not before the lease ends"
    );
    assert_eq!(back.attempts, 1);
    assert_eq!(back.last_error, "lease expired");
    assert_eq!(
        back.history[0].outcome,
        pb::AttemptOutcome::LeaseExpired as i32
    );
    assert!(take(&c, "q", None).await.is_some(), "delivered again");
}

#[tokio::test]
async fn heartbeats_keep_a_lease_alive() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (job, _) = c
        .enqueue("q", "k", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    // 1 s leases heartbeated every 50 ms: room for a loaded CI machine (a
    // 300 ms lease expired there between two heartbeats).
    let leased = take(&c, "q", ms(1000)).await.expect("job");
    let lease = pb::LeaseRef {
        job_id: job.id.clone(),
        lease_id: leased.lease_id.clone(),
        progress: None,
    };
    let until_t = Instant::now() + Duration::from_millis(3000);
    while Instant::now() < until_t {
        let lost = c
            .heartbeat("w1", vec![lease.clone()], None)
            .await
            .expect("heartbeat");
        assert!(lost.is_empty(), "lease lost while heartbeating");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        c.get_job(job.id.clone()).await.expect("get").status,
        pb::JobStatus::Running as i32
    );
    c.ack(job.id, leased.lease_id)
        .await
        .expect("ack after 3x the lease");
}

#[tokio::test]
async fn a_long_poll_wakes_when_a_job_arrives() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.dequeue(["q"], "w1", None, secs(10)).await })
    };
    // Enqueue only once the waiter is parked on the server.
    tokio::task::yield_now().await;
    let started = Instant::now();
    c.enqueue("q", "k", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let got = waiter
        .await
        .expect("join")
        .expect("dequeue")
        .expect("a job");
    assert_eq!(got.job.expect("job").queue, "q");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the enqueue, not the timeout"
    );
    // An empty queue with a short wait is a normal empty reply.
    assert!(c
        .dequeue(["q"], "w1", None, ms(50))
        .await
        .expect("dequeue")
        .is_none());
}

#[tokio::test]
async fn delayed_jobs_wait_and_due_jobs_go_by_run_at_then_enqueue_order() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (late, _) = c
        .enqueue(
            "q",
            "k",
            "late",
            // Long enough that a loaded CI box takes a and b first.
            EnqueueOptions::new().delay(Duration::from_secs(3)),
        )
        .await
        .expect("enqueue");
    let (a, _) = c
        .enqueue("q", "k", "a", EnqueueOptions::new())
        .await
        .expect("enqueue");
    let (b, _) = c
        .enqueue("q", "k", "b", EnqueueOptions::new())
        .await
        .expect("enqueue");
    assert_eq!(
        take(&c, "q", None).await.expect("a").job.expect("job").id,
        a.id
    );
    assert_eq!(
        take(&c, "q", None).await.expect("b").job.expect("job").id,
        b.id
    );
    assert!(
        take(&c, "q", None).await.is_none(),
        "the delayed job is not due yet"
    );
    let got = c
        .dequeue(["q"], "w1", None, secs(15))
        .await
        .expect("dequeue")
        .expect("woken when due");
    assert_eq!(got.job.expect("job").id, late.id);
}

#[tokio::test]
async fn a_key_names_one_job_per_queue() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (first, created) = c
        .enqueue(
            "emails",
            "send-email",
            "a",
            EnqueueOptions::new().key("order-4711"),
        )
        .await
        .expect("enqueue");
    assert!(created);
    let (again, created) = c
        .enqueue(
            "emails",
            "send-email",
            "b",
            EnqueueOptions::new().key("order-4711"),
        )
        .await
        .expect("enqueue");
    assert!(!created, "a producer retry returns the existing job");
    assert_eq!(again.id, first.id);
    let (other, created) = c
        .enqueue(
            "sms",
            "send-sms",
            "c",
            EnqueueOptions::new().key("order-4711"),
        )
        .await
        .expect("enqueue");
    assert!(created && other.id != first.id, "keys are per queue");
    // "Where is order 4711's email?"
    let page = c
        .list_jobs(pb::ListJobsRequest {
            queue: "emails".into(),
            key: "order-4711".into(),
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(page.jobs.len(), 1);
    assert_eq!(page.jobs[0].id, first.id);
}

#[tokio::test]
async fn list_pages_and_stats_count() {
    let server = TestServer::start().await;
    let c = server.client().await;
    for i in 0..25 {
        c.enqueue("q", "k", format!("{i}"), EnqueueOptions::new())
            .await
            .expect("enqueue");
    }
    let leased = take(&c, "q", None).await.expect("job");
    c.ack(leased.job.expect("job").id, leased.lease_id)
        .await
        .expect("ack");
    take(&c, "q", None).await.expect("job");
    let mut token = String::new();
    let mut all = Vec::new();
    loop {
        let page = c
            .list_jobs(pb::ListJobsRequest {
                queue: "q".into(),
                page_size: 10,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list");
        all.extend(page.jobs);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(all.len(), 25);
    assert!(all
        .windows(2)
        .all(|w| w[0].id.parse::<u64>().ok() < w[1].id.parse::<u64>().ok()));
    let stats = c.stats(Some("q")).await.expect("stats");
    assert_eq!(stats.len(), 1);
    let s = &stats[0];
    assert_eq!((s.pending, s.running, s.done, s.failed), (23, 1, 1, 0));
    assert!(s.oldest_pending_age.is_some());
}

#[tokio::test]
async fn bad_input_gets_a_clear_code_and_changes_nothing() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (job, _) = c
        .enqueue("q", "k", "x", EnqueueOptions::new().key("order-1"))
        .await
        .expect("enqueue");
    let before = c
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .expect("list")
        .jobs;
    let mut raw = c.inner();
    let enq = |f: fn(&mut pb::EnqueueRequest)| {
        let mut r = pb::EnqueueRequest {
            queue: "q".into(),
            kind: "k".into(),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    let cases: Vec<(&str, Result<(), tonic::Status>)> = vec![
        (
            "empty queue",
            raw.enqueue(enq(|r| r.queue.clear())).await.map(drop),
        ),
        (
            "long queue",
            raw.enqueue(enq(|r| r.queue = "q".repeat(129)))
                .await
                .map(drop),
        ),
        (
            "bad chars",
            raw.enqueue(enq(|r| r.kind = "send email".into()))
                .await
                .map(drop),
        ),
        (
            "bad key",
            raw.enqueue(enq(|r| r.key = "order/1".into()))
                .await
                .map(drop),
        ),
        (
            "big payload",
            raw.enqueue(enq(|r| r.payload = vec![0; 1024 * 1024 + 1]))
                .await
                .map(drop),
        ),
        (
            "max_attempts",
            raw.enqueue(enq(|r| r.max_attempts = 1001)).await.map(drop),
        ),
        (
            "negative delay",
            raw.enqueue(enq(|r| {
                r.delay = Some(prost_types::Duration {
                    seconds: -5,
                    nanos: 0,
                })
            }))
            .await
            .map(drop),
        ),
        (
            "no queues",
            raw.dequeue(pb::DequeueRequest {
                worker_id: "w".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        ),
        (
            "lease too long",
            raw.dequeue(pb::DequeueRequest {
                queues: vec!["q".into()],
                worker_id: "w".into(),
                lease_duration: Some(prost_types::Duration {
                    seconds: 13 * 3600,
                    nanos: 0,
                }),
                wait: None,
            })
            .await
            .map(drop),
        ),
        (
            "malformed id",
            raw.get_job(pb::GetJobRequest { id: "abc".into() })
                .await
                .map(drop),
        ),
        (
            "malformed lease",
            raw.ack(pb::AckRequest {
                result: Vec::new(),
                job_id: job.id.clone(),
                lease_id: "x".into(),
            })
            .await
            .map(drop),
        ),
        (
            "bad status",
            raw.list_jobs(pb::ListJobsRequest {
                status: 42,
                ..Default::default()
            })
            .await
            .map(drop),
        ),
        (
            "bad token",
            raw.list_jobs(pb::ListJobsRequest {
                page_token: "zz".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        ),
        (
            "capacity",
            raw.lease(pb::LeaseRequest {
                queues: vec!["q".into()],
                worker_id: "w".into(),
                capacity: 100_000,
                lease_duration: None,
                held: vec![],
            })
            .await
            .map(drop),
        ),
    ];
    for (what, result) in cases {
        let status = result.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(!status.message().is_empty(), "{what}: say why");
    }
    let missing = raw
        .get_job(pb::GetJobRequest {
            id: "999999".into(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(missing.code(), Code::NotFound);
    let not_running = raw
        .ack(pb::AckRequest {
            result: Vec::new(),
            job_id: job.id.clone(),
            lease_id: "1".into(),
        })
        .await
        .expect_err("pending");
    assert_eq!(
        not_running.code(),
        Code::Aborted,
        "a lease the job does not hold is stale"
    );
    let retry_pending = raw
        .retry(pb::RetryRequest {
            job_id: job.id.clone(),
        })
        .await
        .expect_err("pending");
    assert_eq!(retry_pending.code(), Code::FailedPrecondition);

    let after = c
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .expect("list")
        .jobs;
    assert_eq!(before, after, "bad input changed nothing");
}
