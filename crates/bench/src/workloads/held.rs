//! C over a held backlog: what the jobs a queue policy holds back cost the
//! next customer's job. Before C runs, `--held-jobs` PENDING jobs go into
//! `--held-groups` groups of its queue, whose policy runs one job per
//! group at a time (`group_max_running = 1`), and one job of each group is
//! taken and kept (a Dequeue with a long lease, never acked): every group
//! is full, so every other job of the backlog is held. Then C runs (own
//! connections, capacity 1), each job in a group of its own, so each one
//! is free to go the moment it is enqueued, past a million that are not.

use std::time::Duration;

use anyhow::Context;
use jobq_client::{EnqueueOptions, QueuePolicy};

use super::{latency, KIND};
use crate::{pool::Pool, progress::Progress, BenchArgs, Outcome, Workload};

/// Jobs per EnqueueBatch of the backlog.
const FILL_BATCH: u64 = 1_000;

/// How long the kept jobs' leases last: the whole run.
const HOLD: Duration = Duration::from_secs(3_600);

/// Runs c-held.
pub async fn run(
    workload: Workload,
    args: &BenchArgs,
    pool: &Pool,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    let queue = pool.queue_for(workload.name()).await?;
    let client = pool.client(0);
    let mut policy = QueuePolicy::new().group_max_running(1);
    if args.policy_max_running > 0 {
        policy = policy.max_running(args.policy_max_running);
    }
    client
        .set_queue_policy(queue.clone(), policy)
        .await
        .context("cannot set the held queue's policy")?;
    let bar = progress.bar("held-backlog fill", args.held_jobs);
    let mut next = 0;
    while next < args.held_jobs {
        let end = (next + FILL_BATCH).min(args.held_jobs);
        let batch = (next..end)
            .map(|i| {
                EnqueueOptions::new()
                    .group(format!("held-{}", i % args.held_groups))
                    .into_request(queue.as_str(), KIND, Vec::new())
            })
            .collect();
        let results = client.enqueue_batch(batch).await.context("backlog fill")?;
        anyhow::ensure!(
            results.iter().all(|r| r.error_code == 0),
            "a backlog job was refused"
        );
        bar.inc(end - next);
        next = end;
    }
    bar.finish_and_clear();
    // One running job per group: the rest of each group waits for it.
    for _ in 0..args.held_groups.min(args.held_jobs) {
        client
            .dequeue([queue.as_str()], "bench-holder", Some(HOLD), None)
            .await
            .context("backlog hold")?
            .context("a group's first job was not handed out")?;
    }
    let outcome = latency::run_on(workload, args, pool, progress, &queue, |seq| {
        EnqueueOptions::new().group(format!("fresh-{seq}"))
    })
    .await?;
    Ok(outcome
        .param("held_jobs", args.held_jobs)
        .param("held_groups", args.held_groups))
}
