//! The workloads. Each one uses a fresh queue, times only its own phase,
//! and returns an [`Outcome`].

mod drain;
mod enqueue;
mod held;
mod latency;
mod mixed;
pub mod pgloop;
mod worker;

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use tokio::task::JoinSet;

use crate::{pool::Pool, progress::Progress, BenchArgs, Connections, Outcome, Workload};

/// The job kind every bench job has.
const KIND: &str = "bench";

/// Runs one workload.
pub async fn run(
    workload: Workload,
    args: &BenchArgs,
    pool: &Pool,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    let own = |capacity: Option<u32>| BenchArgs {
        connections: Connections::Own,
        capacity: capacity.unwrap_or(args.capacity),
        ..args.clone()
    };
    match workload {
        Workload::Enqueue => enqueue::single(workload, args, pool, progress).await,
        Workload::EnqueueBatch => enqueue::batch(args, pool, progress).await,
        Workload::Drain => drain::run(workload, args, pool, progress).await,
        Workload::Latency => latency::run(workload, args, pool, progress).await,
        Workload::Mixed => mixed::run(args, pool, progress).await,
        Workload::EnqueueOwn => enqueue::single(workload, &own(None), pool, progress).await,
        Workload::DrainOwnCap1 => drain::run(workload, &own(Some(1)), pool, progress).await,
        Workload::DrainOwnCap4 => drain::run(workload, &own(Some(4)), pool, progress).await,
        Workload::LatencyOwn => latency::run(workload, &own(Some(1)), pool, progress).await,
        Workload::LatencyHeld => held::run(workload, &own(Some(1)), pool, progress).await,
        Workload::DrainOwnCap1Analyzed => {
            let pg = args.pg.as_deref();
            drain::run_analyzed(workload, &own(Some(1)), pool, progress, pg).await
        }
        Workload::LoopEnqueue
        | Workload::LoopDrain
        | Workload::LoopDrainAnalyzed
        | Workload::LoopLatency => {
            let pg = args
                .pg
                .as_deref()
                .ok_or_else(|| anyhow::anyhow!("needs --pg"))?;
            let queue = pool.queue(workload.name());
            pgloop::run(workload, args, pg, &queue, progress).await
        }
    }
}

/// How many connections `workload` needs to give each of its producers
/// and workers one of its own.
pub fn clients(workload: Workload, args: &BenchArgs) -> usize {
    match workload {
        Workload::Enqueue | Workload::EnqueueBatch | Workload::EnqueueOwn => args.producers,
        Workload::Drain
        | Workload::DrainOwnCap1
        | Workload::DrainOwnCap4
        | Workload::DrainOwnCap1Analyzed => args.workers,
        Workload::LoopEnqueue
        | Workload::LoopDrain
        | Workload::LoopDrainAnalyzed
        | Workload::LoopLatency => 1,
        // The producer comes after the workers.
        Workload::Latency | Workload::LatencyOwn | Workload::LatencyHeld => {
            args.latency_workers + 1
        }
        Workload::Mixed => args.workers + args.mixed_producers,
    }
    .max(1)
}

/// Hands out job numbers `0..total` to concurrent producers, `n` at a time,
/// so fast producers take more and all finish together.
#[derive(Clone)]
struct Tickets {
    next: Arc<AtomicU64>,
    total: u64,
}

impl Tickets {
    fn new(total: u64) -> Tickets {
        Tickets {
            next: Arc::new(AtomicU64::new(0)),
            total,
        }
    }

    /// The next up to `n` job numbers as (first, count); `None` when all
    /// are taken.
    fn take(&self, n: u64) -> Option<(u64, u64)> {
        let first = self.next.fetch_add(n, Ordering::Relaxed);
        (first < self.total).then(|| (first, n.min(self.total - first)))
    }
}

/// Waits for every task, failing with the first error (the others are
/// aborted when the set drops).
async fn join_all<T: 'static>(mut set: JoinSet<anyhow::Result<T>>) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::with_capacity(set.len());
    while let Some(joined) = set.join_next().await {
        out.push(joined??);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_cover_every_job_once() {
        let t = Tickets::new(250);
        let mut got = Vec::new();
        while let Some((first, n)) = t.take(100) {
            got.push((first, n));
        }
        assert_eq!(got, [(0, 100), (100, 100), (200, 50)]);
        assert_eq!(t.take(1), None);
    }
}
