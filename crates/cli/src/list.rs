//! `jobq list`: jobs by queue, status and key, paged through to `--limit`.

use jobq_client::{pb, Client};

use crate::output::{job_json, or_dash, status_name, timestamp_text, truncate, Out, Table};

/// Most jobs the server returns per page.
const MAX_PAGE: u32 = 1000;

/// A job status as written on the command line (any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "lower")]
pub enum Status {
    /// Waiting to be taken.
    Pending,
    /// Leased to a worker.
    Running,
    /// Acknowledged.
    Done,
    /// Dead letter.
    Failed,
}

impl From<Status> for pb::JobStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Pending => pb::JobStatus::Pending,
            Status::Running => pb::JobStatus::Running,
            Status::Done => pb::JobStatus::Done,
            Status::Failed => pb::JobStatus::Failed,
        }
    }
}

/// Options of `jobq list`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only jobs in this queue.
    #[arg(long)]
    queue: Option<String>,

    /// Only jobs with this status.
    #[arg(long, value_enum, ignore_case = true)]
    status: Option<Status>,

    /// Only the job with this domain key (give --queue too: keys are unique
    /// per queue).
    #[arg(long)]
    key: Option<String>,

    /// Most jobs to show; 0 shows all.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

/// The filters of a listing, as the server takes them.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Empty: all queues.
    pub queue: String,
    /// `None`: any status.
    pub status: Option<pb::JobStatus>,
    /// Empty: any key.
    pub key: String,
    /// Leave payloads out (a table does not show them, and a page of big
    /// jobs would otherwise be many megabytes).
    pub omit_payload: bool,
}

/// Fetches up to `limit` jobs (0: all) matching `filter`, following
/// `next_page_token` from page to page.
pub async fn fetch(client: &Client, filter: &Filter, limit: usize) -> anyhow::Result<Vec<pb::Job>> {
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let wanted = if limit == 0 {
            MAX_PAGE
        } else {
            u32::try_from(limit - jobs.len()).map_or(MAX_PAGE, |n| n.min(MAX_PAGE))
        };
        let page = client
            .list_jobs(pb::ListJobsRequest {
                queue: filter.queue.clone(),
                status: filter.status.map_or(0, |s| s as i32),
                key: filter.key.clone(),
                page_size: wanted,
                page_token,
                omit_payload: filter.omit_payload,
            })
            .await?;
        jobs.extend(page.jobs);
        if limit != 0 && jobs.len() >= limit {
            jobs.truncate(limit);
            break;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(jobs)
}

/// Runs `jobq list`.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    let filter = Filter {
        queue: args.queue.unwrap_or_default(),
        status: args.status.map(Into::into),
        key: args.key.unwrap_or_default(),
        // JSON shows payloads; the table does not, so it never fetches them.
        omit_payload: !out.json,
    };
    let jobs = fetch(client, &filter, args.limit).await?;
    if out.json {
        let all: Vec<_> = jobs.iter().map(job_json).collect();
        out.json(&serde_json::Value::Array(all))?;
        return Ok(());
    }
    let mut t = Table::new([
        "ID",
        "QUEUE",
        "KIND",
        "KEY",
        "STATUS",
        "ATTEMPTS",
        "PRIORITY",
        "ENQUEUED",
        "RUN_AT",
        "LAST_ERROR",
    ]);
    for job in &jobs {
        t.row([
            job.id.clone(),
            job.queue.clone(),
            job.kind.clone(),
            or_dash(&job.key),
            status_name(job.status).to_owned(),
            format!("{}/{}", job.attempts, job.max_attempts),
            job.priority.to_string(),
            timestamp_text(job.enqueued_at.as_ref()),
            timestamp_text(job.run_at.as_ref()),
            or_dash(&truncate(&job.last_error, 60)),
        ]);
    }
    out.table(&t)?;
    Ok(())
}
