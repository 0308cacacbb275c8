//! For tests: a fresh database per test on the cluster named by
//! `JOBQ_TEST_PG`, so tests run in parallel without seeing each other's
//! jobs or notifications.

use std::time::{Duration, SystemTime};

use tokio_postgres::NoTls;

use super::{Clock, EnqueueLimits, PgOptions, PgStore};
use crate::{
    job::{Leased, NewJob},
    store::Store,
    Config, Result,
};

/// The environment variable naming the test cluster.
pub const TEST_PG_ENV: &str = "JOBQ_TEST_PG";

/// How to get a cluster, for the failure message.
const HOW: &str =
    "the PostgreSQL tests need a cluster: set JOBQ_TEST_PG=postgres://user@host:port/db \
     (any database the user may CREATE DATABASE from), or run the tests under \
     `scripts/pg-test.sh cargo test --workspace`, which starts a throwaway cluster \
     (Debian's `postgresql` package) and sets it";

/// The test cluster's URL.
///
/// # Panics
/// When `JOBQ_TEST_PG` is not set: the PostgreSQL tests fail, they are
/// never skipped.
pub fn cluster_url() -> String {
    match std::env::var(TEST_PG_ENV) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("{HOW}"),
    }
}

/// Creates an empty database named `prefix_<random>` on the test cluster
/// and returns its URL.
///
/// # Panics
/// When `JOBQ_TEST_PG` is not set or the cluster refuses.
pub async fn fresh_database(prefix: &str) -> String {
    let admin = cluster_url();
    let (client, connection) = tokio_postgres::connect(&admin, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {TEST_PG_ENV}={admin}: {e}\n{HOW}"));
    let driver = tokio::spawn(connection);
    let name = format!("{prefix}_{:016x}", rand::random::<u64>());
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    drop(client);
    let _ = driver.await;
    with_database(&admin, &name)
}

/// `url` pointing at database `name` instead.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// The options of a test store on `url`, unless a test says otherwise: 8
/// pooled connections, a 5 s server timeout, the database's clock, group
/// commits of up to 256 transitions, a 60 s statement timeout.
pub fn options(url: &str) -> PgOptions {
    PgOptions {
        url: url.to_owned(),
        pool_size: 8,
        server_timeout: Duration::from_secs(5),
        clock: Clock::Database,
        group_commit: 256,
        statement_timeout: Duration::from_secs(60),
        enqueue: EnqueueLimits::of(&Config::with_data("unused")),
    }
}

/// A store with `options` (see [`options`]) and the default configuration.
///
/// # Panics
/// When it cannot connect or migrate.
pub async fn store(options: PgOptions) -> PgStore {
    PgStore::connect(&Config::with_data("unused"), options)
        .await
        .expect("connect to the test database")
}

/// A job of `queue`: kind `k`, no payload, key or delay, 3 attempts.
pub fn job(queue: &str) -> NewJob {
    NewJob {
        queue: queue.to_owned(),
        kind: "k".into(),
        payload: Vec::new(),
        key: None,
        max_attempts: 3,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: crate::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    }
}

/// Worker `w` takes the first due job of `queues`, on a 60 s lease.
///
/// # Errors
/// Whatever the store's take returns.
pub async fn take(store: &PgStore, queues: &[&str]) -> Result<Option<Leased>> {
    let queues: Vec<String> = queues.iter().map(|q| (*q).to_owned()).collect();
    store
        .take(
            &queues,
            "w",
            None,
            Duration::from_secs(60),
            SystemTime::now(),
        )
        .await
}

/// The advisory lock (two keys) that a take of `queue` holds shared for
/// its transaction: held exclusively, it makes that queue's takes wait.
pub fn take_lock(queue: &str) -> (i32, i32) {
    (
        super::operator::PAUSE_LOCK,
        super::operator::pause_lock_key(queue),
    )
}

/// How many sessions of `client`'s database wait on a lock now.
///
/// # Panics
/// When the query fails.
pub async fn lock_waiters(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .expect("count the sessions waiting on a lock")
        .get(0)
}

/// Waits up to 10 s until at least `n` sessions of `client`'s database
/// wait on a lock, or `done` says there is no need to.
///
/// # Panics
/// When neither happens in time; `what` says what was awaited.
pub async fn until_lock_waiters(
    client: &tokio_postgres::Client,
    n: i64,
    what: &str,
    done: impl Fn() -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() && lock_waiters(client).await < n {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
