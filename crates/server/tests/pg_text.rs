//! Free text that PostgreSQL cannot hold, sent through the real service
//! over the PostgreSQL store with group commit on: a NUL character (which
//! `text` and `jsonb` refuse) and a time outside timestamp.proto's range
//! (whose encoding overflows). Each is refused with INVALID_ARGUMENT or, in
//! a Fail's error or a CancelJob's reason, mended, and never reaches a shared
//! transaction, where it would fail every other caller's change in the same
//! batch. Needs `JOBQ_TEST_PG` (see `scripts/pg-test.sh`).

use std::sync::Arc;

use jobq::pb::{self, job_queue_server::JobQueue};
use jobq_server::{
    leases::LeaseHub,
    service::JobQueueService,
    store::postgres::{testing, PgStore},
    Config,
};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request};

async fn service() -> JobQueueService<PgStore> {
    let config = Arc::new(Config::with_data("unused"));
    let options = testing::options(&testing::fresh_database("jobq_text").await);
    let store = Arc::new(PgStore::connect(&config, options).await.expect("connect"));
    let shutdown = CancellationToken::new();
    let hub = LeaseHub::new(Arc::clone(&store), Arc::clone(&config), shutdown.clone());
    JobQueueService::new(store, hub, config, shutdown)
}

fn enqueue(metadata: &[(&str, &str)]) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: "q".into(),
        kind: "k".into(),
        metadata: metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

async fn count(svc: &JobQueueService<PgStore>) -> usize {
    let page = svc
        .list_jobs(Request::new(pb::ListJobsRequest {
            queue: "q".into(),
            ..Default::default()
        }))
        .await
        .expect("list");
    page.into_inner().jobs.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_or_an_unencodable_time_is_refused_or_mended_before_postgresql() {
    let svc = service().await;

    let err = svc
        .enqueue(Request::new(enqueue(&[("tenant", "a\0b")])))
        .await
        .expect_err("a NUL in a metadata value");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("NUL"), "{err:?}");
    assert_eq!(count(&svc).await, 0, "nothing was enqueued");

    // A batch refuses the bad entry alone; the good one is enqueued.
    let batch = svc
        .enqueue_batch(Request::new(pb::EnqueueBatchRequest {
            jobs: vec![enqueue(&[("tenant", "a\0b")]), enqueue(&[("tenant", "ab")])],
        }))
        .await
        .expect("batch")
        .into_inner();
    let codes: Vec<i32> = batch.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [Code::InvalidArgument as i32, Code::Ok as i32]);
    assert_eq!(count(&svc).await, 1);

    // A Fail's error with NULs (a program's stderr) is kept, mended.
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
    let job = leased.job.expect("a job");
    let failed = svc
        .fail(Request::new(pb::FailRequest {
            job_id: job.id.clone(),
            lease_id: leased.lease_id.clone(),
            error: "exit 3\0\0 garbage".into(),
            ..Default::default()
        }))
        .await
        .expect("a Fail is never refused for its text")
        .into_inner()
        .job
        .expect("the job");
    assert_eq!(failed.last_error, "exit 3\u{fffd}\u{fffd} garbage");
    assert_eq!(failed.status, pb::JobStatus::Pending as i32);

    // A cancel's reason follows the same rule as a Fail's error.
    let cancelled = svc
        .cancel_job(Request::new(pb::CancelJobRequest {
            id: job.id.clone(),
            reason: "oops\0".into(),
        }))
        .await
        .expect("a CancelJob is never refused for its reason")
        .into_inner()
        .job
        .expect("the job");
    assert_eq!(cancelled.last_error, "cancelled: oops\u{fffd}");

    for seconds in [i64::MAX, i64::MIN, 253_402_300_800] {
        let err = svc
            .purge_jobs(Request::new(pb::PurgeJobsRequest {
                queue: "q".into(),
                status: pb::JobStatus::Done as i32,
                finished_before: Some(prost_types::Timestamp { seconds, nanos: 0 }),
            }))
            .await
            .expect_err("a time outside timestamp.proto's range");
        assert_eq!(err.code(), Code::InvalidArgument, "{seconds}: {err:?}");
    }
    // The last second timestamp.proto allows purges (nothing is DONE).
    let purged = svc
        .purge_jobs(Request::new(pb::PurgeJobsRequest {
            queue: "q".into(),
            status: pb::JobStatus::Done as i32,
            finished_before: Some(prost_types::Timestamp {
                seconds: 253_402_300_799,
                nanos: 999_999_999,
            }),
        }))
        .await
        .expect("purge at 9999-12-31T23:59:59.999999999Z");
    assert_eq!(purged.into_inner().deleted, 0);
    assert_eq!(count(&svc).await, 1, "the job is still there");
}
