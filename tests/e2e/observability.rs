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
