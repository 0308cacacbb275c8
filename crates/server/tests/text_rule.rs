//! The one rule for the text a job keeps of why it ended badly, through
//! the real service on both stores: a worker's Fail error and an
//! operator's CancelJob reason are never refused for their text; a NUL
//! becomes U+FFFD and the kept text is cut to `--max-error-bytes`, ending
//! in "…". The PostgreSQL test needs `JOBQ_TEST_PG` (see
//! `scripts/pg-test.sh`); without it, it fails saying how to start one.

use std::sync::Arc;

use jobq::pb::{self, job_queue_server::JobQueue};
use jobq_server::{
    leases::LeaseHub,
    service::JobQueueService,
    store::{
        postgres::{testing, PgStore},
        sled::SledStore,
        Store,
    },
    Config,
};
use tokio_util::sync::CancellationToken;
use tonic::Request;

fn service<S: Store>(store: S, config: Config) -> JobQueueService<S> {
    let config = Arc::new(config);
    let store = Arc::new(store);
    let shutdown = CancellationToken::new();
    let hub = LeaseHub::new(Arc::clone(&store), Arc::clone(&config), shutdown.clone());
    JobQueueService::new(store, hub, config, shutdown)
}

async fn enqueue<S: Store>(svc: &JobQueueService<S>) -> String {
    svc.enqueue(Request::new(pb::EnqueueRequest {
        queue: "q".into(),
        kind: "k".into(),
        ..Default::default()
    }))
    .await
    .expect("enqueue")
    .into_inner()
    .job
    .expect("the job")
    .id
}

async fn dequeue<S: Store>(svc: &JobQueueService<S>) -> (String, String) {
    let leased = svc
        .dequeue(Request::new(pb::DequeueRequest {
            queues: vec!["q".into()],
            worker_id: "w1".into(),
            ..Default::default()
        }))
        .await
        .expect("dequeue")
        .into_inner()
        .leased
        .expect("a job is due");
    (leased.job.expect("a job").id, leased.lease_id)
}

async fn fail<S: Store>(svc: &JobQueueService<S>, error: &str) -> pb::Job {
    let (id, lease_id) = dequeue(svc).await;
    svc.fail(Request::new(pb::FailRequest {
        job_id: id,
        lease_id,
        error: error.into(),
        fatal: true,
        ..Default::default()
    }))
    .await
    .expect("a Fail is never refused for its text")
    .into_inner()
    .job
    .expect("the job")
}

async fn cancel<S: Store>(svc: &JobQueueService<S>, id: &str, reason: &str) -> pb::Job {
    svc.cancel_job(Request::new(pb::CancelJobRequest {
        id: id.into(),
        reason: reason.into(),
    }))
    .await
    .expect("a CancelJob is never refused for its reason")
    .into_inner()
    .job
    .expect("the job")
}

/// The job as GetJob reads it back from the store: its `last_error` and
/// its latest attempt's error, if it ran.
async fn stored<S: Store>(svc: &JobQueueService<S>, id: &str) -> (String, Option<String>) {
    let job = svc
        .get_job(Request::new(pb::GetJobRequest { id: id.into() }))
        .await
        .expect("get")
        .into_inner();
    let attempt = job.history.last().map(|a| a.error.clone());
    (job.last_error, attempt)
}

/// Checks `kept` against the rule: within the limit, no NUL, and cut
/// (ending in "…") exactly when `whole` did not fit.
fn follows_the_rule(kept: &str, whole: &str, limit: usize) {
    assert!(kept.len() <= limit, "{} bytes: {kept:?}", kept.len());
    assert!(!kept.contains('\0'), "{kept:?}");
    if whole.len() > limit {
        assert!(kept.ends_with('…'), "{kept:?}");
        // Cut, not mangled: what is kept is the start of the text.
        let start = kept.trim_end_matches('…');
        assert!(whole.replace('\0', "\u{fffd}").starts_with(start));
    } else {
        assert_eq!(kept, whole.replace('\0', "\u{fffd}"));
    }
}

async fn text_rule<S: Store>(svc: JobQueueService<S>, limit: usize) {
    // Fail: NUL characters, and a text far over the limit.
    let long_error = format!("exit 3\0: {}", "é".repeat(limit));
    for error in ["exit 3\0\0 garbage".to_owned(), long_error] {
        let id = enqueue(&svc).await;
        let failed = fail(&svc, &error).await;
        assert_eq!(failed.status, pb::JobStatus::Failed as i32);
        follows_the_rule(&failed.last_error, &error, limit);
        let (last_error, attempt) = stored(&svc, &id).await;
        assert_eq!(last_error, failed.last_error, "as stored");
        assert_eq!(attempt.as_deref(), Some(last_error.as_str()));
    }

    // CancelJob, PENDING and RUNNING: the same rule for "cancelled:
    // <reason>".
    let long_reason = format!("refund\0 {}", "x".repeat(2 * limit));
    for reason in ["wrong\0order".to_owned(), long_reason] {
        let whole = format!("cancelled: {reason}");
        let pending = enqueue(&svc).await;
        let cancelled = cancel(&svc, &pending, &reason).await;
        assert_eq!(cancelled.status, pb::JobStatus::Failed as i32);
        follows_the_rule(&cancelled.last_error, &whole, limit);
        assert_eq!(stored(&svc, &pending).await.0, cancelled.last_error);

        let running = enqueue(&svc).await;
        let (leased, _) = dequeue(&svc).await;
        assert_eq!(leased, running);
        let cancelled = cancel(&svc, &running, &reason).await;
        follows_the_rule(&cancelled.last_error, &whole, limit);
        let (last_error, attempt) = stored(&svc, &running).await;
        assert_eq!(last_error, cancelled.last_error);
        assert_eq!(attempt.as_deref(), Some(last_error.as_str()));
    }
}

/// A small limit, so that cuts land inside multi-byte characters too.
const LIMIT: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_and_cancel_keep_text_by_one_rule_on_sled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::with_data(dir.path());
    config.max_error_bytes = LIMIT;
    let store = SledStore::open(&config).expect("open");
    text_rule(service(store, config), LIMIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_and_cancel_keep_text_by_one_rule_on_postgresql() {
    let mut config = Config::with_data("unused");
    config.max_error_bytes = LIMIT;
    let options = testing::options(&testing::fresh_database("jobq_text_rule").await);
    let store = PgStore::connect(&config, options).await.expect("connect");
    text_rule(service(store, config), LIMIT).await;
}
