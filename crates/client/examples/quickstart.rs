//! The quick start: enqueue one job, then work it. Run a server first
//! (`jobq serve`), then `cargo run -p jobq-client --example quickstart`.
use jobq_client::{Client, EnqueueOptions, HandlerError, JobContext, Worker};
use serde_json::{json, Value};

const SERVER: &str = "http://127.0.0.1:50051";

async fn send_email(ctx: JobContext) -> Result<(), HandlerError> {
    let email: Value = ctx.json()?;
    // Delivery is at least once: a real handler first checks whether this
    // order's email was already sent. Ok acks the job; Err fails it.
    println!("attempt {}: sending {email}", ctx.attempt());
    Ok(())
}

#[tokio::main]
async fn main() -> jobq_client::Result<()> {
    // Producer. The key makes a retried enqueue safe: no second job.
    let client = Client::connect(SERVER).await?;
    let email = json!({"order": "order-4711", "to": "ada@example.com"});
    let options = EnqueueOptions::new().key("order-4711");
    let added = client
        .submit_json("emails", "send-email", &email, options)
        .await?;
    println!("job {} created: {}", added.job.id, added.created);

    // Worker: leases jobs, heartbeats them, acks or fails; Ctrl-C drains.
    Worker::builder(client)
        .queues(["emails"])
        .handler("send-email", send_email)
        .handle_signals(true)
        .build()
        .run()
        .await
}
