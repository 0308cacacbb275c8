//! B: how fast workers can take and ack jobs that are already waiting.
//!
//! First `--jobs` jobs are enqueued with EnqueueBatch (not timed). Then
//! `--workers` Lease streams of `--capacity` each are opened and every job
//! is acked as soon as it arrives; the clock runs from opening the streams
//! to the last ack reply. Both the take (the lease the server pushes) and
//! the ack are durable, so each job costs the server two group commits'
//! worth of writes. The latency is the Ack RPC's round trip.

use std::time::Instant;

use super::{enqueue::fill, worker};
use crate::{pool::Pool, progress::Progress, BenchArgs, Outcome, Workload};

/// Concurrent EnqueueBatch calls of the untimed fill.
const FILL_PRODUCERS: usize = 8;

/// Runs B (or one of its own-connection shapes, `workload`).
pub async fn run(
    workload: Workload,
    args: &BenchArgs,
    pool: &Pool,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    run_analyzed(workload, args, pool, progress, None).await
}

/// Runs B, with `analyze` (a PostgreSQL URL) running `ANALYZE jobq_jobs`
/// there between the fill and the drain.
pub async fn run_analyzed(
    workload: Workload,
    args: &BenchArgs,
    pool: &Pool,
    progress: &Progress,
    analyze: Option<&str>,
) -> anyhow::Result<Outcome> {
    let name = workload.name();
    let queue = pool.queue_for(name).await?;
    let filling = progress.bar("drain (fill)", args.jobs);
    fill(pool, &queue, args, FILL_PRODUCERS, &filling).await?;
    filling.finish_and_clear();
    if let Some(url) = analyze {
        super::pgloop::analyze(url, "jobq_jobs").await?;
    }

    let bar = progress.bar(name, args.jobs);
    let shared = worker::Shared::new(Some(args.jobs), bar.clone(), false);
    let start = Instant::now();
    let workers = worker::start(pool, &queue, args.workers.max(1), args.capacity, &shared).await?;
    let stats = worker::finish(workers).await?;
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    Ok(Outcome::new(
        workload,
        shared.acked(),
        elapsed,
        "ack_rpc",
        stats.ack_rpc.summary(),
    )
    .param("workers", args.workers)
    .param("capacity", args.capacity)
    .param("payload_bytes", args.payload_bytes)
    .param("connections", args.connections))
}
