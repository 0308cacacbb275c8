//! A and A-batch: how fast producers can enqueue durable jobs.
//!
//! `--producers` tasks (spread over the connection pool) take job numbers
//! from a shared counter until `--jobs` are enqueued: one job per Enqueue
//! RPC (A), or `--batch-size` per EnqueueBatch RPC (A-batch). Each RPC's
//! round trip goes into the latency histogram; the throughput is jobs over
//! the wall time of the whole phase.

use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::ProgressBar;
use jobq_client::{pb, Client, EnqueueOptions};
use tokio::task::JoinSet;

use super::{join_all, Tickets, KIND};
use crate::{hist::Latencies, pool::Pool, progress::Progress, BenchArgs, Outcome, Workload};

/// A (and A on own connections, `workload`): one job per Enqueue RPC.
pub async fn single(
    workload: Workload,
    args: &BenchArgs,
    pool: &Pool,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    let queue = pool.queue_for(workload.name()).await?;
    let bar = progress.bar(workload.name(), args.jobs);
    let tickets = Tickets::new(args.jobs);
    let start = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..args.producers.max(1) {
        let (client, queue, tickets, bar) =
            (pool.client(i), queue.clone(), tickets.clone(), bar.clone());
        let payload = vec![b'x'; args.payload_bytes];
        set.spawn(async move {
            let mut rpc = Latencies::default();
            while tickets.take(1).is_some() {
                let sent = Instant::now();
                client
                    .enqueue(queue.as_str(), KIND, payload.clone(), EnqueueOptions::new())
                    .await
                    .context("Enqueue failed")?;
                rpc.record(sent.elapsed());
                bar.inc(1);
            }
            anyhow::Ok(rpc)
        });
    }
    let rpc = merged(join_all(set).await?);
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    Ok(
        Outcome::new(workload, args.jobs, elapsed, "enqueue_rpc", rpc.summary())
            .param("producers", args.producers)
            .param("payload_bytes", args.payload_bytes)
            .param("connections", args.connections),
    )
}

/// A-batch: `--batch-size` jobs per EnqueueBatch RPC.
pub async fn batch(args: &BenchArgs, pool: &Pool, progress: &Progress) -> anyhow::Result<Outcome> {
    let queue = pool.queue_for(Workload::EnqueueBatch.name()).await?;
    let bar = progress.bar(Workload::EnqueueBatch.name(), args.jobs);
    let start = Instant::now();
    let rpc = fill(pool, &queue, args, args.producers, &bar).await?;
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    Ok(Outcome::new(
        Workload::EnqueueBatch,
        args.jobs,
        elapsed,
        "enqueue_batch_rpc",
        rpc.summary(),
    )
    .param("producers", args.producers)
    .param("batch_size", args.batch_size)
    .param("payload_bytes", args.payload_bytes)
    .param("connections", args.connections))
}

/// Enqueues `args.jobs` jobs into `queue` with EnqueueBatch from
/// `producers` concurrent tasks; returns the RPC latencies. Also B's
/// (untimed) fill.
pub async fn fill(
    pool: &Pool,
    queue: &str,
    args: &BenchArgs,
    producers: usize,
    bar: &ProgressBar,
) -> anyhow::Result<Latencies> {
    let tickets = Tickets::new(args.jobs);
    let mut set = JoinSet::new();
    for i in 0..producers.max(1) {
        let (client, queue, tickets, bar) = (
            pool.client(i),
            queue.to_owned(),
            tickets.clone(),
            bar.clone(),
        );
        let (batch, payload_bytes) = (args.batch_size as u64, args.payload_bytes);
        set.spawn(async move {
            let mut rpc = Latencies::default();
            while let Some((_, n)) = tickets.take(batch) {
                let jobs = (0..n)
                    .map(|_| {
                        EnqueueOptions::new().into_request(
                            queue.as_str(),
                            KIND,
                            vec![b'x'; payload_bytes],
                        )
                    })
                    .collect();
                let sent = Instant::now();
                enqueue_batch(&client, jobs).await?;
                rpc.record(sent.elapsed());
                bar.inc(n);
            }
            anyhow::Ok(rpc)
        });
    }
    Ok(merged(join_all(set).await?))
}

/// One EnqueueBatch; any rejected entry is an error.
async fn enqueue_batch(client: &Client, jobs: Vec<pb::EnqueueRequest>) -> anyhow::Result<()> {
    let n = jobs.len();
    let results = client
        .enqueue_batch(jobs)
        .await
        .context("EnqueueBatch failed")?;
    if results.len() != n {
        bail!(
            "EnqueueBatch returned {} results for {n} jobs",
            results.len()
        );
    }
    if let Some(bad) = results.iter().find(|r| r.error_code != 0) {
        bail!(
            "EnqueueBatch rejected a job (code {}): {}",
            bad.error_code,
            bad.error_message
        );
    }
    Ok(())
}

fn merged(parts: Vec<Latencies>) -> Latencies {
    let mut all = Latencies::default();
    for part in &parts {
        all.merge(part);
    }
    all
}
