//! `jobq watch ID...`: each state of the jobs as it changes, until every
//! one is DONE or FAILED (the WatchJob RPC).

use futures::StreamExt;
use jobq_client::{pb, Client};

use crate::output::{
    job_json, or_dash, outcome_name, payload_display, progress_text, status_name, timestamp_text,
    Out,
};

/// Options of `jobq watch`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The jobs' ids.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,
}

/// Runs `jobq watch`: one line per state (with --json, the job as JSON,
/// one per line, without its payload). Exits 0 once every job is final,
/// 1 if one of them ended FAILED.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    // As the server writes ids (`042` is job 42).
    let mut open: std::collections::BTreeSet<String> = args
        .ids
        .iter()
        .map(|id| {
            id.parse::<u64>()
                .map_or_else(|_| id.clone(), |n| n.to_string())
        })
        .collect();
    let mut states = client.watch(args.ids).await?;
    let mut failed = Vec::new();
    while let Some(job) = states.next().await {
        let job = job?.into_proto();
        if job.status == pb::JobStatus::Failed as i32 {
            failed.push(job.id.clone());
        }
        if job.status == pb::JobStatus::Failed as i32 || job.status == pb::JobStatus::Done as i32 {
            open.remove(&job.id);
        }
        if out.json {
            out.json(&job_json(&job))?;
        } else {
            out.line(line(&job))?;
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("FAILED: job {}", failed.join(", "));
    }
    if !open.is_empty() {
        let open: Vec<_> = open.into_iter().collect();
        anyhow::bail!("the stream ended before job {} was final", open.join(", "));
    }
    Ok(())
}

/// `<time> <id> <STATUS> attempts N/M [progress P% <message>]
/// [<last outcome>: <error>] [result …]`, at the time of the latest of the
/// attempt's start or end and the progress report.
fn line(job: &pb::Job) -> String {
    let stamp = job
        .history
        .last()
        .and_then(|a| a.ended_at.as_ref().or(a.started_at.as_ref()))
        .or(job.enqueued_at.as_ref());
    let reported = job.progress.as_ref().and_then(|p| p.reported_at.as_ref());
    let when = match (stamp, reported) {
        (Some(s), Some(r)) if (r.seconds, r.nanos) > (s.seconds, s.nanos) => Some(r),
        (None, r) => r,
        (s, _) => s,
    };
    let mut text = format!(
        "{} {} {} attempts {}/{}",
        timestamp_text(when),
        job.id,
        status_name(job.status),
        job.attempts,
        job.max_attempts
    );
    if let Some(p) = &job.progress {
        text.push_str(&format!(" progress {}", progress_text(p)));
    }
    if let Some(last) = job.history.last().filter(|a| a.ended_at.is_some()) {
        text.push_str(&format!(
            " last {}: {}",
            outcome_name(last.outcome),
            or_dash(&last.error)
        ));
    }
    if !job.result.is_empty() {
        text.push_str(&format!(" result {}", payload_display(&job.result)));
    }
    text
}
