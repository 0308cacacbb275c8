//! C: how long a job takes from the producer's Enqueue to a waiting
//! worker, at a steady rate below saturation.
//!
//! `--latency-workers` Lease streams wait on an empty queue. One producer
//! sends `--latency-jobs` jobs at `--rate` per second, open loop: send `k`
//! is due at `start + k / rate` and goes out then whether or not earlier
//! replies came back (a producer that waited for replies would hide the
//! server's stalls — coordinated omission). Each payload carries the
//! instant just before its Enqueue was sent ([`stamp`](crate::stamp));
//! the worker records the time since then when the leased event arrives,
//! then acks. The Enqueue RPC's own round trip is an extra figure, and so
//! is `send_lag`: how late each send went out against its schedule. The
//! latencies count from the actual send, so a producer that fell behind
//! (a starved client, tokio's 1 ms timer) shows there, not in the server's
//! figures.
//!
//! The latencies are stamped in the send's own task, so its lag includes
//! the time that task waited to be scheduled.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context;
use jobq_client::EnqueueOptions;
use tokio::task::JoinSet;

use super::{join_all, worker, KIND};
use crate::{hist::Latencies, pool::Pool, progress::Progress, stamp, BenchArgs, Outcome, Workload};

/// Runs C (or its own-connection shape, `workload`).
pub async fn run(
    workload: Workload,
    args: &BenchArgs,
    pool: &Pool,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    let queue = pool.queue_for(workload.name()).await?;
    run_on(workload, args, pool, progress, &queue, |_| {
        EnqueueOptions::new()
    })
    .await
}

/// Runs C on `queue`, each job `seq` enqueued with `options(seq)`.
pub async fn run_on(
    workload: Workload,
    args: &BenchArgs,
    pool: &Pool,
    progress: &Progress,
    queue: &str,
    options: fn(u64) -> EnqueueOptions,
) -> anyhow::Result<Outcome> {
    anyhow::ensure!(args.rate > 0, "--rate must be at least 1");
    let name = workload.name();
    let queue = queue.to_owned();
    let total = args.latency_jobs;
    let bar = progress.bar(name, total);
    let shared = worker::Shared::new(Some(total), bar.clone(), true);
    let workers = worker::start(
        pool,
        &queue,
        args.latency_workers.max(1),
        args.capacity,
        &shared,
    )
    .await?;

    // The producer's connection is not one the workers use, when the pool
    // has room: its sends should not queue behind acks.
    let client = pool.client(args.latency_workers.max(1));
    let rpc = Arc::new(Mutex::new(Latencies::default()));
    let lag = Arc::new(Mutex::new(Latencies::default()));
    let period = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let start = Instant::now();
    let mut sends = JoinSet::new();
    for seq in 0..total {
        let due = start + period.mul_f64(seq as f64);
        tokio::time::sleep_until(due.into()).await;
        let (client, queue, rpc) = (client.clone(), queue.clone(), Arc::clone(&rpc));
        let lag = Arc::clone(&lag);
        let payload_bytes = args.payload_bytes;
        sends.spawn(async move {
            let payload = stamp::payload(payload_bytes, seq);
            let sent = Instant::now();
            lag.lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(sent.saturating_duration_since(due));
            client
                .enqueue(queue.as_str(), KIND, payload, options(seq))
                .await
                .context("Enqueue failed")?;
            let took = sent.elapsed();
            rpc.lock().unwrap_or_else(|e| e.into_inner()).record(took);
            anyhow::Ok(())
        });
        // Reap finished sends as we go so a failure stops the run early.
        while let Some(done) = sends.try_join_next() {
            done??;
        }
    }
    join_all(sends).await?;
    let sent_in = start.elapsed();
    let stats = worker::finish(workers).await?;
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    let enqueue_rpc = rpc.lock().unwrap_or_else(|e| e.into_inner()).summary();
    let send_lag = lag.lock().unwrap_or_else(|e| e.into_inner()).summary();
    Ok(Outcome::new(
        workload,
        total,
        elapsed,
        "enqueue_to_delivered",
        stats.delivered.summary(),
    )
    .extra("enqueue_rpc", enqueue_rpc)
    .extra("enqueue_to_acked", stats.acked.summary())
    .extra("send_lag", send_lag)
    .param("rate", args.rate)
    .param(
        "achieved_rate",
        (total as f64 / sent_in.as_secs_f64().max(1e-9)).round(),
    )
    .param("workers", args.latency_workers)
    .param("capacity", args.capacity)
    .param("payload_bytes", args.payload_bytes.max(stamp::MIN_LEN))
    .param("connections", args.connections))
}
