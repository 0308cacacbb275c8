//! Group commit in the PostgreSQL store (database clock, batching on):
//! concurrent callers that share a transaction each get exactly what
//! running alone would give them. Needs `JOBQ_TEST_PG` (see
//! `scripts/pg-test.sh`).

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, SystemTime},
};

use jobq_server::{
    job::{NewJob, Status},
    store::{
        postgres::{testing, PgStore},
        Store,
    },
};
use tonic::Code;

async fn store() -> Arc<PgStore> {
    store_on(&testing::fresh_database("jobq_group").await).await
}

async fn store_on(url: &str) -> Arc<PgStore> {
    Arc::new(testing::store(testing::options(url)).await)
}

fn job(key: Option<&str>) -> NewJob {
    NewJob {
        queue: "q".into(),
        kind: "k".into(),
        payload: vec![],
        key: key.map(Into::into),
        max_attempts: 3,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: jobq_server::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_sharing_transactions_get_their_own_results() {
    let store = store().await;
    // 64 enqueues at once, half of them of one key: one job for the key,
    // 32 others.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..64 {
        let store = Arc::clone(&store);
        calls.spawn(async move {
            let key = (i % 2 == 0).then_some("order-4711");
            store
                .enqueue(job(key), SystemTime::now())
                .await
                .expect("enqueue")
        });
    }
    let (mut keyed, mut created, mut ids) = (HashSet::new(), 0, HashSet::new());
    while let Some(e) = calls.join_next().await {
        let e = e.expect("task");
        created += usize::from(e.created);
        if e.job.key.is_some() {
            keyed.insert(e.job.id);
        }
        ids.insert(e.job.id);
    }
    assert_eq!(keyed.len(), 1, "one job for the key");
    assert_eq!(created, 33);
    assert_eq!(ids.len(), 33);

    // Take them all, then ack each at once, plus a stale ack per job that
    // shares the batches: the stale ones are refused, the right ones land.
    let mut leased = Vec::new();
    while let Some(l) = testing::take(&store, &["q"]).await.expect("take") {
        leased.push(l);
    }
    assert_eq!(leased.len(), 33);
    let mut acks = tokio::task::JoinSet::new();
    for l in leased {
        let (good, stale) = (Arc::clone(&store), Arc::clone(&store));
        let (id, lease) = (l.job.id, l.lease_id);
        acks.spawn(async move { (true, good.ack(id, lease, SystemTime::now()).await) });
        let wrong = jobq_server::job::LeaseId(lease.0 ^ 1);
        acks.spawn(async move { (false, stale.ack(id, wrong, SystemTime::now()).await) });
    }
    while let Some(r) = acks.join_next().await {
        let (right, result) = r.expect("task");
        if right {
            assert_eq!(result.expect("ack").status, Status::Done);
        } else {
            let code = result.expect_err("a stale ack is refused").code();
            assert!(
                code == Code::Aborted || code == Code::FailedPrecondition,
                "stale ack: {code:?}"
            );
        }
    }
    let stats = store
        .stats(Some("q"), SystemTime::now())
        .await
        .expect("stats");
    assert_eq!(
        (stats[0].done, stats[0].pending, stats[0].running),
        (33, 0, 0)
    );
    let (batches, callers) = store.backend().group_commits();
    println!("group commit: {batches} shared transactions carried {callers} calls");
}

/// Two servers enqueue batches that share keys, in opposite orders, at
/// once: each key makes one job and every caller gets its results. (Each
/// insert holds its key until the commit; inserted in the batch's order,
/// the two transactions waited on each other and PostgreSQL broke the
/// deadlock by failing one, with every caller in it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_sharing_keys_in_opposite_orders_do_not_deadlock() {
    let url = testing::fresh_database("jobq_keyorder").await;
    let (a, b) = (store_on(&url).await, store_on(&url).await);
    for round in 0..5 {
        let keys: Vec<String> = (0..300).map(|i| format!("r{round}-k{i:03}")).collect();
        let batch = |keys: &[String]| -> Vec<NewJob> {
            keys.iter().map(|k| job(Some(k.as_str()))).collect()
        };
        let forward = batch(&keys);
        let backward = batch(&keys.iter().rev().cloned().collect::<Vec<_>>());
        let (sa, sb) = (Arc::clone(&a), Arc::clone(&b));
        let one = tokio::spawn(async move { sa.enqueue_batch(forward, SystemTime::now()).await });
        let two = tokio::spawn(async move { sb.enqueue_batch(backward, SystemTime::now()).await });
        let one = one.await.unwrap().expect("the forward batch");
        let two = two.await.unwrap().expect("the backward batch");
        let created = one.iter().chain(&two).filter(|e| e.created).count();
        assert_eq!(created, 300, "round {round}: one job per key");
        let ids: HashSet<_> = one.iter().chain(&two).map(|e| e.job.id).collect();
        assert_eq!(ids.len(), 300, "round {round}: both see the same 300 jobs");
    }
}

