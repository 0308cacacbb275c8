//! `jobq cancel ID --reason …`: stop a PENDING or RUNNING job (FAILED,
//! "cancelled: <reason>"); a running one's worker is told to stop.

use jobq_client::Client;
use serde_json::json;

use crate::output::{status_name, Out, Table};

/// Options of `jobq cancel`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The job to cancel.
    id: String,

    /// Why; the job's last_error becomes "cancelled: <reason>".
    #[arg(long, default_value = "")]
    reason: String,
}

/// Runs `jobq cancel`.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    let job = client.cancel_job(args.id, args.reason).await?;
    if out.json {
        out.json(&json!({
            "id": job.id,
            "status": status_name(job.status),
            "last_error": job.last_error,
        }))?;
    } else {
        let mut t = Table::new(["ID", "STATUS", "LAST ERROR"]);
        t.row([
            job.id.clone(),
            status_name(job.status).to_owned(),
            job.last_error.clone(),
        ]);
        out.table(&t)?;
    }
    Ok(())
}
