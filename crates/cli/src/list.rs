//! `jobq list`: jobs by queue, status and key, paged through to `--limit`;
//! when more match, stderr says so and names the `--page-token` for the
//! rest.

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

    /// Start after the jobs already shown: the token a listing cut short by
    /// --limit printed on stderr.
    #[arg(long, value_name = "TOKEN")]
    page_token: Option<String>,
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

/// Up to `limit` jobs of a listing, and where to continue when more match.
#[derive(Debug, Default)]
pub struct Fetched {
    /// The jobs, in id order.
    pub jobs: Vec<pb::Job>,
    /// Set when `limit` cut the listing short: the page token that lists
    /// the rest.
    pub more: Option<String>,
}

/// Fetches up to `limit` jobs (0: all) matching `filter`, starting at
/// `page_token` (empty: the first job), following `next_page_token` from
/// page to page.
pub async fn fetch(
    client: &Client,
    filter: &Filter,
    limit: usize,
    mut page_token: String,
) -> anyhow::Result<Fetched> {
    let mut jobs = Vec::new();
    loop {
        // Never ask for more than is still wanted: then a page never has to
        // be cut, and its next_page_token is exactly where the rest starts.
        let wanted = if limit == 0 {
            MAX_PAGE
        } else {
            u32::try_from(limit - jobs.len()).map_or(MAX_PAGE, |n| n.min(MAX_PAGE))
        };
        let page = client
            .list_jobs(pb::ListJobsRequest {
                page_size: wanted,
                page_token,
                ..request(filter)
            })
            .await?;
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            return Ok(Fetched { jobs, more: None });
        }
        if limit != 0 && jobs.len() >= limit {
            jobs.truncate(limit);
            // A full page has a token even when nothing more matches (the
            // server stops at the count); one job of the rest settles it.
            let rest = client
                .list_jobs(pb::ListJobsRequest {
                    page_size: 1,
                    page_token: page.next_page_token.clone(),
                    omit_payload: true,
                    ..request(filter)
                })
                .await?;
            // A page can come back empty yet not be the last (a job that
            // stopped matching between the server's two reads): its token
            // says so too.
            let more = (!rest.jobs.is_empty() || !rest.next_page_token.is_empty())
                .then_some(page.next_page_token);
            return Ok(Fetched { jobs, more });
        }
        page_token = page.next_page_token;
    }
}

/// The request for `filter`'s first page.
fn request(filter: &Filter) -> pb::ListJobsRequest {
    pb::ListJobsRequest {
        queue: filter.queue.clone(),
        status: filter.status.map_or(0, |s| s as i32),
        key: filter.key.clone(),
        omit_payload: filter.omit_payload,
        ..Default::default()
    }
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
    let Fetched { jobs, more } = fetch(
        client,
        &filter,
        args.limit,
        args.page_token.unwrap_or_default(),
    )
    .await?;
    if let Some(token) = &more {
        // On stderr, so stdout stays a table or one JSON array.
        eprintln!(
            "more jobs match than the {} shown; continue with --page-token {token}, or show all with --limit 0",
            jobs.len()
        );
    }
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
