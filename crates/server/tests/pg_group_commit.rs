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