/// A connection to the test database beside the store's, its driver on a
/// task of its own.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(conn);
    client
}

/// An error with every cause under it, as an operator's log would show it.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// Waits up to 10 s for `check`, polling.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Three enqueues share one group commit, and the database refuses the
/// rows of two of them (a constraint their keys break): each of those two
/// fails with its own row's failure, naming its own key and no other
/// caller's, and the third is enqueued. (The shared transaction's failure
/// went to every caller in it, the one whose row was fine too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rows_failure_in_a_group_commit_fails_its_own_caller_only() {
    let url = testing::fresh_database("jobq_rowfail").await;
    // A pool of 4: one lane for enqueues, so callers queue behind it.
    let store = Arc::new(
        testing::store(jobq_server::store::postgres::PgOptions {
            pool_size: 4,
            ..testing::options(&url)
        })
        .await,
    );
    let admin = connect(&url).await;
    admin
        .batch_execute(
            "ALTER TABLE jobq_jobs ADD CONSTRAINT refused_keys \
             CHECK (key IS NULL OR key NOT LIKE 'refused-%')",
        )
        .await
        .unwrap();
    // Hold the lane: an enqueue that waits for a table lock this
    // transaction holds.
    let mut holder = connect(&url).await;
    let lock = holder.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE jobq_jobs IN SHARE MODE")
        .await
        .unwrap();
    let first = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.enqueue(job(Some("first")), SystemTime::now()).await }
    });
    eventually("the first enqueue waits for the table lock", || async {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        waiting == 1
    })
    .await;
    let (batches, _) = store.backend().group_commits();
    let callers: Vec<_> = ["refused-a", "fine-b", "refused-c"]
        .into_iter()
        .map(|key| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.enqueue(job(Some(key)), SystemTime::now()).await })
        })
        .collect();
    eventually("the three enqueues wait for the lane", || async {
        store.backend().group_commit_queued().1 == 3
    })
    .await;
    lock.rollback().await.unwrap();
    first.await.unwrap().expect("the first enqueue");
    let mut results = Vec::new();
    for c in callers {
        results.push(c.await.unwrap());
    }
    assert_eq!(
        store.backend().group_commits().0,
        batches + 1,
        "the three shared one transaction"
    );
    let [a, b, c] = <[_; 3]>::try_from(results).unwrap();
    let b = b.expect("a caller whose row is fine is enqueued");
    assert!(b.created);
    assert_eq!(b.job.key.as_deref(), Some("fine-b"));
    for (result, own, others) in [
        (a, "refused-a", ["refused-c", "fine-b"]),
        (c, "refused-c", ["refused-a", "fine-b"]),
    ] {
        let err = result.expect_err("a refused row fails its caller");
        let text = chain(&err);
        assert!(text.contains(own), "names its own key: {text}");
        for other in others {
            assert!(!text.contains(other), "names another caller's key: {text}");
        }
    }
    let keys: Vec<String> = admin
        .query("SELECT key FROM jobq_jobs ORDER BY key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keys, ["fine-b", "first"]);
}
