//! Metrics against a real `jobq serve`: after a scripted sequence every
//! counter and gauge has the expected value, the gauges agree with Stats,
//! and the scrape passes `promtool check metrics`.

use std::{collections::HashMap, time::Duration};

use jobq::pb;
use jobq_client::{EnqueueOptions, FailOptions};

use crate::{
    harness::{http_get, until, ServerProcess},
    worker::EmailWorker,
};

/// The samples of a scrape, by name with labels (`name{a="b",…}`).
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn get(s: &HashMap<String, f64>, key: &str) -> f64 {
    *s.get(key)
        .unwrap_or_else(|| panic!("no sample {key} in the scrape"))
}

#[tokio::test]
async fn metrics_count_a_scripted_day_and_agree_with_stats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(&dir.path().join("data"), &[]);
    let c = server.client().await;
    // Enqueue 5, ack 3, one fatal fail.
    for i in 0..5 {
        c.enqueue("m", "k", format!("{i}"), EnqueueOptions::new())
            .await
            .expect("enqueue");
    }
    for _ in 0..3 {
        let l = c
            .dequeue(["m"], "w1", None, None)
            .await
            .expect("dequeue")
            .expect("due");
        c.ack(l.job.expect("job").id, l.lease_id)
            .await
            .expect("ack");
    }
    let l = c
        .dequeue(["m"], "w1", None, None)
        .await
        .expect("dequeue")
        .expect("due");
    c.fail(
        l.job.expect("job").id,
        l.lease_id,
        "bad payload",
        FailOptions::fatal(),
    )
    .await
    .expect("fail");
    // One worker SIGKILLed while it holds a job.
    let mailbox = dir.path().join("mailbox");
    let (email, _) = c
        .enqueue_json(
            "emails",
            "send-email",
            &serde_json::json!({ "order": "order-4711" }),
            EnqueueOptions::new(),
        )
        .await
        .expect("enqueue");
    let mut w = EmailWorker::start(&server.url(), &mailbox, &["--hang-after-send"]);
    w.expect_line("SENT order-4711").await;
    w.child.kill().expect("SIGKILL");
    let _ = w.child.wait();
    until(Duration::from_secs(10), "the email job reclaimed", || {
        let (c, id) = (c.clone(), email.id.clone());
        async move {
            let job = c.get_job(id).await.ok()?;
            (job.status == pb::JobStatus::Pending as i32).then_some(())
        }
    })
    .await;

    let (status, text) = http_get(server.http, "/metrics").await;
    assert_eq!(status, 200);
    let s = samples(&text);
    assert_eq!(get(&s, r#"jobq_enqueued_total{queue="m"}"#), 5.0);
    assert_eq!(get(&s, r#"jobq_acked_total{queue="m"}"#), 3.0);
    assert_eq!(get(&s, r#"jobq_failed_attempts_total{queue="m"}"#), 1.0);
    assert_eq!(get(&s, r#"jobq_dead_lettered_total{queue="m"}"#), 1.0);
    assert_eq!(get(&s, r#"jobq_enqueued_total{queue="emails"}"#), 1.0);
    assert_eq!(
        get(
            &s,
            r#"jobq_reclaimed_total{queue="emails",reason="worker_disconnected"}"#
        ),
        1.0
    );
    assert_eq!(get(&s, r#"jobq_job_wait_seconds_count{queue="m"}"#), 4.0);
    assert_eq!(get(&s, r#"jobq_job_run_seconds_count{queue="m"}"#), 3.0);
    assert_eq!(get(&s, "jobq_lease_streams"), 0.0);
    assert!(
        get(
            &s,
            r#"jobq_rpc_duration_seconds_count{method="Enqueue",code="OK"}"#
        ) >= 6.0
    );
    assert_eq!(
        get(
            &s,
            r#"jobq_rpc_duration_seconds_count{method="Ack",code="OK"}"#
        ),
        3.0
    );
    assert!(get(&s, "jobq_commit_duration_seconds_count") >= 1.0);
    assert!(get(&s, "jobq_commit_batch_size_count") >= 1.0);
    // The gauges are Stats.
    let stats = c.stats(None).await.expect("stats");
    for q in &stats {
        for (status, n) in [
            ("pending", q.pending),
            ("running", q.running),
            ("done", q.done),
            ("failed", q.failed),
        ] {
            let key = format!(r#"jobq_jobs{{queue="{}",status="{status}"}}"#, q.queue);
            #[allow(clippy::cast_precision_loss)]
            let want = n as f64;
            assert_eq!(get(&s, &key), want, "{key}");
        }
    }
    let m = stats.iter().find(|q| q.queue == "m").expect("queue m");
    assert_eq!((m.pending, m.running, m.done, m.failed), (1, 0, 3, 1));
    // No job ids in labels: only queue, status, reason, method, code, le.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.contains(&email.id) || !line.contains("id="), "{line}");
    }
    // Only a PostgreSQL server has a notification queue.
    assert!(!text.contains("jobq_pg_notification_queue_usage"), "{text}");
    promtool_check(&text);
}

/// `promtool check metrics` (Debian's `prometheus` package) on a scrape.
fn promtool_check(text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "promtool is needed for this test and could not be run ({e}); \
                 install it with `apt-get install prometheus` (.ci/run does)"
            )
        });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write the scrape");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--log-format json`: one JSON object per line, with the job's id, queue
/// and kind as fields of a reclaim, not inside the message.
#[tokio::test]
async fn json_logs_carry_job_fields() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = std::process::Command::new(crate::harness::JOBQ)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "off",
            "--log-format",
            "json",
        ])
        .arg("--data")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .env_remove("JOBQ_LISTEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn jobq serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<serde_json::Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
            if tx.send(value).is_err() {
                break;
            }
        }
    });
    let serving = next_log(&mut rx, "jobq serving").await;
    assert_eq!(serving["level"], "INFO");
    let addr: std::net::SocketAddr = serving["addr"]
        .as_str()
        .expect("addr is a field")
        .parse()
        .expect("a socket address");
    let c = jobq_client::Client::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let (job, _) = c
        .enqueue("mail", "send-email", "{}", EnqueueOptions::new())
        .await
        .expect("enqueue");
    {
        let mut stream = c
            .lease(["mail"], "w1", 1, Some(Duration::from_secs(60)))
            .await
            .expect("lease");
        stream.message().await.expect("ok").expect("a leased job");
    }
    let reclaimed = next_log(&mut rx, "reclaimed: worker disconnected").await;
    assert_eq!(reclaimed["job.id"], job.id.as_str());
    assert_eq!(reclaimed["queue"], "mail");
    assert_eq!(reclaimed["kind"], "send-email");
    assert_eq!(reclaimed["attempts"], 1);
    crate::harness::signal(&child, libc::SIGTERM);
    assert!(child.wait().expect("wait").success());
}

/// The next JSON log line with this message (within 20 s).
async fn next_log(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
    message: &str,
) -> serde_json::Value {
    let wanted = async {
        loop {
            let line = rx.recv().await.expect("the server's log ended");
            if line["message"] == message {
                return line;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wanted)
        .await
        .unwrap_or_else(|_| panic!("no log line {message:?} within 20 s"))
}

/// The Rust Worker's own metrics (the `metrics` feature): runs by outcome
/// and handler durations, by kind.
#[tokio::test]
async fn the_worker_counts_its_runs_by_outcome() {
    use jobq_client::{HandlerError, JobContext, Worker};
    let server = crate::harness::TestServer::start().await;
    let c = server.client().await;
    for payload in ["ok", "ok", "bad", "later"] {
        c.enqueue("wm", "m", payload, EnqueueOptions::new())
            .await
            .expect("enqueue");
    }
    let mut registry = prometheus_client::registry::Registry::default();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = Worker::builder(server.url())
        .queues(["wm"])
        .capacity(3)
        .lease(Duration::from_secs(30))
        .shutdown(shutdown.clone())
        .metrics(&mut registry)
        .handler("m", |ctx: JobContext| async move {
            if ctx.payload() == b"bad" {
                return Err(HandlerError::fatal("bad input"));
            }
            if ctx.payload() == b"later" {
                return Err(HandlerError::snooze("busy", Duration::from_secs(3600)));
            }
            Ok(())
        })
        .build();
    let run = tokio::spawn(worker.run());
    until(
        Duration::from_secs(20),
        "2 DONE, 1 FAILED, 1 snoozed",
        || {
            let c = c.clone();
            async move {
                let s = c.stats(Some("wm")).await.ok()?;
                (s.first().map(|q| (q.done, q.failed, q.pending, q.running)) == Some((2, 1, 1, 0)))
                    .then_some(())
            }
        },
    )
    .await;
    shutdown.cancel();
    run.await.expect("join").expect("worker");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let s = samples(&text);
    assert_eq!(
        get(&s, r#"jobq_worker_jobs_total{kind="m",outcome="acked"}"#),
        2.0
    );
    assert_eq!(
        get(&s, r#"jobq_worker_jobs_total{kind="m",outcome="fatal"}"#),
        1.0
    );
    assert_eq!(
        get(&s, r#"jobq_worker_jobs_total{kind="m",outcome="snoozed"}"#),
        1.0
    );
    assert_eq!(
        get(
            &s,
            r#"jobq_worker_handler_duration_seconds_count{kind="m"}"#
        ),
        4.0
    );
    assert!(
        !text.contains("jobq_worker_leases_lost_total{"),
        "no lease was lost:\n{text}"
    );
}

/// A server on PostgreSQL exports how full the database's notification
/// queue is (`pg_notification_queue_usage()`, 0 to 1): the LISTEN sessions
/// of every server share it, and a session that stops reading fills it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_server_exports_the_notification_queue_usage() {
    let url = jobq_server::store::postgres::testing::fresh_database("jobq_metrics").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(&dir.path().join("data"), &["--store", &url]);
    let (status, text) = http_get(server.http, "/metrics").await;
    assert_eq!(status, 200);
    let usage = get(&samples(&text), "jobq_pg_notification_queue_usage");
    assert!((0.0..=1.0).contains(&usage), "usage {usage}");
    assert!(
        text.contains("# TYPE jobq_pg_notification_queue_usage gauge"),
        "{text}"
    );
    promtool_check(&text);
}
