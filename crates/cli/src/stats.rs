//! `jobq stats`: per queue, the count in each status and how long the oldest
//! due job has waited; `--watch` refreshes until Ctrl-C.

use std::io::IsTerminal;
use std::time::Duration;

use jobq_client::{pb, Client};
use serde_json::json;

use crate::output::{duration_text, std_duration, Out, Table};

/// Options of `jobq stats`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,

    /// Refresh every INTERVAL (default 2s) until Ctrl-C. With --json, one
    /// JSON document per refresh, one per line.
    #[arg(
        long,
        value_name = "INTERVAL",
        num_args = 0..=1,
        default_missing_value = "2s",
        value_parser = humantime::parse_duration
    )]
    watch: Option<Duration>,
}

/// Runs `jobq stats`.
pub async fn run(conn: &crate::conn::Conn, out: Out, args: Args) -> anyhow::Result<()> {
    let Some(every) = args.watch else {
        return show(&conn.client().await?, out, args.queue.as_deref(), false).await;
    };
    // Connected on each refresh as needed: the watch outlives a restart.
    let client = &conn.lazy_client()?;
    let every = every.max(Duration::from_millis(100));
    let shutdown = crate::shutdown::on_signal();
    let clear = !out.json && std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        match show(client, out, args.queue.as_deref(), clear).await {
            Ok(()) => {}
            // A server restarting or out of reach: say so and keep
            // refreshing, as `watch` would.
            Err(err) if is_transient(&err) => {
                eprintln!(
                    "jobq stats: {err:#}; retrying in {}",
                    duration_text(Some(every))
                );
            }
            Err(err) => return Err(err),
        }
    }
}

/// A refresh that may work next time: no server reply, or one that says
/// it is unavailable.
fn is_transient(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<jobq_client::Error>()
            .is_some_and(jobq_client::Error::is_transient)
    })
}

async fn show(client: &Client, out: Out, queue: Option<&str>, clear: bool) -> anyhow::Result<()> {
    let stats = client.stats(queue).await?;
    if out.json {
        out.json(&stats_json(&stats))?;
        return Ok(());
    }
    if clear {
        // Clear the screen and home the cursor, like `watch`.
        out.raw("\x1b[2J\x1b[H")?;
    }
    let mut t = Table::new([
        "QUEUE",
        "PENDING",
        "RUNNING",
        "DONE",
        "FAILED",
        "OLDEST_PENDING",
        "PAUSED",
        "HELD",
        "POLICY",
    ]);
    for q in &stats {
        t.row([
            q.queue.clone(),
            q.pending.to_string(),
            q.running.to_string(),
            q.done.to_string(),
            q.failed.to_string(),
            duration_text(std_duration(q.oldest_pending_age.as_ref())),
            if q.paused { "yes" } else { "no" }.to_owned(),
            (q.held_max_running + q.held_group_max_running + q.held_rate + q.held_group_rate)
                .to_string(),
            crate::policy::describe(&q.policy.map(Into::into).unwrap_or_default()),
        ]);
    }
    out.table(&t)?;
    Ok(())
}

/// `[{"queue", "pending", "running", "done", "failed",
/// "oldest_pending_age_secs" (a number, or null when nothing is due),
/// "paused", "policy": {"max_running", "group_max_running", "rate_per_sec"
/// (null: none)},
/// "held": {"max_running", "group_max_running", "rate", "group_rate"}}]`.
fn stats_json(stats: &[pb::QueueStats]) -> serde_json::Value {
    stats
        .iter()
        .map(|q| {
            json!({
                "queue": q.queue,
                "pending": q.pending,
                "running": q.running,
                "done": q.done,
                "failed": q.failed,
                "oldest_pending_age_secs":
                    std_duration(q.oldest_pending_age.as_ref()).map(|d| d.as_secs_f64()),
                "paused": q.paused,
                "policy": {
                    "max_running": q.policy.as_ref().map_or(0, |p| p.max_running),
                    "group_max_running": q.policy.as_ref().map_or(0, |p| p.group_max_running),
                    "rate_per_sec": q.policy.as_ref().and_then(|p| p.rate.as_ref()).map(|r| {
                        let per = std_duration(r.per.as_ref()).unwrap_or_default();
                        f64::from(r.limit) / per.as_secs_f64().max(1e-9)
                    }),
                },
                "held": {
                    "max_running": q.held_max_running,
                    "group_max_running": q.held_group_max_running,
                    "rate": q.held_rate,
                    "group_rate": q.held_group_rate,
                },
            })
        })
        .collect()
}
