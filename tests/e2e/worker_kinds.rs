//! Typed job kinds through a real server: a producer submits a `JobKind`,
//! a worker built with `job_with_state` takes it from the kind's own queue
//! (no `queues` call), gets the decoded payload and the shared state, and
//! acks; a payload that does not decode as the kind is dead-lettered.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use jobq::pb;
use jobq_client::{EnqueueOptions, HandlerError, JobContext, JobKind, Worker};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::harness::{until, TestServer};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SendConfirmation {
    order: String,
    to: String,
}

impl JobKind for SendConfirmation {
    const QUEUE: &'static str = "emails";
    const KIND: &'static str = "send-email";
}

/// The application's state: the mailbox of sent confirmations.
#[derive(Default)]
struct Mailer {
    sent: Mutex<Vec<String>>,
}

#[tokio::test]
async fn a_typed_kind_goes_from_submit_kind_to_its_handler_with_the_state() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let email = SendConfirmation {
        order: "order-4711".into(),
        to: "ada@example.com".into(),
    };
    let added = c
        .submit_kind(&email, EnqueueOptions::new().key("order-4711"))
        .await
        .expect("submit");
    assert_eq!(
        (added.job.queue.as_str(), added.job.kind.as_str()),
        ("emails", "send-email")
    );
    // Not decodable as the kind: dead-lettered at once, not retried.
    let (bad, _) = c
        .enqueue(
            "emails",
            "send-email",
            "{\"order\": 4711}",
            EnqueueOptions::new(),
        )
        .await
        .expect("enqueue");

    let mailer = Arc::new(Mailer::default());
    let shutdown = CancellationToken::new();
    let w = Worker::builder(server.url())
        .shutdown(shutdown.clone())
        .job_with_state(
            Arc::clone(&mailer),
            |email: SendConfirmation, _ctx: JobContext, mailer: Arc<Mailer>| async move {
                let mut sent = mailer.sent.lock().unwrap();
                if !sent.contains(&email.order) {
                    sent.push(email.order);
                }
                Ok::<(), HandlerError>(())
            },
        )
        .build();
    let run = tokio::spawn(w.run());
    until(Duration::from_secs(20), "both jobs settled", || async {
        let good = c.get_job(added.job.id.to_string()).await.expect("get");
        let bad = c.get_job(bad.id.clone()).await.expect("get");
        (good.status == pb::JobStatus::Done as i32 && bad.status == pb::JobStatus::Failed as i32)
            .then_some(())
    })
    .await;
    assert_eq!(*mailer.sent.lock().unwrap(), vec!["order-4711".to_owned()]);
    let bad = c.get_job(bad.id.clone()).await.expect("get");
    assert_eq!(bad.attempts, 1, "fatal at once: {bad:?}");
    shutdown.cancel();
    run.await.expect("join").expect("worker");
}
