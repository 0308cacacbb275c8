//! `jobq bench` end to end: the real binary spawns its own `jobq serve`
//! child, runs every workload at a tiny size, and prints one JSON line per
//! workload.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::harness::JOBQ;

#[test]
fn tiny_bench_prints_one_json_line_per_workload() {
    let data_parent = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let out = Command::new(JOBQ)
        .args(["bench", "--json", "--no-progress"])
        .args(["--jobs", "200", "--producers", "4", "--workers", "2"])
        .args([
            "--rate",
            "500",
            "--latency-jobs",
            "100",
            "--duration",
            "500ms",
        ])
        .arg("--data-dir")
        .arg(data_parent.path())
        .env_remove("JOBQ_SERVER")
        .stdin(Stdio::null())
        .output()
        .expect("run jobq bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );

    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "enqueue",
            "enqueue-batch",
            "drain",
            "latency",
            "mixed",
            "enqueue-own-conn",
            "drain-own-conn-cap1",
            "drain-own-conn-cap4",
            "latency-own-conn"
        ]
    );
    for line in &lines {
        assert!(line["jobs"].as_u64().unwrap() > 0, "{line}");
        assert!(line["jobs_per_sec"].as_f64().unwrap() > 0.0, "{line}");
        let (p50, p99) = (
            line["p50_ms"].as_f64().unwrap(),
            line["p99_ms"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{line}");
        assert_eq!(line["durability"], "fsync", "{line}");
        // A spawned server: its memory is measured.
        assert!(
            line["server_peak_rss_mib"].as_f64().unwrap() > 0.0,
            "{line}"
        );
    }
    assert_eq!(lines[0]["jobs"], 200);
    assert_eq!(lines[3]["jobs"], 100);
    // C says how late its sends went out against their schedule.
    for c in [&lines[3], &lines[8]] {
        assert_eq!(c["extra"]["send_lag"]["samples"], 100, "{c}");
    }
    // The like-for-like shapes: one connection per producer and worker.
    for line in &lines[5..] {
        assert_eq!(line["params"]["connections"], "own", "{line}");
    }
    assert_eq!(lines[6]["params"]["capacity"], 1);
    assert_eq!(lines[8]["params"]["capacity"], 1);

    // The server is gone and so is its temporary data.
    let left: Vec<_> = std::fs::read_dir(data_parent.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_zero_count_is_refused_before_any_workload_runs() {
    let data_parent = tempfile::tempdir().expect("tempdir");
    // `a` first: the zero `--rate` is C's, and used to end the run only
    // after A had run (a zero `--jobs` or `--latency-jobs` hung forever).
    for (flag, workloads) in [
        ("--jobs", "b"),
        ("--latency-jobs", "c"),
        ("--rate", "a,c"),
        ("--mixed-jobs", "mixed"),
        ("--latency-workers", "c-own"),
    ] {
        let started = Instant::now();
        let out = Command::new(JOBQ)
            .args([
                "bench",
                "--no-progress",
                "--workloads",
                workloads,
                flag,
                "0",
            ])
            .arg("--data-dir")
            .arg(data_parent.path())
            .env_remove("JOBQ_SERVER")
            .stdin(Stdio::null())
            .output()
            .expect("run jobq bench");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} 0 ran: {stdout}");
        assert!(
            stderr.contains(&format!("{flag} must be at least 1")),
            "{flag}: {stderr}"
        );
        assert!(!stdout.contains("jobs/s"), "a workload ran: {stdout}");
        assert!(started.elapsed() < Duration::from_secs(30), "{flag}");
    }
}

/// The children of `pid`, from `/proc` (every thread's list).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Whether `pid` is still running (a zombie counts as gone).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[test]
fn a_killed_bench_takes_its_server_with_it() {
    let data_parent = tempfile::tempdir().expect("tempdir");
    let mut bench = Command::new(JOBQ)
        .args(["bench", "--no-progress", "--workloads", "mixed"])
        .args(["--duration", "120s"])
        .arg("--data-dir")
        .arg(data_parent.path())
        .env_remove("JOBQ_SERVER")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn jobq bench");
    let deadline = Instant::now() + Duration::from_secs(30);
    let server = loop {
        if let Some(&pid) = children(bench.id()).first() {
            break pid;
        }
        assert!(Instant::now() < deadline, "the bench spawned no server");
        std::thread::sleep(Duration::from_millis(20));
    };
    // A SIGKILL: the bench gets no chance to stop its server itself.
    bench.kill().expect("kill the bench");
    bench.wait().expect("reap the bench");
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(server) {
        assert!(
            Instant::now() < deadline,
            "server {server} outlived its bench"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
