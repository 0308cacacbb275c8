//! `jobq pause QUEUE` and `jobq resume QUEUE`: stop and restart handing out
//! a queue's jobs (enqueues go on; running jobs finish).

use jobq_client::Client;
use serde_json::json;

use crate::output::Out;

/// Options of `jobq pause` and `jobq resume`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The queue.
    queue: String,
}

/// Runs `jobq pause` (`paused = true`) or `jobq resume`.
pub async fn run(client: &Client, out: Out, args: Args, paused: bool) -> anyhow::Result<()> {
    if paused {
        client.pause_queue(args.queue.clone()).await?;
    } else {
        client.resume_queue(args.queue.clone()).await?;
    }
    if out.json {
        out.json(&json!({"queue": args.queue, "paused": paused}))?;
    } else {
        let word = if paused { "paused" } else { "resumed" };
        out.line(format!("{word} queue {}", args.queue))?;
    }
    Ok(())
}
