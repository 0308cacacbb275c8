//! `jobq retry`: bring FAILED jobs (dead letters) back to PENDING, by id or
//! every one in a queue.

use anyhow::bail;
use jobq_client::{pb, Client};
use serde_json::json;

use crate::exit::client_error_text;
use crate::list::{fetch, Filter};
use crate::output::{status_name, Out, Table};
use jobq::code_name;

/// Options of `jobq retry`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["ids", "all_failed"])))]
pub struct Args {
    /// The jobs to retry.
    ids: Vec<String>,

    /// Retry every FAILED job in --queue.
    #[arg(long, requires = "queue", conflicts_with = "ids")]
    all_failed: bool,

    /// The queue for --all-failed.
    #[arg(long, requires = "all_failed")]
    queue: Option<String>,
}

/// Runs `jobq retry`.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    let ids = match (&args.queue, args.all_failed) {
        (Some(queue), true) => {
            let filter = Filter {
                queue: queue.clone(),
                status: Some(pb::JobStatus::Failed),
                key: String::new(),
                // Only the ids are needed.
                omit_payload: true,
            };
            // Collect first, then retry: the listing is in id order and a
            // retried job could fail again while we page.
            fetch(client, &filter, 0, String::new())
                .await?
                .jobs
                .into_iter()
                .map(|job| job.id)
                .collect()
        }
        _ => args.ids,
    };
    let bulk = args.all_failed;
    let mut t = Table::new(["ID", "RESULT"]);
    let (mut retried, mut errors) = (0usize, 0usize);
    for id in &ids {
        match client.retry(id.clone()).await {
            Ok(job) => {
                retried += 1;
                if out.json {
                    out.json(&json!({"id": id, "status": status_name(job.status)}))?;
                } else {
                    t.row([id.clone(), status_name(job.status).to_owned()]);
                }
            }
            Err(err) => {
                errors += 1;
                let text = client_error_text(&err);
                if out.json {
                    let (code, message) = match &err {
                        jobq_client::Error::Status(s) => {
                            (Some(code_name(s.code())), s.message().to_owned())
                        }
                        jobq_client::Error::NoReply { code, .. } => {
                            (Some(code_name(*code)), err.to_string())
                        }
                        other => (None, other.to_string()),
                    };
                    out.json(&json!({"id": id, "error": {"code": code, "message": message}}))?;
                } else {
                    t.row([id.clone(), format!("error: {text}")]);
                }
                // One line per failed id on stderr too, so scripts that only
                // watch stderr see it.
                eprintln!("error: {text} (job {id})");
            }
        }
    }
    if !out.json && !t.is_empty() {
        out.table(&t)?;
    }
    if bulk {
        let summary = format!("retried {retried} of {} failed jobs", ids.len());
        if out.json {
            out.json(&json!({"retried": retried, "errors": errors, "found": ids.len()}))?;
        } else {
            out.line(summary)?;
        }
    }
    if errors > 0 {
        bail!("{errors} of {} retries failed", ids.len());
    }
    Ok(())
}
