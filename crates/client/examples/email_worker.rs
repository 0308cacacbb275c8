//! A `send-email` worker that "sends" by appending to a mailbox file, one
//! line per email (`<order> <to>`, written with O_APPEND and fsync'd).
//!
//! It is idempotent on the order id: before sending, it checks the mailbox
//! for a line of that order. `--non-idempotent` skips the check, to show the
//! duplicate a redelivery causes.
//!
//! Payload: JSON `{"order": "order-4711", "to": "ada@example.com"}`
//! (`order_id` is accepted too; without an order the job's key is used).
//!
//! Stdout protocol, one line each, for tests to wait on:
//! - `READY` each time the Lease stream is established (again after a
//!   reconnect);
//! - `SENT <order>` after the email was recorded (fsync'd);
//! - `SKIP <order>` when the mailbox already had it (a redelivery);
//! - `STOPPED` after a graceful shutdown (SIGINT/SIGTERM) finished draining.
//!
//! With `--hang-after-send`, the handler hangs forever after printing
//! `SENT`, so a test can SIGKILL the process between send and ack.
//!
//! ```text
//! cargo run -p jobq-client --example email_worker -- \
//!     --server http://127.0.0.1:50051 --queue emails --mailbox /tmp/mailbox
//! ```

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use jobq_client::{HandlerError, JobContext, Worker};
use serde::Deserialize;

#[derive(Debug, Parser)]
#[command(about = "A send-email worker that records emails in a mailbox file")]
struct Args {
    /// The jobq server.
    #[arg(long, env = "JOBQ_SERVER", default_value = "http://127.0.0.1:50051")]
    server: String,
    /// Bearer token for a server with `--auth-tokens`.
    #[arg(long, env = "JOBQ_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA (PEM) of an `https://` server.
    #[arg(long, env = "JOBQ_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// The queue to take jobs from.
    #[arg(long, env = "JOBQ_QUEUE", default_value = "emails")]
    queue: String,
    /// The mailbox file (created if missing).
    #[arg(long, env = "EMAIL_MAILBOX")]
    mailbox: PathBuf,
    /// The worker id (default: generated).
    #[arg(long, env = "JOBQ_WORKER_ID")]
    worker_id: Option<String>,
    /// How many emails are sent at once.
    #[arg(long, env = "JOBQ_CAPACITY", default_value_t = 1)]
    capacity: u32,
    /// Lease duration, e.g. `30s`, `500ms`.
    #[arg(long, env = "JOBQ_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// Heartbeat interval (default: lease/3).
    #[arg(long, env = "JOBQ_HEARTBEAT", value_parser = humantime::parse_duration)]
    heartbeat: Option<Duration>,
    /// How long in-flight sends may finish after SIGTERM.
    #[arg(long, env = "JOBQ_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Pretend sending takes this long (before the email is recorded).
    #[arg(long, env = "EMAIL_SEND_DELAY", default_value = "0s", value_parser = humantime::parse_duration)]
    send_delay: Duration,
    /// Skip the already-sent check (demonstrates duplicates).
    #[arg(long, env = "EMAIL_NON_IDEMPOTENT")]
    non_idempotent: bool,
    /// After recording an email and printing `SENT`, hang forever (never ack).
    #[arg(long, env = "EMAIL_HANG_AFTER_SEND")]
    hang_after_send: bool,
}

/// The job's payload.
#[derive(Debug, Deserialize)]
struct Email {
    #[serde(alias = "order_id")]
    order: Option<String>,
    to: Option<String>,
}

/// The mailbox file. One lock for check-then-append, so two jobs of the same
/// order in this process cannot both pass the check.
#[derive(Debug, Clone)]
struct Mailbox {
    path: PathBuf,
    lock: Arc<Mutex<()>>,
}

impl Mailbox {
    /// Records the email unless `idempotent` and the order is already in the
    /// mailbox; returns whether it was recorded.
    async fn send(&self, order: String, to: String, idempotent: bool) -> io::Result<bool> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = this.lock.lock().unwrap_or_else(|p| p.into_inner());
            if idempotent && this.contains(&order)? {
                return Ok(false);
            }
            let mut file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&this.path)?;
            file.write_all(format!("{order} {to}\n").as_bytes())?;
            file.sync_all()?;
            Ok(true)
        })
        .await?
    }

    fn contains(&self, order: &str) -> io::Result<bool> {
        match fs::read_to_string(&self.path) {
            Ok(text) => Ok(text
                .lines()
                .any(|line| line.split_whitespace().next() == Some(order))),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(err),
        }
    }
}

async fn send_email(
    ctx: JobContext,
    args: Arc<Args>,
    mailbox: Mailbox,
) -> Result<(), HandlerError> {
    // A payload that does not decode is fatal: the job is dead-lettered.
    let email: Email = ctx.json()?;
    let order = email
        .order
        .or_else(|| ctx.key().map(str::to_owned))
        .ok_or_else(|| HandlerError::fatal("payload has no order and the job has no key"))?;
    let to = email
        .to
        .unwrap_or_else(|| "customer@example.com".to_owned());
    if !args.send_delay.is_zero() {
        tokio::time::sleep(args.send_delay).await;
    }
    let sent = mailbox
        .send(order.clone(), to, !args.non_idempotent)
        .await
        .map_err(|e| HandlerError::retry(format!("mailbox: {e}")))?;
    if sent {
        println!("SENT {order}");
    } else {
        tracing::info!(order, attempt = ctx.attempt(), "already sent; skipping");
        println!("SKIP {order}");
    }
    if args.hang_after_send {
        std::future::pending::<()>().await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .init();
    let args = Arc::new(Args::parse());
    let mailbox = Mailbox {
        path: args.mailbox.clone(),
        lock: Arc::default(),
    };
    let mut builder = Worker::builder(args.server.as_str())
        .queues([args.queue.as_str()])
        .capacity(args.capacity)
        .lease(args.lease)
        .drain_timeout(args.drain_timeout)
        .handle_signals(true)
        .on_ready(|| println!("READY"));
    if let Some(id) = &args.worker_id {
        builder = builder.worker_id(id);
    }
    if let Some(token) = &args.token {
        builder = builder.token(token.as_str());
    }
    if let Some(ca) = &args.ca_cert {
        builder = builder.ca_cert(fs::read(ca)?);
    }
    if let Some(every) = args.heartbeat {
        builder = builder.heartbeat_every(every);
    }
    let handler_args = Arc::clone(&args);
    let worker = builder
        .handler("send-email", move |ctx| {
            send_email(ctx, Arc::clone(&handler_args), mailbox.clone())
        })
        .build();
    tracing::info!(worker.id = worker.worker_id(), queue = %args.queue, "starting");
    worker.run().await?;
    println!("STOPPED");
    Ok(())
}
