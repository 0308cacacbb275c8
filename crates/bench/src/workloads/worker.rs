//! The bench's worker: one Lease stream that acks every job it is given,
//! as soon as it arrives, up to the stream's capacity at once. It measures
//! the server (delivery, ack RPC), not a handler: the raw stream, no
//! `Worker` runtime, no heartbeats (leases outlast the run).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use futures::{stream::FuturesUnordered, StreamExt};
use indicatif::ProgressBar;
use jobq_client::{
    pb::{lease_event::Event, LeaseEvent},
    Client,
};
use tokio::{sync::Semaphore, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use crate::{hist::Latencies, pool::Pool, stamp};

/// What all workers of a workload share: the ack count and when to stop.
pub struct Shared {
    acked: AtomicU64,
    target: AtomicU64,
    /// Cancelled when `target` jobs are acked (or by the workload).
    pub done: CancellationToken,
    bar: ProgressBar,
    stamped: bool,
    /// One permit back per ack: producers that take one before each send
    /// keep the backlog bounded (the mixed workload's steady state).
    pub credits: Semaphore,
}

impl Shared {
    /// Workers that stop after `target` acks in all (`None`: not known yet,
    /// see [`set_target`](Self::set_target)), counting on `bar`. With
    /// `stamped`, payloads carry their send time ([`stamp`]) and the workers
    /// measure delivery and end-to-end latency from it.
    pub fn new(target: Option<u64>, bar: ProgressBar, stamped: bool) -> Arc<Shared> {
        Arc::new(Shared {
            acked: AtomicU64::new(0),
            target: AtomicU64::new(target.unwrap_or(u64::MAX)),
            done: CancellationToken::new(),
            bar,
            stamped,
            credits: Semaphore::new(0),
        })
    }

    /// Jobs acked so far.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Stop once `target` jobs are acked (at once if they already are).
    pub fn set_target(&self, target: u64) {
        self.target.store(target, Ordering::SeqCst);
        if self.acked() >= target {
            self.done.cancel();
        }
    }

    fn acked_one(&self) {
        let n = self.acked.fetch_add(1, Ordering::SeqCst) + 1;
        self.credits.add_permits(1);
        self.bar.inc(1);
        if n >= self.target.load(Ordering::SeqCst) {
            self.done.cancel();
        }
    }
}

/// What one worker measured.
#[derive(Default, Clone)]
pub struct WorkerStats {
    /// Enqueue sent → leased event received (stamped payloads only).
    pub delivered: Latencies,
    /// Enqueue sent → ack reply received (stamped payloads only).
    pub acked: Latencies,
    /// Ack RPC round trips.
    pub ack_rpc: Latencies,
}

impl WorkerStats {
    /// Adds another worker's figures.
    pub fn merge(&mut self, other: &WorkerStats) {
        self.delivered.merge(&other.delivered);
        self.acked.merge(&other.acked);
        self.ack_rpc.merge(&other.ack_rpc);
    }
}

/// Opens a Lease stream on `queue`. Awaiting this means the server has
/// accepted the stream, so a producer started afterwards finds it waiting.
pub async fn open(
    client: &Client,
    queue: &str,
    worker_id: String,
    capacity: u32,
) -> anyhow::Result<Streaming<LeaseEvent>> {
    client
        .lease([queue], worker_id, capacity, None)
        .await
        .context("cannot open a Lease stream")
}

/// Takes and acks jobs from `stream` until `shared.done`.
pub async fn work(
    client: Client,
    mut stream: Streaming<LeaseEvent>,
    shared: Arc<Shared>,
) -> anyhow::Result<WorkerStats> {
    let mut stats = WorkerStats::default();
    let mut acks = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            () = shared.done.cancelled() => break,
            Some(acked) = acks.next(), if !acks.is_empty() => {
                let (rpc, sent_age): (Duration, Option<Duration>) = acked?;
                stats.ack_rpc.record(rpc);
                if let Some(age) = sent_age {
                    stats.acked.record(age);
                }
                shared.acked_one();
            }
            event = stream.message() => {
                let event = event.context("Lease stream failed")?;
                match event.and_then(|e| e.event) {
                    Some(Event::Leased(leased)) => {
                        let job = leased.job.context("leased event without a job")?;
                        let mut sent = None;
                        if shared.stamped {
                            let age = stamp::age(&job.payload).context("payload without a stamp")?;
                            stats.delivered.record(age);
                            sent = Some(job.payload[..stamp::MIN_LEN].to_vec());
                        }
                        acks.push(ack(client.clone(), job.id, leased.lease_id, sent));
                    }
                    Some(Event::Revoked(r)) => {
                        bail!("the server revoked lease {} of job {}: {}", r.lease_id, r.job_id, r.reason)
                    }
                    None => bail!("the server ended a Lease stream"),
                }
            }
        }
    }
    // Dropping the stream here is the worker going away; every job it was
    // given has been acked, so the server has nothing to reclaim.
    Ok(stats)
}

/// Acks one job; returns the RPC's round trip and, for a stamped payload,
/// the time since its enqueue was sent.
async fn ack(
    client: Client,
    job_id: String,
    lease_id: String,
    sent: Option<Vec<u8>>,
) -> anyhow::Result<(Duration, Option<Duration>)> {
    let start = Instant::now();
    client
        .ack(job_id.as_str(), lease_id)
        .await
        .with_context(|| format!("ack of {job_id} failed"))?;
    let rpc = start.elapsed();
    Ok((rpc, sent.as_deref().and_then(stamp::age)))
}

/// Opens `n` Lease streams on `queue` (worker `i` on connection `i`) and
/// runs a worker on each; every stream is open when this returns.
pub async fn start(
    pool: &Pool,
    queue: &str,
    n: usize,
    capacity: u32,
    shared: &Arc<Shared>,
) -> anyhow::Result<JoinSet<anyhow::Result<WorkerStats>>> {
    let mut set = JoinSet::new();
    for i in 0..n {
        let client = pool.client(i);
        let stream = open(&client, queue, format!("{queue}-w{i}"), capacity).await?;
        set.spawn(work(client, stream, Arc::clone(shared)));
    }
    Ok(set)
}

/// Waits for the workers of [`start`] and merges what they measured.
pub async fn finish(set: JoinSet<anyhow::Result<WorkerStats>>) -> anyhow::Result<WorkerStats> {
    let mut all = WorkerStats::default();
    for stats in super::join_all(set).await? {
        all.merge(&stats);
    }
    Ok(all)
}
