//! The `jobq` client commands against an in-process server: output, paging,
//! exit codes, and `jobq work` running shell commands as jobs.
//!
//! The binary runs through `tokio::process`, so the test's runtime keeps
//! serving the in-process server while the CLI waits on it.

use std::{process::Stdio, time::Duration};

use jobq::pb;
use jobq_client::{EnqueueOptions, FailOptions};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::harness::{dead_letter, free_port, until, TestServer, JOBQ};

const LIMIT: Duration = Duration::from_secs(45);

/// What one `jobq` run printed and how it exited.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> Self {
        assert_eq!(
            self.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// Spawns with no stdin and its output dropped (a `jobq work` whose jobs
/// the test watches through the server).
trait SpawnQuiet {
    fn spawn_quiet(&mut self) -> tokio::process::Child;
}

impl SpawnQuiet for tokio::process::Command {
    fn spawn_quiet(&mut self) -> tokio::process::Child {
        self.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn jobq")
    }
}

fn command(url: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(JOBQ);
    cmd.arg("--server")
        .arg(url)
        .args(args)
        .env_remove("JOBQ_SERVER")
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    cmd
}

/// Runs `jobq --server URL ARGS...` with `stdin` (closed when `None`).
async fn jobq_in(url: &str, args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut child = command(url, args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn jobq");
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes).await.expect("write stdin");
    }
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .expect("jobq finished in time")
        .expect("jobq output");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn jobq(url: &str, args: &[&str]) -> Run {
    jobq_in(url, args, None).await
}

fn signal(child: &tokio::process::Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id().expect("running")).expect("pid");
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Whether `pid` runs. A zombie counts as dead: once `jobq work` exits, its
/// killed child may wait for a reaper that a container's init never runs.
fn alive(pid: libc::pid_t) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z')),
        Err(_) if std::path::Path::new("/proc/self/stat").exists() => false,
        // SAFETY: signal 0 only checks that the process exists.
        Err(_) => unsafe { libc::kill(pid, 0) == 0 },
    }
}

/// Leases the next job of `queue` and fails it for good (a dead letter).
#[tokio::test]
async fn enqueue_takes_the_payload_from_flag_file_or_stdin() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);

    let id = jobq(&url, &["enqueue", "q", "k", "--payload", "from-flag"])
        .await
        .ok()
        .stdout;
    let job = client.get_job(id.trim()).await.unwrap();
    assert_eq!(job.payload, b"from-flag");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, b"from-file").unwrap();
    let id = jobq(
        &url,
        &[
            "enqueue",
            "q",
            "k",
            "--payload-file",
            file.to_str().unwrap(),
        ],
    )
    .await
    .ok()
    .stdout;
    assert_eq!(
        client.get_job(id.trim()).await.unwrap().payload,
        b"from-file"
    );

    let id = jobq_in(&url, &["enqueue", "q", "k"], Some(b"from-stdin\n"))
        .await
        .ok()
        .stdout;
    assert_eq!(
        client.get_job(id.trim()).await.unwrap().payload,
        b"from-stdin\n"
    );

    let id = jobq(&url, &["enqueue", "q", "k"]).await.ok().stdout;
    assert!(client.get_job(id.trim()).await.unwrap().payload.is_empty());

    let run = jobq(
        &url,
        &[
            "enqueue",
            "q",
            "k",
            "--max-attempts",
            "7",
            "--delay",
            "5m",
            "--json",
        ],
    )
    .await
    .ok();
    let v = run.json();
    assert_eq!(v["created"], true);
    assert_eq!(v["job"]["max_attempts"], 7);
    assert_eq!(v["job"]["status"], "PENDING");
    let job = client
        .get_job(v["job"]["id"].as_str().unwrap())
        .await
        .unwrap();
    let wait = job.run_at.unwrap().seconds - job.enqueued_at.unwrap().seconds;
    assert!((299..=301).contains(&wait), "delay of {wait}s");
}

