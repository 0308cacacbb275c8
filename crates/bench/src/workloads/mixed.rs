//! Mixed: producers and workers at the same time, the steady state of a
//! real deployment.
//!
//! `--workers` Lease streams take and ack while `--mixed-producers` enqueue
//! one job per RPC as fast as their replies come back — but never more
//! than `--mixed-backlog` jobs ahead of the acks: unbounded producers
//! outrun durable take+ack, and the latency would only measure a growing
//! queue. With `--duration` (default) producers stop when it runs out; the
//! throughput is the acks inside that window over its length, and the jobs
//! still queued then are drained afterwards (untimed, but their latencies
//! count — they were enqueued in the window). With `--mixed-jobs N` exactly N jobs go
//! through and the clock stops at the last ack. The headline latency is
//! end to end: just before the Enqueue was sent → the worker's Ack reply.

use std::{sync::Arc, time::Instant};

use anyhow::Context;
use jobq_client::EnqueueOptions;
use tokio::task::JoinSet;

use super::{join_all, worker, Tickets, KIND};
use crate::{hist::Latencies, pool::Pool, progress::Progress, stamp, BenchArgs, Outcome, Workload};

/// Runs the mixed workload.
pub async fn run(args: &BenchArgs, pool: &Pool, progress: &Progress) -> anyhow::Result<Outcome> {
    let name = Workload::Mixed.name();
    let queue = pool.queue_for(name).await?;
    let bar = match args.mixed_jobs {
        Some(n) => progress.bar(name, n),
        None => {
            let bar = progress.counter(name);
            bar.set_message(format!("of {}", humantime::format_duration(args.duration)));
            bar
        }
    };
    let shared = worker::Shared::new(args.mixed_jobs, bar.clone(), true);
    let workers_n = args.workers.max(1);
    let backlog = args
        .mixed_backlog
        .unwrap_or(2 * workers_n as u64 * u64::from(args.capacity))
        .max(1);
    shared.credits.add_permits(
        usize::try_from(backlog)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS / 2),
    );
    let workers = worker::start(pool, &queue, workers_n, args.capacity, &shared).await?;

    let tickets = Tickets::new(args.mixed_jobs.unwrap_or(u64::MAX));
    let start = Instant::now();
    let deadline = args.mixed_jobs.is_none().then(|| start + args.duration);
    let mut producers = JoinSet::new();
    for i in 0..args.mixed_producers.max(1) {
        // After the workers' connections, so sends and acks spread out.
        let (client, queue, tickets) = (pool.client(workers_n + i), queue.clone(), tickets.clone());
        let shared = Arc::clone(&shared);
        let payload_bytes = args.payload_bytes;
        producers.spawn(async move {
            let mut rpc = Latencies::default();
            let mut sent_jobs = 0u64;
            while deadline.is_none_or(|d| Instant::now() < d) {
                // A credit first (one comes back with each ack), or the end.
                let credit = match deadline {
                    Some(d) => {
                        match tokio::time::timeout_at(d.into(), shared.credits.acquire()).await {
                            Ok(credit) => credit,
                            Err(_) => break,
                        }
                    }
                    None => shared.credits.acquire().await,
                };
                credit.context("credits closed")?.forget();
                let Some((seq, _)) = tickets.take(1) else {
                    break;
                };
                let payload = stamp::payload(payload_bytes, seq);
                let sent = Instant::now();
                client
                    .enqueue(queue.as_str(), KIND, payload, EnqueueOptions::new())
                    .await
                    .context("Enqueue failed")?;
                rpc.record(sent.elapsed());
                sent_jobs += 1;
            }
            anyhow::Ok((rpc, sent_jobs))
        });
    }

    let (jobs, elapsed, enqueued, enqueue_rpc, stats) = match deadline {
        Some(deadline) => {
            tokio::time::sleep_until(deadline.into()).await;
            let (acked, window) = (shared.acked(), start.elapsed());
            let (rpc, enqueued) = totals(join_all(producers).await?);
            bar.set_message("draining the backlog (untimed)");
            shared.set_target(enqueued);
            let stats = worker::finish(workers).await?;
            (acked, window, enqueued, rpc, stats)
        }
        None => {
            let (rpc, enqueued) = totals(join_all(producers).await?);
            let stats = worker::finish(workers).await?;
            (enqueued, start.elapsed(), enqueued, rpc, stats)
        }
    };
    bar.finish_and_clear();
    let mut outcome = Outcome::new(
        Workload::Mixed,
        jobs,
        elapsed,
        "enqueue_to_acked",
        stats.acked.summary(),
    )
    .extra("enqueue_to_delivered", stats.delivered.summary())
    .extra("enqueue_rpc", enqueue_rpc.summary())
    .extra("ack_rpc", stats.ack_rpc.summary())
    .param("producers", args.mixed_producers)
    .param("workers", args.workers)
    .param("capacity", args.capacity)
    .param("payload_bytes", args.payload_bytes.max(stamp::MIN_LEN))
    .param("enqueued", enqueued)
    .param("backlog_at_end", enqueued.saturating_sub(jobs));
    if deadline.is_some() {
        outcome = outcome.param("duration_s", args.duration.as_secs_f64());
    }
    Ok(outcome)
}

/// All producers' RPC latencies and how many jobs they enqueued.
fn totals(parts: Vec<(Latencies, u64)>) -> (Latencies, u64) {
    let mut all = Latencies::default();
    let mut n = 0;
    for (rpc, sent) in &parts {
        all.merge(rpc);
        n += sent;
    }
    (all, n)
}
