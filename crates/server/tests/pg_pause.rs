//! PauseQueue against takes in flight on PostgreSQL: once it returns, no
//! server takes another job of the queue (docs/src/design.md §1 rule 6). A take
//! reads the paused queues in one statement and locks a due job in the
//! next; a take holds its queues' pause locks (shared) across both, and a
//! pause waits for them. Needs `JOBQ_TEST_PG` (see `scripts/pg-test.sh`).

use std::time::{Duration, Instant, SystemTime};

use jobq_server::{
    store::{
        postgres::{pause_lock_key, testing, PgOptions, PgStore, PAUSE_LOCK},
        Store,
    },
    Error,
};
use tokio_postgres::NoTls;

async fn store(url: &str) -> PgStore {
    testing::store(PgOptions {
        pool_size: 4,
        group_commit: 1,
        ..testing::options(url)
    })
    .await
}

#[tokio::test]
async fn a_pause_waits_for_the_takes_in_flight_of_its_queue_only() {
    let url = testing::fresh_database("jobq_pause").await;
    let store = store(&url).await;
    let now = SystemTime::now();
    store
        .enqueue(testing::job("q"), now)
        .await
        .expect("enqueue");
    store
        .enqueue(testing::job("other"), now)
        .await
        .expect("enqueue");

    // A take of "q" in flight: between its read of the paused queues and
    // its commit, it holds q's pause lock.
    let (take, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    take.batch_execute(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock_shared({PAUSE_LOCK}, {})",
        pause_lock_key("q")
    ))
    .await
    .expect("a take's lock");

    // Another queue's pause does not wait for it.
    let started = Instant::now();
    store.set_paused("other", true).await.expect("pause other");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // q's pause waits for it, and gives up retryably if it never ends.
    let started = Instant::now();
    let err = store
        .set_paused("q", true)
        .await
        .expect_err("a take that never commits");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(
        testing::take(&store, &["q"]).await.expect("take").is_some(),
        "the failed pause paused nothing"
    );
    store
        .enqueue(testing::job("q"), SystemTime::now())
        .await
        .expect("enqueue");

    // Once the take commits, the pause goes through, and no take after it
    // gets q's job.
    let pause = {
        let store = store.clone();
        tokio::spawn(async move { store.set_paused("q", true).await })
    };
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    let deadline = Instant::now() + Duration::from_secs(4);
    while take
        .query_one(waiting, &[])
        .await
        .expect("pg_locks")
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the pause never asked for q's lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !pause.is_finished(),
        "the pause waits for the take in flight"
    );
    take.batch_execute("COMMIT")
        .await
        .expect("the take commits");
    pause.await.expect("join").expect("pause q");
    let taken = testing::take(&store, &["q", "other"]).await.expect("take");
    assert!(taken.is_none(), "both queues are paused: {taken:?}");
}

/// The take's side: a take that starts while a pause of its queue is
/// committing waits for it, then reads the pause and takes nothing. Without
/// the take's shared lock it would read "not paused" and take the job.
#[tokio::test]
async fn a_take_that_starts_during_a_pause_waits_and_then_sees_it() {
    let url = testing::fresh_database("jobq_pause").await;
    let store = store(&url).await;
    store
        .enqueue(testing::job("q"), SystemTime::now())
        .await
        .expect("enqueue");

    // A pause of "q" holding its lock, its row not yet committed.
    let (pause, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    pause
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({PAUSE_LOCK}, {}); \
             INSERT INTO jobq_paused (queue) VALUES ('q')",
            pause_lock_key("q")
        ))
        .await
        .expect("a pause's lock and row");

    let take = {
        let store = store.clone();
        tokio::spawn(async move { testing::take(&store, &["q"]).await })
    };
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    let deadline = Instant::now() + Duration::from_secs(10);
    while pause
        .query_one(waiting, &[])
        .await
        .expect("pg_locks")
        .get::<_, i64>(0)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the take never asked for q's pause lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!take.is_finished(), "the take waits for the pause");
    pause
        .batch_execute("COMMIT")
        .await
        .expect("the pause commits");
    let taken = take.await.expect("join").expect("take");
    assert!(taken.is_none(), "the take saw the pause: {taken:?}");
}
