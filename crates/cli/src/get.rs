//! `jobq get ID`: one job, with its attempt history.

use jobq_client::{pb, Client};

use crate::output::{
    job_json, or_dash, outcome_name, payload_display, progress_text, status_name, timestamp_text,
    Out, Table,
};

/// Options of `jobq get`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job's id.
    id: String,
}

/// Runs `jobq get`.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    let job = client.get_job(args.id).await?;
    if out.json {
        out.json(&job_json(&job))?;
    } else {
        out.table(&fields(&job))?;
        out.line("")?;
        if job.history.is_empty() {
            out.line("no attempts yet")?;
        } else {
            out.table(&history(&job))?;
        }
    }
    Ok(())
}

/// The job's fields as a two-column table.
fn fields(job: &pb::Job) -> Table {
    let mut t = Table::new(["FIELD", "VALUE"]);
    let rows = [
        ("id", job.id.clone()),
        ("queue", job.queue.clone()),
        ("kind", job.kind.clone()),
        ("key", or_dash(&job.key)),
        ("status", status_name(job.status).to_owned()),
        ("attempts", format!("{}/{}", job.attempts, job.max_attempts)),
        ("snoozes", format!("{}/{}", job.snoozes, job.max_snoozes)),
        ("priority", job.priority.to_string()),
        ("group", or_dash(&job.group)),
        ("enqueued_at", timestamp_text(job.enqueued_at.as_ref())),
        ("run_at", timestamp_text(job.run_at.as_ref())),
        ("taken_at", timestamp_text(job.taken_at.as_ref())),
        (
            "lease_expires_at",
            timestamp_text(job.lease_expires_at.as_ref()),
        ),
        ("finished_at", timestamp_text(job.finished_at.as_ref())),
        ("worker_id", or_dash(&job.worker_id)),
        ("last_error", or_dash(&job.last_error)),
        ("payload", payload_display(&job.payload)),
    ];
    for (name, value) in rows {
        t.row([name.to_owned(), value]);
    }
    if let Some(p) = &job.progress {
        t.row(["progress".to_owned(), progress_text(p)]);
        t.row([
            "progress_at".to_owned(),
            timestamp_text(p.reported_at.as_ref()),
        ]);
    }
    if !job.result.is_empty() {
        t.row(["result".to_owned(), payload_display(&job.result)]);
    }
    let mut metadata: Vec<_> = job.metadata.iter().collect();
    metadata.sort();
    for (key, value) in metadata {
        t.row([format!("metadata.{key}"), value.clone()]);
    }
    t
}

/// One row per attempt, oldest first.
fn history(job: &pb::Job) -> Table {
    let mut t = Table::new(["#", "WORKER", "STARTED", "ENDED", "OUTCOME", "ERROR"]);
    for (i, a) in job.history.iter().enumerate() {
        t.row([
            (i + 1).to_string(),
            or_dash(&a.worker_id),
            timestamp_text(a.started_at.as_ref()),
            timestamp_text(a.ended_at.as_ref()),
            outcome_name(a.outcome).to_owned(),
            or_dash(&a.error),
        ]);
    }
    t
}
