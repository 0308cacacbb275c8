//! `jobq purge --queue Q [--status done|failed] [--finished-before TIME |
//! --older-than AGE]`: delete a queue's finished jobs.

use std::time::SystemTime;

use anyhow::Context;
use jobq_client::{pb, Client};
use serde_json::json;

use crate::output::Out;

/// A finished status as written on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "lower")]
pub enum Finished {
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

    /// Only DONE or only FAILED jobs; both when left out.
    #[arg(long, value_enum)]
    status: Option<Finished>,

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
        Finished::Done => pb::JobStatus::Done,
        Finished::Failed => pb::JobStatus::Failed,
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
