//! The database sessions of a server on the PostgreSQL store: each names
//! its server (`application_name`), the database itself probes each with
//! TCP keepalives (so a vanished server's session does not linger for the
//! kernel's two hours), and when a server stops heartbeating, the survivor
//! that declares it dead ends its sessions. Needs `JOBQ_TEST_PG` (see
//! `scripts/pg-test.sh`).

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use jobq_server::store::{
    postgres::{testing, PgStore},
    Store,
};

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

async fn store(url: &str, server_timeout: Duration) -> Arc<PgStore> {
    let mut options = testing::options(url);
    options.server_timeout = server_timeout;
    Arc::new(testing::store(options).await)
}

/// The application names of the open sessions on this database, and their
/// backends' pids.
async fn sessions(db: &tokio_postgres::Client) -> Vec<(String, i32)> {
    db.query(
        "SELECT application_name, pid FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The kinds of session (`pool`, `heartbeat`, `listen`) open for a server.
async fn kinds_of(db: &tokio_postgres::Client, server: &str) -> BTreeSet<String> {
    let prefix = format!("jobq {server} ");
    sessions(db)
        .await
        .into_iter()
        .filter_map(|(name, _)| name.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

/// Polls `cond` every 20 ms until it holds, failing after `limit`.
async fn until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_names_its_server_and_is_kept_alive_by_the_database() {
    let url = testing::fresh_database("jobq_sessions").await;
    let store = store(&url, Duration::from_secs(7)).await;
    let me = store.backend().server_id().to_owned();
    // What the database applies on a pooled session: keepalives from
    // `--server-timeout`, in seconds.
    let pooled = store.backend().pool().get().await.unwrap();
    for (setting, want) in [
        ("tcp_keepalives_idle", "7"),
        ("tcp_keepalives_interval", "1"),
        ("tcp_keepalives_count", "5"),
        ("tcp_user_timeout", "14000"),
    ] {
        let got: String = pooled
            .query_one(
                "SELECT setting FROM pg_settings WHERE name = $1",
                &[&setting],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(got, want, "{setting}");
    }
    let db = connect(&url).await;
    // The LISTEN session opens in a task of its own.
    until(
        Duration::from_secs(10),
        "pool, heartbeat and LISTEN sessions",
        || {
            let (db, me) = (&db, &me);
            async move {
                let kinds = kinds_of(db, me).await;
                ["pool", "heartbeat", "listen"]
                    .iter()
                    .all(|k| kinds.contains(*k))
            }
        },
    )
    .await;
    let name: String = pooled
        .query_one("SELECT current_setting('application_name')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, format!("jobq {me} pool"));
}

/// The backend pids of a server's sessions.
async fn pids_of(db: &tokio_postgres::Client, server: &str) -> BTreeSet<i32> {
    let prefix = format!("jobq {server} ");
    sessions(db)
        .await
        .into_iter()
        .filter(|(name, _)| name.starts_with(&prefix))
        .map(|(_, pid)| pid)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_ends_the_database_sessions_of_a_server_it_declares_dead() {
    let url = testing::fresh_database("jobq_sessions").await;
    let timeout = Duration::from_secs(1);
    // `dead` registers, then never heartbeats again (nothing calls its
    // heartbeat, as if its process froze), but its sessions stay open.
    let dead = store(&url, timeout).await;
    let (survivor, live) = (store(&url, timeout).await, store(&url, timeout).await);
    let ids = |s: &PgStore| s.backend().server_id().to_owned();
    let (dead_id, survivor_id, live_id) = (ids(&dead), ids(&survivor), ids(&live));
    let db = connect(&url).await;
    // Each server's sessions: a pooled one by its pid, and every one named
    // for it.
    let pids = |store: Arc<PgStore>, id: String| {
        let db = &db;
        async move {
            let pooled = store.backend().pool().get().await.unwrap();
            let pid: i32 = pooled
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .unwrap()
                .get(0);
            let mut all = pids_of(db, &id).await;
            all.insert(pid);
            all
        }
    };
    let doomed = pids(Arc::clone(&dead), dead_id.clone()).await;
    let kept = pids(Arc::clone(&survivor), survivor_id.clone()).await;
    let kept_too = pids(Arc::clone(&live), live_id.clone()).await;
    until(
        Duration::from_secs(20),
        "the dead server's sessions ended",
        || {
            let (db, doomed, survivor, live) = (&db, &doomed, &survivor, &live);
            async move {
                live.heartbeat().await.unwrap();
                survivor.heartbeat().await.unwrap();
                survivor.reclaim_orphaned(SystemTime::now()).await.unwrap();
                let open: BTreeSet<i32> = sessions(db).await.into_iter().map(|(_, p)| p).collect();
                doomed.is_disjoint(&open)
            }
        },
    )
    .await;
    // The living keep theirs.
    let open: BTreeSet<i32> = sessions(&db).await.into_iter().map(|(_, p)| p).collect();
    assert!(kept.is_subset(&open), "the survivor lost sessions");
    assert!(kept_too.is_subset(&open), "a live server lost sessions");
}
