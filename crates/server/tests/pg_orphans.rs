//! The stream leases of a server that stopped heartbeating, over the
//! PostgreSQL store: the others reclaim them as worker disconnected, each
//! once, all of them in one pass, splitting the rows between them; and a
//! lease that a reconnecting worker's new server adopts meanwhile is left
//! alone. Needs `JOBQ_TEST_PG` (see `scripts/pg-test.sh`).

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use futures::StreamExt;
use jobq_server::{
    job::Status,
    store::{
        postgres::{testing, PgStore},
        ListFilter, Store,
    },
};

const LEASE: Duration = Duration::from_secs(60);

async fn store(url: &str) -> Arc<PgStore> {
    Arc::new(testing::store(testing::options(url)).await)
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// Deletes every server's registration: the servers that hold stream
/// leases are dead from now on (the others hold none).
async fn forget_servers(url: &str) {
    connect(url)
        .await
        .execute("DELETE FROM jobq_servers", &[])
        .await
        .unwrap();
}

/// Counts jobs of queue `q` in `status`.
async fn count(store: &PgStore, status: Status) -> usize {
    let mut n = 0;
    let mut after = None;
    loop {
        let page = store
            .list(ListFilter {
                queue: Some("q".into()),
                status: Some(status),
                after,
                limit: 1000,
                omit_payload: true,
                ..Default::default()
            })
            .await
            .unwrap();
        n += page.jobs.len();
        match page.next {
            Some(next) => after = Some(next),
            None => return n,
        }
    }
}

/// A server's streams hold 2,500 leases (three reclaim chunks), and it
/// never heartbeats: two survivors reclaiming at once get every lease back
/// between them, each exactly once (one attempt spent per job).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_survivors_split_a_dead_servers_leases_and_reclaim_all_in_one_pass() {
    const N: usize = 2_500;
    let url = testing::fresh_database("jobq_orphans").await;
    let (dead, one, two) = (store(&url).await, store(&url).await, store(&url).await);
    let now = SystemTime::now();
    for _ in 0..N / 250 {
        let batch = (0..250).map(|_| testing::job("q")).collect();
        dead.enqueue_batch(batch, now).await.unwrap();
    }
    let queues = vec!["q".to_owned()];
    // Alive while its streams take (a stale heartbeat takes nothing).
    let beating = tokio::spawn({
        let dead = Arc::clone(&dead);
        async move {
            loop {
                dead.heartbeat().await.unwrap();
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });
    let taken = futures::stream::iter(0..N)
        .map(|_| dead.take_streamed(&queues, "w", None, LEASE, SystemTime::now()))
        .buffer_unordered(8)
        .filter(|r| std::future::ready(matches!(r, Ok(Some(_)))))
        .count()
        .await;
    assert_eq!(taken, N);
    beating.abort();
    let _ = beating.await;

    // The dead server's registration is gone (it stopped heartbeating
    // long ago): it is dead at once.
    forget_servers(&url).await;
    let started = Instant::now();
    let (a, b) = tokio::join!(
        one.reclaim_orphaned(SystemTime::now()),
        two.reclaim_orphaned(SystemTime::now())
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    println!(
        "{N} leases reclaimed by two survivors in {:?} ({} + {})",
        started.elapsed(),
        a.len(),
        b.len()
    );
    assert_eq!(a.len() + b.len(), N, "every lease reclaimed once");
    assert_eq!(one.fenced_reclaims() + two.fenced_reclaims(), 0);
    assert_eq!(count(&one, Status::Pending).await, N);
    assert_eq!(count(&one, Status::Running).await, 0);
    for (job, _) in a.iter().chain(&b).take(50) {
        let job = one.get(job.id).await.unwrap();
        assert_eq!(job.attempts, 1, "one attempt spent: {job:?}");
    }
}

/// A survivor's reclaim meets a lease whose adoption by a live server is
/// under way (its row is locked, its new server not committed yet). The
/// reclaim neither waits for it nor, once the adoption commits, takes the
/// lease from the worker that declared it: it still acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_adopted_while_a_survivor_reclaims_is_left_to_its_new_server() {
    let url = testing::fresh_database("jobq_adopt_race").await;
    let (dead, survivor) = (store(&url).await, store(&url).await);
    let queues = vec!["q".to_owned()];
    dead.enqueue(testing::job("q"), SystemTime::now())
        .await
        .unwrap();
    let leased = dead
        .take_streamed(&queues, "w", None, LEASE, SystemTime::now())
        .await
        .unwrap()
        .unwrap();
    let id = i64::try_from(leased.job.id.0).unwrap();

    // A live server "adopter" (it heartbeats) adopts the lease, in a
    // transaction that has not committed yet.
    forget_servers(&url).await;
    let mut admin = connect(&url).await;
    admin
        .execute(
            "INSERT INTO jobq_servers (id, heartbeat_at) VALUES ('adopter', now() + interval '1 hour')",
            &[],
        )
        .await
        .unwrap();
    let adopt = admin.transaction().await.unwrap();
    adopt
        .execute(
            "UPDATE jobq_jobs SET lease_server = 'adopter' WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();

    let reclaim = tokio::spawn({
        let survivor = Arc::clone(&survivor);
        async move { survivor.reclaim_orphaned(SystemTime::now()).await }
    });
    // The reclaim ends, or waits on the adoption's row lock.
    let watcher = connect(&url).await;
    testing::until_lock_waiters(&watcher, 1, "the reclaim to end or wait", || {
        reclaim.is_finished()
    })
    .await;
    adopt.commit().await.unwrap();
    let reclaimed = reclaim.await.unwrap().unwrap();
    assert!(
        reclaimed.is_empty(),
        "reclaimed an adopted lease: {reclaimed:?}"
    );
    let again = survivor.reclaim_orphaned(SystemTime::now()).await.unwrap();
    assert!(again.is_empty(), "reclaimed an adopted lease: {again:?}");
    survivor
        .ack(leased.job.id, leased.lease_id, SystemTime::now())
        .await
        .expect("the worker that declared the lease still acks");
}
