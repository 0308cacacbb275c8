//! `jobq schedule add|list|rm`: jobs enqueued on a cron schedule.

use anyhow::Context;
use jobq_client::{pb, Client};
use serde_json::{json, Value};

use crate::output::{or_dash, payload_display, timestamp_json, timestamp_text, Out, Table};

/// Options of `jobq schedule`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Create a schedule (or replace the one of the same name): each tick
    /// of CRON enqueues one job keyed `schedule:NAME:<tick time>`.
    Add(AddArgs),
    /// List the schedules with their next run times.
    List,
    /// Delete a schedule: no further ticks (its jobs stay).
    Rm(RmArgs),
}

#[derive(Debug, clap::Args)]
struct AddArgs {
    /// The schedule's name (at most 64 characters of A-Z a-z 0-9 . _ : -).
    name: String,
    /// The queue its jobs go to.
    queue: String,
    /// Their kind.
    kind: String,
    /// A cron expression: 5 fields, 6 with leading seconds, or 7 with a
    /// trailing year ("0 3 * * *" is 03:00 daily; "*/10 * * * * *" every
    /// 10 seconds).
    #[arg(long)]
    cron: String,
    /// The IANA time zone the expression is read in (default UTC).
    #[arg(long, default_value = "")]
    timezone: String,
    /// The payload of each job.
    #[arg(long, default_value = "")]
    payload: String,
    /// Attempts each job gets (default: the server's).
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_attempts: u32,
}

#[derive(Debug, clap::Args)]
struct RmArgs {
    /// The schedule's name.
    name: String,
}

/// Runs `jobq schedule`.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Add(a) => {
            let req = pb::CreateScheduleRequest {
                name: a.name,
                queue: a.queue,
                kind: a.kind,
                payload: a.payload.into_bytes(),
                cron: a.cron,
                timezone: a.timezone,
                max_attempts: a.max_attempts,
            };
            let reply = client.inner().create_schedule(req).await?.into_inner();
            let s = reply.schedule.context("the reply has no schedule")?;
            if out.json {
                out.json(&schedule_json(&s))?;
            } else {
                out.line(format!(
                    "schedule {} next runs at {}",
                    s.name,
                    timestamp_text(s.next_run_at.as_ref())
                ))?;
            }
        }
        Command::List => {
            let reply = client
                .inner()
                .list_schedules(pb::ListSchedulesRequest {})
                .await?
                .into_inner();
            if out.json {
                let all: Vec<Value> = reply.schedules.iter().map(schedule_json).collect();
                out.json(&Value::Array(all))?;
            } else {
                let mut t = Table::new([
                    "NAME", "QUEUE", "KIND", "CRON", "TIMEZONE", "NEXT_RUN", "LAST_RUN",
                ]);
                for s in &reply.schedules {
                    t.row([
                        s.name.clone(),
                        s.queue.clone(),
                        s.kind.clone(),
                        s.cron.clone(),
                        or_dash(&s.timezone),
                        timestamp_text(s.next_run_at.as_ref()),
                        timestamp_text(s.last_run_at.as_ref()),
                    ]);
                }
                out.table(&t)?;
            }
        }
        Command::Rm(a) => {
            client
                .inner()
                .delete_schedule(pb::DeleteScheduleRequest {
                    name: a.name.clone(),
                })
                .await?;
            if out.json {
                out.json(&json!({"name": a.name, "deleted": true}))?;
            } else {
                out.line(format!("deleted schedule {}", a.name))?;
            }
        }
    }
    Ok(())
}

fn schedule_json(s: &pb::Schedule) -> Value {
    json!({
        "name": s.name,
        "queue": s.queue,
        "kind": s.kind,
        "payload": payload_display(&s.payload),
        "cron": s.cron,
        "timezone": s.timezone,
        "max_attempts": s.max_attempts,
        "next_run_at": timestamp_json(s.next_run_at.as_ref()),
        "last_run_at": timestamp_json(s.last_run_at.as_ref()),
        "created_at": timestamp_json(s.created_at.as_ref()),
    })
}
