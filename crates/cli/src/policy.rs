//! `jobq policy QUEUE`: show a queue's policy, or change it (how many of
//! its jobs run at once, over every server and per group).

use jobq_client::{Client, QueuePolicy};
use serde_json::json;

use crate::output::Out;

/// Options of `jobq policy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The queue.
    queue: String,

    /// At most N of the queue's jobs RUNNING at once, over every server
    /// (0: no limit).
    #[arg(long, value_name = "N")]
    max_running: Option<u32>,

    /// At most N RUNNING jobs of one group (`enqueue --group`) at once; 1
    /// runs each group's jobs one at a time, in enqueue order (0: no
    /// limit).
    #[arg(long, value_name = "N")]
    group_max_running: Option<u32>,

    /// Remove the queue's policy.
    #[arg(long, conflicts_with_all = ["max_running", "group_max_running"])]
    clear: bool,
}

/// Runs `jobq policy`: the limits given change, the others stay.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    let changes = args.clear || args.max_running.is_some() || args.group_max_running.is_some();
    let policy = if changes {
        let mut policy = if args.clear {
            QueuePolicy::new()
        } else {
            client.queue_policy(args.queue.clone()).await?
        };
        if let Some(n) = args.max_running {
            policy = policy.max_running(n);
        }
        if let Some(n) = args.group_max_running {
            policy = policy.group_max_running(n);
        }
        client.set_queue_policy(args.queue.clone(), policy).await?;
        policy
    } else {
        client.queue_policy(args.queue.clone()).await?
    };
    if out.json {
        out.json(&json!({
            "queue": args.queue,
            "max_running": policy.max_running,
            "group_max_running": policy.group_max_running,
        }))?;
    } else if policy.is_empty() {
        out.line(format!("queue {}: no policy", args.queue))?;
    } else {
        out.line(format!("queue {}: {}", args.queue, describe(&policy)))?;
    }
    Ok(())
}

/// The policy in words, as `jobq stats` shows it: `max_running=10
/// group_max_running=1`; `-` for none.
pub fn describe(policy: &QueuePolicy) -> String {
    let mut parts = Vec::new();
    if policy.max_running > 0 {
        parts.push(format!("max_running={}", policy.max_running));
    }
    if policy.group_max_running > 0 {
        parts.push(format!("group_max_running={}", policy.group_max_running));
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(" ")
    }
}
