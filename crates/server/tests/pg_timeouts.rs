//! `--pg-statement-timeout`: PostgreSQL cancels a statement of the server
//! that runs longer, and the call fails UNAVAILABLE (worth a retry) rather
//! than wait forever. Needs `JOBQ_TEST_PG` (see `scripts/pg-test.sh`).

use std::time::{Duration, Instant, SystemTime};

use jobq_server::{
    job::Leased,
    store::{
        postgres::{testing, PgOptions, PgStore},
        Store,
    },
};
use tokio_postgres::NoTls;
use tonic::Code;

/// Enqueues a job and takes it.
async fn leased(store: &PgStore) -> Leased {
    store
        .enqueue(testing::job("q"), SystemTime::now())
        .await
        .expect("enqueue");
    testing::take(store, &["q"])
        .await
        .expect("take")
        .expect("due")
}

/// With `other` (another session) holding the job's row, the ack's lock
/// waits for it until the statement timeout cancels it: UNAVAILABLE.
/// Leaves the row held.
async fn ack_cut_while_held(store: &PgStore, other: &tokio_postgres::Client, leased: &Leased) {
    other
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM jobq_jobs WHERE id = {} FOR UPDATE",
            leased.job.id.0
        ))
        .await
        .expect("hold the row");
    let ack = store.ack(leased.job.id, leased.lease_id, SystemTime::now());
    let err = tokio::time::timeout(Duration::from_secs(10), ack)
        .await
        .expect("the statement timeout ends the wait")
        .expect_err("the ack's statement is cancelled");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

#[tokio::test]
async fn a_statement_over_the_timeout_is_cancelled_and_the_call_is_unavailable() {
    let url = testing::fresh_database("jobq_timeout").await;
    let store = testing::store(PgOptions {
        group_commit: 1,
        // Long enough for the setup's statements on a loaded machine.
        statement_timeout: Duration::from_secs(1),
        ..testing::options(&url)
    })
    .await;
    let leased = leased(&store).await;

    // Another session holds the job's row: the ack's lock waits for it.
    let (other, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    let started = Instant::now();
    ack_cut_while_held(&store, &other, &leased).await;
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // Once the row is free, the same ack goes through.
    other.batch_execute("ROLLBACK").await.expect("release");
    store
        .ack(leased.job.id, leased.lease_id, SystemTime::now())
        .await
        .expect("ack");
}

/// A server that starts while another one migrates waits for it, however
/// long the migration takes: the wait for the migration lock is not cut by
/// the statement timeout.
#[tokio::test]
async fn a_server_waits_for_another_servers_migration_past_the_statement_timeout() {
    use jobq_server::store::postgres::schema::MIGRATION_LOCK;

    let url = testing::fresh_database("jobq_timeout").await;
    // Another server's migration holds the lock.
    let (other, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    other
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .expect("the migration lock");
    let starting = tokio::spawn({
        let url = url.clone();
        async move {
            testing::store(PgOptions {
                statement_timeout: Duration::from_secs(1),
                ..testing::options(&url)
            })
            .await
        }
    });
    // Well past the timeout, the starting server still waits.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!starting.is_finished(), "it gave up or did not wait");
    other
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await
        .expect("unlock");
    let store = tokio::time::timeout(Duration::from_secs(30), starting)
        .await
        .expect("it starts once the lock is free")
        .expect("the task");
    // The migration's connection, the only one in the pool yet, went back
    // with the timeout it had: an ack held up by a locked row is cut.
    let leased = leased(&store).await;
    ack_cut_while_held(&store, &other, &leased).await;
    other.batch_execute("ROLLBACK").await.expect("release");
}
