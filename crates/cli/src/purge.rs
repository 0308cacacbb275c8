//! `jobq purge --queue Q [--status done|failed] [--finished-before TIME |
//! --older-than AGE]`: delete a queue's finished jobs; `jobq purge --queue
//! Q --status pending`: delete its PENDING jobs.

use std::time::SystemTime;

use anyhow::Context;
use jobq_client::{pb, Client};
use serde_json::json;

use crate::output::Out;

/// A status that can be purged, as written on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "lower")]
pub enum Purgeable {
    /// Every PENDING job of the queue (due or delayed) when the purge
    /// begins; jobs enqueued meanwhile stay. Not with --finished-before or
    /// --older-than.
    Pending,
    /// Acknowledged jobs.
    Done,
    /// Dead letters.
    Failed,
}

/// Options of `jobq purge`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The queue to purge.
    #[arg(long)]
    queue: String,

    /// Only DONE or only FAILED jobs (both when left out), or the PENDING
    /// jobs instead. RUNNING jobs are never purged.
    #[arg(long, value_enum)]
    status: Option<Purgeable>,

    /// Only jobs that finished before this time (RFC 3339, e.g.
    /// 2026-12-01T00:00:00Z). Default: now.
    #[arg(long, conflicts_with = "older_than", value_parser = humantime::parse_rfc3339_weak)]
    finished_before: Option<SystemTime>,

    /// Only jobs that finished longer ago than this (e.g. 7d, 12h).
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<std::time::Duration>,
}

/// Runs `jobq purge` and prints how many jobs went.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    if args.status == Some(Purgeable::Pending)
        && (args.finished_before.is_some() || args.older_than.is_some())
    {
        return Err(crate::cli::usage(
            "--finished-before and --older-than apply to DONE and FAILED jobs: a PENDING job has not finished (--status pending purges every PENDING job of the queue)",
        ));
    }
    let before = match (args.finished_before, args.older_than) {
        (Some(t), _) => Some(t),
        (None, Some(age)) => Some(
            SystemTime::now()
                .checked_sub(age)
                .context("--older-than reaches before 1970")?,
        ),
        (None, None) => None,
    };
    let status = args.status.map(|s| match s {
        Purgeable::Pending => pb::JobStatus::Pending,
        Purgeable::Done => pb::JobStatus::Done,
        Purgeable::Failed => pb::JobStatus::Failed,
    });
    let deleted = client
        .purge_jobs(args.queue.clone(), status, before)
        .await?;
    if out.json {
        out.json(&json!({"queue": args.queue, "deleted": deleted}))?;
    } else {
        out.line(format!("deleted {deleted} jobs from queue {}", args.queue))?;
    }
    Ok(())
}
