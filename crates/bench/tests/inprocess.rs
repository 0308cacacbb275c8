//! Every workload, tiny, against an in-process server over a temporary
//! sled (`--server` mode: the spawned-server mode needs the `jobq` binary
//! and is covered by the workspace's end-to-end tests).

use std::time::Duration;

use clap::Parser;
use jobq_bench::{measure, BenchArgs, ServerUrl, Workload};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(extra: &[&str]) -> BenchArgs {
    let base = [
        "bench",
        "--json",
        "--no-progress",
        "--jobs",
        "120",
        "--producers",
        "4",
        "--batch-size",
        "25",
    ];
    Cli::try_parse_from(base.iter().chain(extra))
        .expect("flags")
        .bench
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_reports_throughput_and_percentiles() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let config = jobq_server::Config::with_data(dir.path().join("data"));
    let server = tokio::spawn(jobq_server::serve(config, listener, shutdown.clone()));

    let mut args = args(&[
        "--workers",
        "2",
        "--rate",
        "400",
        "--latency-jobs",
        "40",
        "--latency-workers",
        "2",
        "--mixed-producers",
        "2",
        "--duration",
        "300ms",
        "--connections",
        "3",
    ]);
    args.server = ServerUrl(Some(url.clone()));
    let mut seen = Vec::new();
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        measure(args, |o| seen.push(o.workload)),
    )
    .await
    .expect("bench finished in time")
    .expect("bench ran");

    let all = [
        Workload::Enqueue,
        Workload::EnqueueBatch,
        Workload::Drain,
        Workload::Latency,
        Workload::Mixed,
        Workload::EnqueueOwn,
        Workload::DrainOwnCap1,
        Workload::DrainOwnCap4,
        Workload::LatencyOwn,
    ];
    assert_eq!(seen, all);
    assert!(
        report.memory.is_none(),
        "no memory figure for an external server"
    );
    for o in &report.outcomes {
        let line = o.to_json();
        assert!(o.jobs_per_sec() > 0.0, "{line}");
        assert!(line["p50_ms"].as_f64().unwrap() > 0.0, "{line}");
        assert!(
            line["p99_ms"].as_f64().unwrap() >= line["p50_ms"].as_f64().unwrap(),
            "{line}"
        );
        assert_eq!(line["durability"], "fsync");
    }
    let by = |w: Workload| report.outcomes.iter().find(|o| o.workload == w).unwrap();
    assert_eq!(by(Workload::Enqueue).jobs, 120);
    assert_eq!(
        by(Workload::Enqueue).latency.count,
        120,
        "one sample per RPC"
    );
    assert_eq!(
        by(Workload::EnqueueBatch).latency.count,
        120 / 25 + 1,
        "one sample per batch"
    );
    assert_eq!(by(Workload::Drain).jobs, 120);
    assert_eq!(by(Workload::Drain).latency.count, 120, "one ack per job");
    assert_eq!(
        by(Workload::Latency).latency.count,
        40,
        "every job delivered once"
    );
    // The like-for-like shapes: own connections, capacity 1 where promised.
    let own = by(Workload::EnqueueOwn).to_json();
    assert_eq!(own["workload"], "enqueue-own-conn");
    assert_eq!(own["params"]["connections"], "own");
    assert_eq!(by(Workload::EnqueueOwn).jobs, 120);
    for (w, cap) in [(Workload::DrainOwnCap1, 1), (Workload::DrainOwnCap4, 4)] {
        let line = by(w).to_json();
        assert_eq!(line["params"]["capacity"], cap, "{line}");
        assert_eq!(line["params"]["connections"], "own", "{line}");
        assert_eq!(by(w).jobs, 120, "{line}");
    }
    let c = by(Workload::LatencyOwn).to_json();
    assert_eq!(c["workload"], "latency-own-conn");
    assert_eq!(c["params"]["capacity"], 1);
    assert_eq!(by(Workload::LatencyOwn).latency.count, 40);

    // Each workload had its own queue, and the workers left nothing
    // pending or running in theirs.
    let client = jobq_client::Client::connect(url).await.unwrap();
    let stats = client.stats(None).await.unwrap();
    assert_eq!(stats.len(), 9, "{stats:?}");
    for q in &stats {
        let total = q.pending + q.running + q.done + q.failed;
        if q.queue.ends_with("-enqueue")
            || q.queue.ends_with("-enqueue-batch")
            || q.queue.ends_with("-enqueue-own-conn")
        {
            assert_eq!((q.pending, total), (120, 120), "{q:?}");
        } else {
            assert_eq!((q.pending, q.running, q.failed), (0, 0, 0), "{q:?}");
            assert_eq!(q.done, total, "{q:?}");
        }
    }
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[test]
fn zero_connections_is_refused() {
    let err = Cli::try_parse_from(["bench", "--connections", "0"])
        .err()
        .expect("refused");
    assert!(err.to_string().contains("--connections"), "{err}");
}
