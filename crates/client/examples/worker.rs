//! Sends order confirmation emails (here: prints them).
//! Run a server first (`jobq serve`), then:
//! `cargo run -p jobq-client --example worker`; Ctrl-C drains and stops.
use std::time::Duration;

use jobq_client::{HandlerError, JobContext, Worker};
use serde::Deserialize;

#[derive(Deserialize)]
struct Email {
    order: String,
    to: String,
}

async fn send_email(ctx: JobContext) -> Result<(), HandlerError> {
    // A payload that is not an `Email` dead-letters the job at once.
    let email: Email = ctx.json()?;
    if ctx.attempt() > 1 {
        // An earlier run may have sent it: a real handler checks by
        // email.order first (delivery is at least once).
    }
    println!(
        "sending the confirmation of {} to {}",
        email.order, email.to
    );
    Ok(())
}

#[tokio::main]
async fn main() -> jobq_client::Result<()> {
    // Without a subscriber, the worker logs nothing.
    tracing_subscriber::fmt::init();
    let url = std::env::var("JOBQ_SERVER").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    Worker::builder(url)
        .queues(["emails"])
        .capacity(4)
        .lease(Duration::from_secs(30))
        // SIGINT (Ctrl-C) and SIGTERM: take no more jobs, let running ones
        // finish and ack (for up to the drain timeout), then return.
        .handle_signals(true)
        .drain_timeout(Duration::from_secs(10))
        .handler("send-email", send_email)
        .build()
        .run()
        .await
}