#[tokio::test]
async fn enqueue_priority_orders_delivery_and_is_range_checked() {
    let server = TestServer::start().await;
    let url = server.url();
    let client = server.client().await;
    let bulk = jobq(&url, &["enqueue", "q", "k", "--payload", "bulk"])
        .await
        .ok()
        .stdout;
    let low = jobq(&url, &["enqueue", "q", "k", "--priority", "-5"])
        .await
        .ok()
        .stdout;
    let urgent = jobq(&url, &["enqueue", "q", "k", "--priority", "100", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(urgent["job"]["priority"], 100);
    let got = jobq(&url, &["get", low.trim(), "--json"]).await.ok().json();
    assert_eq!(got["priority"], -5);
    let mut order = Vec::new();
    while let Some(leased) = client.dequeue(["q"], "w", None, None).await.unwrap() {
        order.push(leased.job.unwrap().id);
    }
    let want = [
        urgent["job"]["id"].as_str().unwrap(),
        bulk.trim(),
        low.trim(),
    ];
    assert_eq!(order, want);

    let bad = jobq(&url, &["enqueue", "q", "k", "--priority", "101"]).await;
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(
        bad.stderr.starts_with("error: INVALID_ARGUMENT: ") && bad.stderr.contains("priority"),
        "{}",
        bad.stderr
    );
}

#[tokio::test]
async fn schedule_add_list_rm() {
    let server = TestServer::start().await;
    let url = server.url();
    let add = [
        "schedule",
        "add",
        "nightly",
        "reports",
        "build-report",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Berlin",
        "--payload",
        "{}",
        "--json",
    ];
    let added = jobq(&url, &add).await.ok().json();
    assert_eq!(added["name"], "nightly");
    assert_eq!(added["timezone"], "Europe/Berlin");
    assert!(added["next_run_at"].is_string(), "{added}");
    let table = jobq(&url, &["schedule", "list"]).await.ok().stdout;
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.contains("nightly") && table.contains("0 3 * * *"),
        "{table}"
    );
    let bad = jobq(&url, &["schedule", "add", "x", "q", "k", "--cron", "nope"]).await;
    assert_eq!(bad.code, 1);
    assert!(
        bad.stderr.starts_with("error: INVALID_ARGUMENT: "),
        "{}",
        bad.stderr
    );
    jobq(&url, &["schedule", "rm", "nightly"]).await.ok();
    let listed = jobq(&url, &["schedule", "list", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(listed, serde_json::json!([]));
    let gone = jobq(&url, &["schedule", "rm", "nightly"]).await;
    assert_eq!(gone.code, 1);
    assert!(
        gone.stderr.starts_with("error: NOT_FOUND: "),
        "{}",
        gone.stderr
    );
}

#[tokio::test]
async fn enqueue_with_a_known_key_says_so() {
    let server = TestServer::start().await;
    let url = server.url();
    let first = jobq(
        &url,
        &["enqueue", "q", "k", "--key", "order-1", "--payload", "a"],
    )
    .await
    .ok();
    assert!(!first.stderr.contains("existing"), "{}", first.stderr);
    let again = jobq(
        &url,
        &["enqueue", "q", "k", "--key", "order-1", "--payload", "b"],
    )
    .await
    .ok();
    assert_eq!(again.stdout, first.stdout, "same job id");
    assert!(again.stderr.contains("existing job"), "{}", again.stderr);
    let json = jobq(&url, &["enqueue", "q", "k", "--key", "order-1", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(json["created"], false);
    // A write's reply echoes no payload; GetJob has the first one's.
    assert!(json["job"].get("payload").is_none(), "{json}");
    let id = json["job"]["id"].as_str().expect("id");
    let stored = jobq(&url, &["get", id, "--json"]).await.ok().json();
    assert_eq!(stored["payload"], "a");
}

#[tokio::test]
async fn get_prints_the_job_with_its_history() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    let (job, _) = client
        .enqueue("q", "k", "p", EnqueueOptions::new().key("order-9"))
        .await
        .unwrap();
    let leased = client
        .dequeue(["q"], "w1", None, None)
        .await
        .unwrap()
        .unwrap();
    client
        .fail(
            &job.id,
            &leased.lease_id,
            "smtp down",
            FailOptions::retry_after(Duration::ZERO),
        )
        .await
        .unwrap();
    let leased = client
        .dequeue(["q"], "w2", None, None)
        .await
        .unwrap()
        .unwrap();
    client.ack(&job.id, &leased.lease_id).await.unwrap();

    let text = jobq(&url, &["get", &job.id]).await.ok().stdout;
    for needle in [
        "order-9",
        "DONE",
        "smtp down",
        "w1",
        "w2",
        "ACKED",
        "FAILED",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let v = jobq(&url, &["get", &job.id, "--json"]).await.ok().json();
    assert_eq!(v["status"], "DONE");
    assert_eq!(v["key"], "order-9");
    assert_eq!(v["attempts"], 1);
    let outcomes: Vec<&str> = v["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["FAILED", "ACKED"]);
    assert_eq!(v["history"][0]["error"], "smtp down");
    assert!(
        v["finished_at"].as_str().unwrap().ends_with('Z'),
        "RFC 3339: {v}"
    );
}

#[tokio::test]
async fn batch_file_and_list_page_through_every_result() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    // More than one EnqueueBatch chunk (1000) and more than one list page.
    let lines: String = (0..1205)
        .map(|i| {
            format!(
                "{{\"queue\":\"many\",\"kind\":\"k\",\"payload\":\"{i}\",\"key\":\"key-{i}\"}}\n"
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(&file, lines).unwrap();
    let batch = jobq(&url, &["enqueue", "--batch-file", file.to_str().unwrap()])
        .await
        .ok();
    assert_eq!(
        batch.stdout.lines().count(),
        1 + 1205,
        "a header and one line per entry"
    );
    assert!(batch.stdout.lines().nth(1205).unwrap().ends_with("created"));
    client
        .enqueue("other", "k", "x", EnqueueOptions::new())
        .await
        .unwrap();
    dead_letter(&client, "many").await;

    let list = |args: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let mut all = vec!["list", "--json"];
            all.extend_from_slice(args);
            jobq(&url, &all).await.ok().json().as_array().unwrap().len()
        }
    };
    assert_eq!(list(&["--queue", "many", "--limit", "0"]).await, 1205);
    assert_eq!(list(&["--limit", "0"]).await, 1206);
    assert_eq!(list(&[]).await, 100, "default limit");
    assert_eq!(list(&["--queue", "many", "--limit", "1100"]).await, 1100);
    assert_eq!(
        list(&["--queue", "many", "--status", "PENDING", "--limit", "0"]).await,
        1204
    );
    assert_eq!(list(&["--queue", "many", "--status", "failed"]).await, 1);
    assert_eq!(list(&["--queue", "other", "--status", "Done"]).await, 0);

    let one = jobq(
        &url,
        &["list", "--queue", "many", "--key", "key-7", "--json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(one[0]["payload"], "7");

    let table = jobq(&url, &["list", "--queue", "other"]).await.ok().stdout;
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].starts_with("ID") && rows[1].contains("PENDING"),
        "{table}"
    );
    // Aligned: the STATUS column starts at the same offset in every row.
    let col = rows[0].find("STATUS").unwrap();
    assert_eq!(&rows[1][col..col + 7], "PENDING", "{table}");
}

/// Entries of 512 KiB, 20 MiB in all: more than the server's 16 MiB
/// --max-message-bytes in one call, so the batch goes in several.
#[tokio::test]
async fn a_batch_file_bigger_than_one_message_is_sent_in_calls_that_fit() {
    let server = TestServer::start().await;
    let payload = "x".repeat(512 * 1024);
    let lines: String = (0..40)
        .map(|i| format!("{{\"queue\":\"big\",\"kind\":\"k\",\"payload\":\"{payload}\",\"key\":\"b-{i}\"}}\n"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.jsonl");
    std::fs::write(&file, lines).unwrap();
    let run = jobq(
        &server.url(),
        &["enqueue", "--batch-file", file.to_str().unwrap(), "--json"],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let created = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["created"] == true)
        .count();
    assert_eq!(created, 40);
    let stats = server.client().await.stats(Some("big")).await.unwrap();
    assert_eq!(stats[0].pending, 40);
}

#[tokio::test]
async fn batch_entries_that_are_rejected_fail_the_command() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(
        &file,
        "{\"queue\":\"q\",\"kind\":\"k\"}\n{\"queue\":\"q\",\"kind\":\"bad kind\"}\n",
    )
    .unwrap();
    let run = jobq(
        &server.url(),
        &["enqueue", "--batch-file", file.to_str().unwrap(), "--json"],
    )
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    let results: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results[0]["created"], true);
    assert_eq!(results[1]["error"]["code"], "INVALID_ARGUMENT");
}

#[tokio::test]
async fn retry_by_id_and_all_dead_letters_of_a_queue() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    for _ in 0..3 {
        client
            .enqueue("dlq", "k", "p", EnqueueOptions::new())
            .await
            .unwrap();
    }
    let first = dead_letter(&client, "dlq").await;
    dead_letter(&client, "dlq").await;
    dead_letter(&client, "dlq").await;

    let run = jobq(&url, &["retry", &first.id]).await.ok();
    assert!(run.stdout.contains("PENDING"), "{}", run.stdout);
    assert_eq!(
        client.get_job(&first.id).await.unwrap().status,
        pb::JobStatus::Pending as i32
    );

    let run = jobq(&url, &["retry", "--queue", "dlq", "--all-failed"])
        .await
        .ok();
    assert!(run.stdout.contains("retried 2 of 2"), "{}", run.stdout);
    let failed = jobq(
        &url,
        &["list", "--queue", "dlq", "--status", "failed", "--json"],
    )
    .await
    .ok()
    .json();
    assert_eq!(failed.as_array().unwrap().len(), 0);

    let nothing = jobq(&url, &["retry", "--queue", "dlq", "--all-failed", "--json"])
        .await
        .ok();
    assert_eq!(nothing.json()["found"], 0);

    // Not FAILED any more: the server refuses, and the code reaches stderr.
    let again = jobq(&url, &["retry", &first.id]).await;
    assert_eq!(again.code, 1);
    assert!(
        again.stderr.contains("FAILED_PRECONDITION"),
        "{}",
        again.stderr
    );
}

#[tokio::test]
async fn stats_counts_per_queue_and_watch_stops_on_ctrl_c() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    for _ in 0..3 {
        client
            .enqueue("s1", "k", "p", EnqueueOptions::new())
            .await
            .unwrap();
    }
    client
        .enqueue("s2", "k", "p", EnqueueOptions::new())
        .await
        .unwrap();
    dead_letter(&client, "s1").await;

    let v = jobq(&url, &["stats", "--json"]).await.ok().json();
    let s1 = v
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "s1")
        .expect("s1");
    assert_eq!(
        (s1["pending"].as_u64(), s1["failed"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        (s1["running"].as_u64(), s1["done"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(s1["oldest_pending_age_secs"].as_f64().unwrap() >= 0.0);
    let only = jobq(&url, &["stats", "--queue", "s2", "--json"])
        .await
        .ok()
        .json();
    assert_eq!(only.as_array().unwrap().len(), 1);
    let table = jobq(&url, &["stats"]).await.ok().stdout;
    assert!(
        table.starts_with("QUEUE") && table.contains("s2"),
        "{table}"
    );

    let mut watch = command(&url, &["stats", "--watch", "50ms", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    for _ in 0..2 {
        let line = next_line(&mut lines).await.expect("a refresh");
        assert!(line.starts_with('['), "{line}");
    }
    interrupt(&mut watch).await;
}

/// The next line a child prints, within [`LIMIT`]; `None` once it ended.
async fn next_line<R>(lines: &mut tokio::io::Lines<BufReader<R>>) -> Option<String>
where
    R: tokio::io::AsyncRead + Unpin,
{
    tokio::time::timeout(LIMIT, lines.next_line())
        .await
        .expect("a line within the limit")
        .expect("read the child's output")
}

/// Ctrl-C for `child`, which must then exit 0.
async fn interrupt(child: &mut tokio::process::Child) {
    signal(child, libc::SIGINT);
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .expect("exits after SIGINT")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

/// `--watch` outlives a server that is not there yet (or restarting): it
/// says so on stderr and shows the stats once the server answers.
#[tokio::test]
async fn stats_watch_keeps_refreshing_until_the_server_answers() {
    let listen = format!("127.0.0.1:{}", free_port());
    let url = format!("http://{listen}");
    let mut watch = command(&url, &["stats", "--watch", "50ms", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut errors = BufReader::new(watch.stderr.take().unwrap()).lines();
    for _ in 0..2 {
        let line = next_line(&mut errors)
            .await
            .expect("an error line, the watch still running");
        assert!(line.starts_with("jobq stats: "), "{line}");
    }
    let dir = tempfile::tempdir().unwrap();
    let _server = crate::harness::ServerProcess::start_at(&dir.path().join("data"), &listen, &[]);
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let line = next_line(&mut lines)
        .await
        .expect("stats once the server is up");
    assert!(line.starts_with('['), "{line}");
    interrupt(&mut watch).await;
}

#[tokio::test]
async fn exit_codes_say_what_went_wrong() {
    let server = TestServer::start().await;
    let url = server.url();
    let missing = jobq(&url, &["get", "424242"]).await;
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.starts_with("error: NOT_FOUND: "),
        "{}",
        missing.stderr
    );
    assert!(missing.stdout.is_empty());

    for usage in [
        &["list", "--status", "bogus"][..],
        &["enqueue", "q"],
        &["retry", "--all-failed"],
        &["enqueue", "q", "k", "--delay", "soon"],
        &["work", "--queue", "q", "--kind", "k"],
        &["work", "--queue", "q", "--capacity", "0", "--", "true"],
        // A command that cannot start would fail every job of the queue.
        &["work", "--queue", "q", "--", "/nonexistent/jobq-handler"],
        &["work", "--queue", "q", "--", "no-such-jobq-handler"],
        &["frobnicate"],
    ] {
        let run = jobq(&url, usage).await;
        assert_eq!(run.code, 2, "{usage:?}: {}", run.stderr);
    }

    let down = jobq("http://127.0.0.1:1", &["stats"]).await;
    assert_eq!(down.code, 1);
    assert!(down.stderr.contains("UNAVAILABLE"), "{}", down.stderr);
}

/// A job's shell command: acks when its stdin is "ok"; otherwise prints 3000
/// bytes of noise and then its environment to stderr, and exits 3.
/// SIGTERM to a `jobq work` process: it drains and exits 0.
async fn drains_and_exits_0(worker: &mut tokio::process::Child) {
    signal(worker, libc::SIGTERM);
    let status = tokio::time::timeout(LIMIT, worker.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// Job `id` once it has `status`.
async fn job_in(client: &jobq_client::Client, id: &str, status: pb::JobStatus) -> pb::Job {
    until(
        LIMIT,
        &format!("job {id} to be {status:?}"),
        || async move {
            let job = client.get_job(id).await.unwrap();
            (job.status == status as i32).then_some(job)
        },
    )
    .await
}

/// The pid a command wrote to `pidfile`, once it has.
async fn pid_written(pidfile: &std::path::Path) -> libc::pid_t {
    until(LIMIT, "the command to start", || {
        let read = std::fs::read_to_string(pidfile).ok();
        async move { read.and_then(|s| s.trim().parse().ok()) }
    })
    .await
}

const SCRIPT: &str = r#"p=$(cat); [ "$p" = ok ] && exit 0; head -c 3000 /dev/zero | tr '\0' x >&2; echo >&2; echo "boom key=$JOBQ_JOB_KEY attempt=$JOBQ_JOB_ATTEMPT queue=$JOBQ_JOB_QUEUE kind=$JOBQ_JOB_KIND" >&2; exit 3"#;

#[tokio::test]
async fn work_runs_a_command_per_job() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    let (good, _) = client
        .enqueue("wq", "shell", "ok", EnqueueOptions::new())
        .await
        .unwrap();
    let (bad, _) = client
        .enqueue(
            "wq",
            "shell",
            "nope",
            EnqueueOptions::new().key("order-3").max_attempts(1),
        )
        .await
        .unwrap();

    let mut worker = command(
        &url,
        &[
            "work",
            "--queue",
            "wq",
            "--capacity",
            "2",
            "--",
            "sh",
            "-c",
            SCRIPT,
        ],
    )
    .spawn_quiet();

    let status_of = |id: String| {
        let client = client.clone();
        async move {
            let job = client.get_job(id).await.unwrap();
            (job.status != pb::JobStatus::Pending as i32
                && job.status != pb::JobStatus::Running as i32)
                .then_some(job)
        }
    };
    let done = until(LIMIT, "the ok job to finish", || status_of(good.id.clone())).await;
    assert_eq!(done.status, pb::JobStatus::Done as i32, "{done:?}");
    let failed = until(LIMIT, "the failing job to finish", || {
        status_of(bad.id.clone())
    })
    .await;
    assert_eq!(failed.status, pb::JobStatus::Failed as i32, "{failed:?}");
    assert!(
        failed.last_error.starts_with("exit status 3: "),
        "{}",
        failed.last_error
    );
    assert!(
        failed
            .last_error
            .contains("boom key=order-3 attempt=1 queue=wq kind=shell"),
        "{}",
        failed.last_error
    );
    assert!(
        failed.last_error.len() < 2100,
        "only the tail: {}",
        failed.last_error.len()
    );

    // SIGTERM: graceful drain with nothing in flight, exit 0.
    drains_and_exits_0(&mut worker).await;
}

#[tokio::test]
async fn work_kills_a_command_that_outlives_the_drain() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    let (job, _) = client
        .enqueue("slow", "shell", "", EnqueueOptions::new())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // A grandchild: only killing the whole process group reaches it.
    let script = format!("sleep 600 & echo $! > {}; wait", pidfile.display());
    let mut worker = command(
        &url,
        &[
            "work",
            "--queue",
            "slow",
            "--kind",
            "shell",
            "--drain-timeout",
            "200ms",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .spawn_quiet();
    let pid = pid_written(&pidfile).await;

    drains_and_exits_0(&mut worker).await;
    until(LIMIT, "the command to be killed", || async move {
        (!alive(pid)).then_some(())
    })
    .await;
    // Told to stop (SIGTERM at the deadline): failed, and due again at
    // once for another worker.
    let back = job_in(&client, &job.id, pb::JobStatus::Pending).await;
    assert_eq!(back.attempts, 1);
    assert!(back.last_error.contains("draining"), "{back:?}");
}

/// `--timeout`: a command that runs too long gets SIGTERM, and one that
/// ignores it (with everything it started) SIGKILL `--kill-grace` later;
/// the job fails with "timed out".
#[tokio::test]
async fn work_times_out_a_command_and_kills_what_ignores_sigterm() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    let (job, _) = client
        .enqueue("slow", "shell", "", EnqueueOptions::new().max_attempts(1))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // Ignored signals stay ignored across exec: the sleep ignores TERM too.
    let script = format!(
        "trap '' TERM; sleep 600 & echo $! > {}; wait",
        pidfile.display()
    );
    let mut worker = command(
        &url,
        &[
            "work",
            "--queue",
            "slow",
            "--timeout",
            "2s",
            "--kill-grace",
            "300ms",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .spawn_quiet();
    let pid = pid_written(&pidfile).await;
    let failed = job_in(&client, &job.id, pb::JobStatus::Failed).await;
    assert_eq!(
        failed.last_error, "timed out after 2s (--timeout)",
        "{failed:?}"
    );
    until(LIMIT, "what ignored SIGTERM to be killed", || async move {
        (!alive(pid)).then_some(())
    })
    .await;
    drains_and_exits_0(&mut worker).await;
}

/// A command that exits but leaves a background process holding its
/// stderr (a daemon it started) has finished: its job is acked at once,
/// not held RUNNING until that process exits. The command does not see
/// the worker's `JOBQ_TOKEN`.
#[tokio::test]
async fn work_acks_a_command_whose_background_child_keeps_stderr_open() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    let (job, _) = client
        .enqueue("bg", "shell", "", EnqueueOptions::new().max_attempts(1))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!(
        "[ -z \"${{JOBQ_TOKEN:-}}\" ] || exit 3; sleep 600 & echo $! > {}; echo started >&2; exit 0",
        pidfile.display()
    );
    let mut worker = command(&url, &["work", "--queue", "bg", "--", "sh", "-c", &script])
        .env("JOBQ_TOKEN", "the-workers-own-secret")
        .spawn_quiet();
    let done = until(LIMIT, "the job to finish", || {
        let client = client.clone();
        let id = job.id.clone();
        async move {
            let job = client.get_job(id).await.unwrap();
            (job.status == pb::JobStatus::Done as i32 || job.status == pb::JobStatus::Failed as i32)
                .then_some(job)
        }
    })
    .await;
    assert_eq!(done.status, pb::JobStatus::Done as i32, "{done:?}");
    drains_and_exits_0(&mut worker).await;
    let sleep = pid_written(&pidfile).await;
    // SAFETY: kill(2) on the sleep this test started.
    unsafe {
        libc::kill(sleep, libc::SIGKILL);
    }
}

/// Regression: a SIGKILLed `jobq work` left its command running, and
/// the server gave the job to another worker: two copies at once.
#[tokio::test]
async fn a_sigkilled_work_takes_its_command_with_it() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    client
        .enqueue("slow", "shell", "", EnqueueOptions::new())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // The command (a shell, jobq work's child) and what it started (a
    // background sleep in its process group): both must die.
    let script = format!("sleep 600 & echo $$ $! > {}; wait", pidfile.display());
    let mut worker = command(
        &url,
        &["work", "--queue", "slow", "--", "sh", "-c", &script],
    )
    .spawn_quiet();
    let (shell, sleep): (libc::pid_t, libc::pid_t) = until(LIMIT, "the command to start", || {
        let read = std::fs::read_to_string(&pidfile).ok();
        async move {
            let read = read?;
            let mut pids = read.split_whitespace().map(|p| p.parse().ok());
            Some((pids.next()??, pids.next()??))
        }
    })
    .await;
    assert!(alive(shell) && alive(sleep));

    signal(&worker, libc::SIGKILL);
    let _ = worker.wait().await;
    until(LIMIT, "the command to die with its worker", || async move {
        (!alive(shell)).then_some(())
    })
    .await;
    until(
        LIMIT,
        "what the command started to die too",
        || async move { (!alive(sleep)).then_some(()) },
    )
    .await;
}

// ---- Completions, --fatal-exit-code, list says there is more ----

#[tokio::test]
async fn completions_for_each_shell_name_the_subcommands() {
    // No server is needed; the URL is never dialled.
    let url = "http://127.0.0.1:1";
    for shell in ["bash", "zsh", "fish"] {
        let run = jobq(url, &["completions", shell]).await.ok();
        assert!(!run.stdout.is_empty(), "{shell}");
        for sub in ["enqueue", "list", "cancel", "purge", "work", "completions"] {
            assert!(run.stdout.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    // bash parses the bash script.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("jobq.bash");
    std::fs::write(
        &script,
        jobq(url, &["completions", "bash"]).await.ok().stdout,
    )
    .unwrap();
    let parsed = tokio::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .await
        .expect("run bash -n");
    assert!(
        parsed.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    assert_eq!(jobq(url, &["completions", "tcsh"]).await.code, 2);
}

#[tokio::test]
async fn work_dead_letters_a_job_whose_command_exits_with_a_fatal_code() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    let fatal = client
        .submit(
            "fq",
            "shell",
            "fatal",
            EnqueueOptions::new().max_attempts(5),
        )
        .await
        .unwrap();
    let retried = client
        .submit(
            "fq",
            "shell",
            "other",
            EnqueueOptions::new().max_attempts(2),
        )
        .await
        .unwrap();
    // Exit 7 for "fatal", 3 otherwise; only 7 is declared fatal.
    let script = r#"p=$(cat); [ "$p" = fatal ] && { echo "cannot parse" >&2; exit 7; }; exit 3"#;
    let mut worker = command(
        &url,
        &[
            "work",
            "--queue",
            "fq",
            "--fatal-exit-code",
            "7",
            "--",
            "sh",
            "-c",
            script,
        ],
    )
    .spawn_quiet();
    let finished = |id: jobq_client::JobId| {
        let client = client.clone();
        async move { Some(client.job(id).await.unwrap()).filter(|j| j.status.is_final()) }
    };
    let dead = until(LIMIT, "the fatal job to be dead-lettered", || {
        finished(fatal.job.id.clone())
    })
    .await;
    assert_eq!(dead.status, jobq_client::Status::Failed, "{dead:?}");
    assert_eq!(dead.history.len(), 1, "no retry: {dead:?}");
    assert_eq!(
        dead.last_error.as_deref(),
        Some("exit status 7: cannot parse")
    );
    // Another non-zero exit is still retried until attempts run out. Its
    // retries wait out the server's backoff, so this only checks that it
    // was not dead-lettered at its first failure.
    let other = until(LIMIT, "the other job to fail once", || {
        let client = client.clone();
        let id = retried.job.id.clone();
        async move {
            Some(client.job(id).await.unwrap())
                .filter(|j| !j.history.is_empty() && j.status != jobq_client::Status::Running)
        }
    })
    .await;
    assert!(
        other.status == jobq_client::Status::Pending || other.history.len() == 2,
        "a plain failure is retried: {other:?}"
    );
    drains_and_exits_0(&mut worker).await;
    let bad = jobq(
        &url,
        &[
            "work",
            "--queue",
            "q",
            "--fatal-exit-code",
            "0",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(bad.code, 2, "exit 0 cannot be fatal: {}", bad.stderr);
}

#[tokio::test]
async fn a_snooze_exit_code_puts_the_job_back_without_spending_an_attempt() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    let enqueued = jobq(
        &url,
        &[
            "enqueue",
            "sq",
            "shell",
            "--payload",
            "rate-limited",
            "--max-snoozes",
            "5",
        ],
    )
    .await;
    assert_eq!(enqueued.code, 0, "{}", enqueued.stderr);
    let id = enqueued.stdout.trim().to_owned();
    let mut worker = command(
        &url,
        &[
            "work",
            "--queue",
            "sq",
            "--snooze-exit-code",
            "75",
            "--snooze",
            "1h",
            "--",
            "sh",
            "-c",
            "echo '429: try again later' >&2; exit 75",
        ],
    )
    .spawn_quiet();
    let snoozed = until(LIMIT, "the job to be snoozed", || {
        let client = client.clone();
        let id = id.clone();
        async move {
            Some(client.job(id).await.unwrap())
                .filter(|j| j.status == jobq_client::Status::Pending && !j.history.is_empty())
        }
    })
    .await;
    assert_eq!(snoozed.attempts, 0, "no attempt spent: {snoozed:?}");
    assert_eq!((snoozed.snoozes, snoozed.max_snoozes), (1, 5));
    let shown = jobq(&url, &["get", &id, "--json"]).await.json();
    assert_eq!(
        (shown["snoozes"].as_u64(), shown["max_snoozes"].as_u64()),
        (Some(1), Some(5))
    );
    let last = snoozed.history.last().unwrap();
    assert_eq!(last.outcome, jobq_client::Outcome::Snoozed, "{snoozed:?}");
    assert_eq!(
        last.error.as_deref(),
        Some("exit status 75: 429: try again later")
    );
    let wait = snoozed
        .run_at
        .unwrap()
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(
        wait > Duration::from_secs(3500),
        "due in about an hour: {wait:?}"
    );
    drains_and_exits_0(&mut worker).await;
    let both = jobq(
        &url,
        &[
            "work",
            "--queue",
            "sq",
            "--fatal-exit-code",
            "75",
            "--snooze-exit-code",
            "75",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(both.code, 2, "one code, two meanings: {}", both.stderr);
}

#[tokio::test]
async fn enqueue_says_what_it_did_with_a_key_and_its_rules() {
    let server = TestServer::start().await;
    let url = server.url();
    let enqueue = |payload: &'static str, extra: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let mut args = vec![
                "enqueue",
                "q",
                "reindex",
                "--key",
                "doc-9",
                "--payload",
                payload,
                "--json",
            ];
            args.extend_from_slice(extra);
            jobq(&url, &args).await.ok().json()
        }
    };
    let first = enqueue("v1", &["--delay", "1h"]).await;
    assert_eq!(first["outcome"], "CREATED");
    let id = first["job"]["id"].as_str().unwrap().to_owned();
    let again = enqueue("v2", &[]).await;
    assert_eq!(
        (again["outcome"].as_str(), again["job"]["id"].as_str()),
        (Some("EXISTING"), Some(id.as_str()))
    );
    // Debounce: the PENDING job takes the latest payload, due after the delay.
    let replaced = enqueue("v3", &["--replace", "--delay", "2h"]).await;
    assert_eq!(
        (replaced["outcome"].as_str(), replaced["job"]["id"].as_str()),
        (Some("REPLACED"), Some(id.as_str()))
    );
    let got = jobq(&url, &["get", &id, "--json"]).await.ok().json();
    assert_eq!(got["payload"], "v3");
    // The rules need a key: refused before anything is sent.
    let keyless = jobq(&url, &["enqueue", "q", "k", "--unique-for", "1h"]).await;
    assert_eq!(keyless.code, 2, "{}", keyless.stderr);
    let batch = jobq_in(
        &url,
        &["enqueue", "--batch-file", "-", "--json"],
        Some(b"{\"queue\":\"q\",\"kind\":\"reindex\",\"key\":\"doc-9\",\"payload\":\"v4\",\"replace\":true}\n"),
    )
    .await
    .ok()
    .json();
    assert_eq!(batch["outcome"], "REPLACED");
}

#[tokio::test]
async fn list_says_when_more_jobs_match_and_how_to_see_them() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    for i in 0..5 {
        client
            .submit("more", "k", format!("{i}"), EnqueueOptions::new())
            .await
            .unwrap();
    }
    let ids = |run: &Run| -> Vec<String> {
        run.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let token_in = |stderr: &str| -> String {
        let at = stderr
            .find("--page-token ")
            .unwrap_or_else(|| panic!("no token in {stderr:?}"));
        stderr[at + "--page-token ".len()..]
            .split(|c: char| c == ',' || c.is_whitespace())
            .next()
            .unwrap()
            .to_owned()
    };

    let first = jobq(&url, &["list", "--queue", "more", "--limit", "2", "--json"])
        .await
        .ok();
    assert_eq!(ids(&first).len(), 2);
    assert!(first.stderr.contains("more jobs match"), "{}", first.stderr);
    let token = token_in(&first.stderr);
    let second = jobq(
        &url,
        &[
            "list",
            "--queue",
            "more",
            "--limit",
            "2",
            "--json",
            "--page-token",
            &token,
        ],
    )
    .await
    .ok();
    let token = token_in(&second.stderr);
    let third = jobq(
        &url,
        &[
            "list",
            "--queue",
            "more",
            "--limit",
            "2",
            "--json",
            "--page-token",
            &token,
        ],
    )
    .await
    .ok();
    assert!(third.stderr.is_empty(), "the rest fits: {}", third.stderr);
    let mut seen = ids(&first);
    seen.extend(ids(&second));
    seen.extend(ids(&third));
    let all = ids(
        &jobq(&url, &["list", "--queue", "more", "--limit", "0", "--json"])
            .await
            .ok(),
    );
    assert_eq!(seen, all, "the pages together are the whole listing, once");
    assert_eq!(all.len(), 5);

    // Exactly the limit: nothing more to say. The table says it too.
    let exact = jobq(&url, &["list", "--queue", "more", "--limit", "5"])
        .await
        .ok();
    assert!(exact.stderr.is_empty(), "{}", exact.stderr);
    let table = jobq(&url, &["list", "--queue", "more", "--limit", "4"])
        .await
        .ok();
    assert_eq!(table.stdout.lines().count(), 5, "{}", table.stdout);
    assert!(
        table.stderr.contains("more jobs match than the 4 shown"),
        "{}",
        table.stderr
    );
}

#[tokio::test]
async fn a_connection_error_names_the_url_and_why() {
    let down = jobq("http://127.0.0.1:1", &["stats"]).await;
    assert_eq!(down.code, 1);
    assert!(
        down.stderr
            .contains("cannot connect to http://127.0.0.1:1: ")
            && down.stderr.contains("Connection refused"),
        "{}",
        down.stderr
    );
    let bare = jobq("127.0.0.1:1", &["stats"]).await;
    assert_eq!(bare.code, 1);
    assert!(
        bare.stderr
            .contains("the URL has no scheme; did you mean http://127.0.0.1:1?"),
        "{}",
        bare.stderr
    );
}

#[tokio::test]
async fn watch_prints_each_state_until_the_job_is_final() {
    let server = TestServer::start().await;
    let (url, client) = (server.url(), server.client().await);
    let job = client
        .submit("wq", "k", "order-4711", EnqueueOptions::new())
        .await
        .unwrap()
        .job;
    let id = job.id.to_string();
    // Following a live job: PENDING now, then RUNNING and DONE as a
    // worker takes and acks it.
    let mut watching = command(&url, &["watch", &id, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn jobq watch");
    let mut lines = BufReader::new(watching.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(
        &tokio::time::timeout(LIMIT, lines.next_line())
            .await
            .expect("a first state")
            .unwrap()
            .expect("a line"),
    )
    .unwrap();
    assert_eq!(first["status"], "PENDING");
    assert!(first.get("payload").is_none() || first["payload"] == "");
    let leased = client
        .dequeue(["wq"], "w", Some(Duration::from_secs(30)), None)
        .await
        .unwrap()
        .expect("due");
    let running: Value = serde_json::from_str(
        &tokio::time::timeout(LIMIT, lines.next_line())
            .await
            .expect("RUNNING")
            .unwrap()
            .expect("a line"),
    )
    .unwrap();
    assert_eq!(running["status"], "RUNNING");
    assert_eq!(running["worker_id"], "w");
    // A heartbeat's progress report is a state of its own, and `jobq get`
    // shows it.
    let lost = client
        .heartbeat(
            "w",
            vec![pb::LeaseRef {
                job_id: id.clone(),
                lease_id: leased.lease_id.clone(),
                progress: Some(pb::Progress {
                    percent: 40,
                    message: "row 4,000 of 10,000".into(),
                    reported_at: None,
                }),
            }],
            None,
        )
        .await
        .unwrap();
    assert!(lost.is_empty());
    let reported: Value = serde_json::from_str(
        &tokio::time::timeout(LIMIT, lines.next_line())
            .await
            .expect("the progress")
            .unwrap()
            .expect("a line"),
    )
    .unwrap();
    assert_eq!(reported["progress"]["percent"], 40);
    assert_eq!(reported["progress"]["message"], "row 4,000 of 10,000");
    let got = jobq(&url, &["get", &id]).await;
    assert!(
        got.stdout.contains("40% row 4,000 of 10,000"),
        "{}",
        got.stdout
    );
    client
        .ack_with_result(id.clone(), leased.lease_id.clone(), "sent")
        .await
        .unwrap();
    let mut states = Vec::new();
    while let Some(line) = tokio::time::timeout(LIMIT, lines.next_line())
        .await
        .expect("the next state")
        .unwrap()
    {
        states.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let status = tokio::time::timeout(LIMIT, watching.wait())
        .await
        .expect("exit")
        .unwrap();
    assert!(status.success());
    let statuses: Vec<&str> = states
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["DONE"]);
    assert_eq!(states[0]["result"], "sent");
    // A cancelled job: its final state, and exit 1.
    let other = client
        .submit("wq", "k", "order-4712", EnqueueOptions::new())
        .await
        .unwrap()
        .job;
    client
        .cancel(other.id.to_string(), "refunded")
        .await
        .unwrap();
    let failed = jobq(&url, &["watch", other.id.as_ref()]).await;
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    assert!(failed.stdout.contains("FAILED"), "{}", failed.stdout);
    assert!(failed.stderr.contains("FAILED: job"), "{}", failed.stderr);
}
