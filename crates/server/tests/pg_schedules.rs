//! Replacing or deleting a schedule on PostgreSQL leaves nothing of its
//! payload but the dead row version (and its TOAST chunks) that any
//! UPDATE or DELETE leaves, which vacuum makes reusable: across a thousand
//! replacements, and a thousand creates and deletes, of schedules with
//! 100 KB payloads, `jobq_schedules` with its TOAST and indexes stays at
//! the size one vacuum interval's writes need. Needs `JOBQ_TEST_PG` (see
//! `scripts/pg-test.sh`).

use std::time::{Duration, SystemTime};

use jobq_server::{
    schedule::Schedule,
    store::{
        postgres::{testing, PgStore},
        Store,
    },
};
use tokio_postgres::NoTls;

/// A payload of 100 KB that differs with `seed` and does not compress.
fn payload(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..100_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn schedule(name: &str, seed: u64) -> Schedule {
    Schedule {
        name: name.into(),
        queue: "rq".into(),
        kind: "k".into(),
        payload: payload(seed),
        cron: "0 3 * * *".into(),
        timezone: "UTC".into(),
        max_attempts: 3,
        created_at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seed),
        last_tick: None,
    }
}

async fn put(store: &PgStore, schedule: Schedule) {
    store
        .put_schedule(schedule, |_| Ok(()))
        .await
        .expect("put a schedule");
}

/// Writes between two vacuums (autovacuum's part in production).
const VACUUM_EVERY: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_or_deleted_schedule_payloads_leave_only_what_vacuum_reclaims() {
    let url = testing::fresh_database("jobq_schedule_space").await;
    let store = testing::store(testing::options(&url)).await;
    let (client, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    let vacuum_and_size = || async {
        client
            .batch_execute("VACUUM jobq_schedules")
            .await
            .expect("vacuum");
        let row = client
            .query_one("SELECT pg_total_relation_size('jobq_schedules')", &[])
            .await
            .expect("size");
        u64::try_from(row.get::<_, i64>(0)).expect("a size")
    };
    let mut seed = 0;
    let mut next = || {
        seed += 1;
        seed
    };
    // Warm-up: one vacuum interval's worth of row versions.
    for _ in 0..VACUUM_EVERY {
        put(&store, schedule("r", next())).await;
    }
    let base = vacuum_and_size().await;
    let mut most = base;
    for i in 0..1000 {
        put(&store, schedule("r", next())).await;
        if i % VACUUM_EVERY == VACUUM_EVERY - 1 {
            most = most.max(vacuum_and_size().await);
        }
    }
    for i in 0..1000 {
        put(&store, schedule("d", next())).await;
        assert!(store.delete_schedule("d").await.expect("delete").is_some());
        if i % VACUUM_EVERY == VACUUM_EVERY - 1 {
            most = most.max(vacuum_and_size().await);
        }
    }
    eprintln!("jobq_schedules: {base} bytes after the warm-up, at most {most}");
    // Kept payloads would take 200 MB; a second interval's worth is slack.
    assert!(
        most <= 2 * base + 4 * 1024 * 1024,
        "jobq_schedules grew from {base} to {most} bytes"
    );
}
