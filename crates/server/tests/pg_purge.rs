//! The retention purge on PostgreSQL walks ids a bounded window at a time,
//! goes from one window straight to the next job (over ids purged or never
//! used), and stops at the first job enqueued well after every cutoff. Ids come
//! from a sequence; moving it forward makes gaps wider than a window
//! without enqueueing that many jobs. Needs `JOBQ_TEST_PG` (see
//! `scripts/pg-test.sh`).

use std::time::{Duration, SystemTime};

use jobq_server::{
    job::JobId,
    store::{
        postgres::{testing, Clock, PgOptions, PgStore},
        rules::Retention,
        Backend, Store,
    },
};
use tokio_postgres::NoTls;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

/// Enqueues `n` jobs at `enqueued` and cancels them (FAILED) at once.
async fn failed_jobs(store: &PgStore, n: usize, enqueued: SystemTime) -> Vec<JobId> {
    let mut ids = Vec::new();
    for e in store
        .enqueue_batch(vec![testing::job("q"); n], enqueued)
        .await
        .unwrap()
    {
        store
            .cancel(e.job.id, String::new(), enqueued)
            .await
            .unwrap();
        ids.push(e.job.id);
    }
    ids
}

/// Moves the id sequence `by` ids on: a gap of ids no job has.
async fn skip_ids(url: &str, by: i64) {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
        .execute(
            "SELECT setval('jobq_job_ids', nextval('jobq_job_ids') + $1)",
            &[&by],
        )
        .await
        .expect("setval");
}

/// Every purge step of one pass: (deleted, next) each.
async fn pass(store: &PgStore, retention: &Retention) -> Vec<(u64, Option<JobId>)> {
    let mut steps = Vec::new();
    let mut after = None;
    loop {
        let step = store
            .backend()
            .purge_chunk(after, retention.clone())
            .await
            .unwrap();
        steps.push(step);
        match step.1 {
            Some(next) => after = Some(next),
            None => return steps,
        }
    }
}

#[tokio::test]
async fn a_purge_pass_crosses_id_gaps_and_stops_after_every_cutoff() {
    let url = testing::fresh_database("jobq_purge").await;
    // The caller's clock: the test replays time.
    let store = testing::store(PgOptions {
        clock: Clock::Caller,
        ..testing::options(&url)
    })
    .await;
    // Old failed jobs, a gap of more than two windows, more old ones, a
    // gap again, then jobs enqueued long after the cutoff.
    let old_a = failed_jobs(&store, 5, at(0)).await;
    skip_ids(&url, 120_000).await;
    let old_b = failed_jobs(&store, 5, at(10)).await;
    skip_ids(&url, 120_000).await;
    let new = failed_jobs(&store, 5, at(100_000)).await;
    let retention = Retention {
        done_before: at(1_000),
        failed_before: at(1_000),
        queue: None,
        pending_through: None,
    };
    let steps = pass(&store, &retention).await;
    // Two steps: the first window deletes the first five and goes on to
    // the next job (over a gap of more than two windows), the second
    // deletes the other five and stops at the first new job.
    assert_eq!(
        steps,
        vec![(5, Some(JobId(old_b[0].0 - 1))), (5, None)],
        "old_a {old_a:?}, old_b {old_b:?}, new {new:?}"
    );
    for id in old_a.iter().chain(&old_b) {
        assert!(store.get(*id).await.is_err(), "job {id} was purged");
    }
    for id in &new {
        assert!(store.get(*id).await.is_ok(), "job {id} is kept");
    }
}
