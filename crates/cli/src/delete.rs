//! `jobq delete ID...`: delete PENDING, DONE or FAILED jobs for good.

use anyhow::bail;
use jobq_client::Client;
use serde_json::json;

use crate::exit::client_error_text;
use crate::output::Out;

/// Options of `jobq delete`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The jobs to delete (not RUNNING ones: cancel those first).
    #[arg(required = true)]
    ids: Vec<String>,
}

/// Runs `jobq delete`: one line per id; exits 1 if any was refused.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    let mut errors = 0usize;
    for id in &args.ids {
        match client.delete_job(id.clone()).await {
            Ok(()) => {
                if out.json {
                    out.json(&json!({"id": id, "deleted": true}))?;
                } else {
                    out.line(format!("deleted job {id}"))?;
                }
            }
            Err(err) => {
                errors += 1;
                let text = client_error_text(&err);
                if out.json {
                    out.json(&json!({"id": id, "deleted": false, "error": text}))?;
                }
                eprintln!("error: {text} (job {id})");
            }
        }
    }
    if errors > 0 {
        bail!("{errors} of {} deletes failed", args.ids.len());
    }
    Ok(())
}
