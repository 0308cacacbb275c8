//! Enqueues an order's confirmation email, then looks the job up.
//! Run a server first (`jobq serve`), then:
//! `cargo run -p jobq-client --example producer`
use futures::TryStreamExt;
use jobq_client::{Client, EnqueueOptions, JobFilter, NewJob, Status};
use serde::Serialize;

#[derive(Serialize)]
struct Email {
    order: String,
    to: String,
}

#[tokio::main]
async fn main() -> jobq_client::Result<()> {
    // Without a subscriber, the client logs nothing.
    tracing_subscriber::fmt::init();
    let url = std::env::var("JOBQ_SERVER").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let client = Client::connect(url).await?;

    // The key makes a retried enqueue safe: the second one returns the
    // first job with `created == false`.
    let email = Email {
        order: "order-4711".into(),
        to: "ada@example.com".into(),
    };
    let added = client
        .submit_json(
            "emails",
            "send-email",
            &email,
            EnqueueOptions::new().key("order-4711"),
        )
        .await?;
    println!(
        "{} created={} status={}",
        added.job.id, added.created, added.job.status
    );

    // Many jobs at once, durable together; each entry succeeds or not.
    let mut batch = Vec::new();
    for i in 1..=3 {
        let email = Email {
            order: format!("order-{i}"),
            to: "bob@example.com".into(),
        };
        let opts = EnqueueOptions::new().key(format!("order-{i}"));
        batch.push(NewJob::json("emails", "send-email", &email)?.options(opts));
    }
    for result in client.submit_batch(batch).await? {
        match result {
            Ok(added) => println!("{} created={}", added.job.id, added.created),
            Err(rejected) => eprintln!("{rejected}"),
        }
    }

    let job = client.job(added.job.id).await?;
    println!(
        "attempts {}/{}, enqueued at {:?}",
        job.attempts, job.max_attempts, job.enqueued_at
    );

    // Every dead letter of the queue, page after page.
    let mut dead = client.list_all(JobFilter::new().queue("emails").status(Status::Failed));
    while let Some(job) = dead.try_next().await? {
        println!("dead: {} {:?}", job.id, job.last_error);
    }
    for q in client.queue_stats(Some("emails")).await? {
        println!("{}: {} pending, {} failed", q.queue, q.pending, q.failed);
    }
    Ok(())
}
