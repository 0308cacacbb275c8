//! The hazard: after ANALYZE sees many DONE rows, a plain
//! `SKIP LOCKED` queue's planner may switch the dequeue to a primary-key
//! scan and the drain rate falls 6×. Fill 100k DONE rows, ANALYZE, check
//! with EXPLAIN that the dequeue still uses the partial index of PENDING
//! jobs, and print the drain rate against an empty table's. And the hazard
//! of priorities: many not-yet-due jobs of a higher priority must not make
//! a take (or the waiters' next-due lookup) walk them. And ListJobs by a
//! status must read its page from an index, not walk the jobs of other
//! statuses in id order. Needs `JOBQ_TEST_PG`
//! (see `scripts/pg-test.sh`).

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use jobq_server::{
    job::{NewJob, Status},
    store::{
        postgres::{dequeue, list_sizes, testing, ListFilters, PgOptions, PgStore, NEXT_RUN_AT},
        ListFilter, Store,
    },
};

const DONE_ROWS: i64 = 100_000;
const DRAIN_JOBS: usize = 2_000;
const WORKERS: usize = 8;

async fn store(url: &str) -> PgStore {
    testing::store(PgOptions {
        pool_size: WORKERS + 2,
        ..testing::options(url)
    })
    .await
}

fn new_job() -> NewJob {
    NewJob {
        queue: "q".into(),
        kind: "k".into(),
        payload: b"{}".to_vec(),
        key: None,
        max_attempts: 3,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: jobq_server::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    }
}

/// Enqueues `DRAIN_JOBS` jobs, then drains them with `WORKERS` concurrent
/// take+ack loops; returns jobs per second of the drain.
async fn drain_rate(store: Arc<PgStore>) -> f64 {
    for _ in 0..DRAIN_JOBS / 500 {
        let batch = (0..500).map(|_| new_job()).collect();
        store
            .enqueue_batch(batch, SystemTime::now())
            .await
            .expect("enqueue");
    }
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let store = Arc::clone(&store);
        workers.spawn(async move {
            let queues = vec!["q".to_owned()];
            let mut n = 0usize;
            while let Some(l) = store
                .take(
                    &queues,
                    &format!("w{w}"),
                    None,
                    Duration::from_secs(60),
                    SystemTime::now(),
                )
                .await
                .expect("take")
            {
                store
                    .ack(l.job.id, l.lease_id, SystemTime::now())
                    .await
                    .expect("ack");
                n += 1;
            }
            n
        });
    }
    let mut drained = 0;
    while let Some(n) = workers.join_next().await {
        drained += n.expect("worker");
    }
    assert_eq!(drained, DRAIN_JOBS);
    DRAIN_JOBS as f64 / start.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_dequeue_plan_uses_the_partial_index_after_analyze_with_100k_done_rows() {
    let empty_url = testing::fresh_database("jobq_plan").await;
    let empty = drain_rate(Arc::new(store(&empty_url).await)).await;

    let url = testing::fresh_database("jobq_plan").await;
    let full = Arc::new(store(&url).await);
    let client = full.backend().pool().get().await.expect("client");
    // 100k finished jobs, as a long-running queue accumulates them within
    // its retention.
    client
        .execute(
            "INSERT INTO jobq_jobs (id, queue, kind, payload, status, attempts, max_attempts, \
             enqueued_at, run_at, finished_at) \
             SELECT nextval('jobq_job_ids'), 'q', 'k', '\\x7b7d', 'done', 0, 3, \
             now() - interval '1 hour', now() - interval '1 hour', now() - interval '30 minutes' \
             FROM generate_series(1, $1::bigint)",
            &[&DONE_ROWS],
        )
        .await
        .expect("fill DONE rows");
    client
        .batch_execute("ANALYZE jobq_jobs")
        .await
        .expect("analyze");
    let sql = format!("EXPLAIN {}", dequeue("id"))
        .replace("$1", "'q'")
        .replace("$2::timestamptz", "NULL::timestamptz");
    let plan: Vec<String> = client
        .query(&sql, &[])
        .await
        .expect("explain")
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    let plan = plan.join("\n");
    println!("dequeue plan with {DONE_ROWS} DONE rows after ANALYZE:\n{plan}");
    assert!(
        plan.contains("jobq_jobs_due_by_priority"),
        "the dequeue must use the partial index of PENDING jobs:\n{plan}"
    );
    assert!(
        !plan.contains("Sort"),
        "the index gives the dequeue's order (priority, then run_at, id): no sort:\n{plan}"
    );
    assert!(
        !plan.contains("jobq_jobs_pkey"),
        "the dequeue must not scan the primary key:\n{plan}"
    );
    // The statement has no ORDER BY over priorities (sorting would probe,
    // and lock, a job of every priority): the order comes from walking the
    // recursive CTE, highest priority first, in a nested loop that stops at
    // the first job.
    assert!(
        plan.contains("Nested Loop") && plan.contains("CTE Scan on prio"),
        "priority order comes from a nested loop over the CTE:\n{plan}"
    );
    drop(client);

    let with_done = drain_rate(Arc::clone(&full)).await;
    println!(
        "drain ({WORKERS} workers, take + ack, {DRAIN_JOBS} jobs): empty table {empty:.0} jobs/s, \
         with {DONE_ROWS} DONE rows {with_done:.0} jobs/s ({:.2}×)",
        with_done / empty
    );
}

/// Shared buffers (hit or read) a statement touched, from `EXPLAIN
/// (ANALYZE, BUFFERS, FORMAT JSON)`.
async fn buffers(client: &tokio_postgres::Client, sql: &str) -> i64 {
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}");
    let rows = client.query(&explain, &[]).await.expect("explain");
    let plan: serde_json::Value = rows[0].get(0);
    let top = &plan[0]["Plan"];
    let blocks = |name: &str| top[name].as_i64().unwrap_or(0);
    blocks("Shared Hit Blocks") + blocks("Shared Read Blocks")
}

/// Inserts `n` PENDING jobs of queue `q` in one statement, due in
/// `due_in` seconds, at `priority`, each with a key of its own (so that a
/// key's lookup has something to miss).
async fn fill_pending(client: &tokio_postgres::Client, n: i64, due_in: f64, priority: i32) {
    client
        .execute(
            "INSERT INTO jobq_jobs (id, queue, kind, payload, key, status, attempts, \
             max_attempts, enqueued_at, run_at, priority) \
             SELECT id, 'q', 'k', '\\x7b7d', 'fill-' || id, 'pending', 0, 3, \
             now(), now() + make_interval(secs => $2::double precision), $3::integer \
             FROM (SELECT nextval('jobq_job_ids') AS id FROM generate_series(1, $1::bigint)) s",
            &[&n, &due_in, &priority],
        )
        .await
        .expect("fill pending jobs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_take_skips_over_higher_priority_jobs_that_are_not_due() {
    const DELAYED: i64 = 100_000;
    let url = testing::fresh_database("jobq_plan").await;
    let store = store(&url).await;
    let client = store.backend().pool().get().await.expect("client");
    // A bulk import scheduled an hour ahead at priority 10, and three
    // ordinary jobs due now at priority 0.
    fill_pending(&client, DELAYED, 3600.0, 10).await;
    let mut due = Vec::new();
    for _ in 0..3 {
        due.push(
            store
                .enqueue(new_job(), SystemTime::now())
                .await
                .expect("enqueue")
                .job
                .id,
        );
    }
    client
        .batch_execute("ANALYZE jobq_jobs")
        .await
        .expect("analyze");

    let take = dequeue("id")
        .replace("$1", "'q'")
        .replace("$2::timestamptz", "NULL::timestamptz");
    let take_buffers = buffers(&client, &take).await;
    let next_due = NEXT_RUN_AT.replace("$1::text[]", "ARRAY['q']::text[]");
    let next_due_buffers = buffers(&client, &next_due).await;
    let scan = "SELECT min(run_at) FROM jobq_jobs WHERE status = 'pending' AND queue = 'q'";
    let scan_buffers = buffers(&client, scan).await;
    println!(
        "past {DELAYED} delayed higher-priority jobs: a take read {take_buffers} buffers, \
         the next-due lookup {next_due_buffers} (a plain min(run_at): {scan_buffers})"
    );
    // A walk over the delayed entries reads hundreds of index pages (~500
    // for 100k); skipping them is a few descents of the index.
    assert!(
        take_buffers < 50,
        "a take read {take_buffers} buffers: it walks the delayed jobs"
    );
    assert!(
        next_due_buffers < 50,
        "the next-due lookup read {next_due_buffers} buffers: it walks the pending jobs"
    );
    drop(client);

    // Through the store: the due jobs come out in order, then nothing.
    let queues = vec!["q".to_owned()];
    for id in &due {
        let leased = testing::take(&store, &["q"])
            .await
            .expect("take")
            .expect("a due job");
        assert_eq!(leased.job.id, *id);
    }
    assert!(testing::take(&store, &["q"]).await.expect("take").is_none());
    // What a waiter sleeps until: the delayed jobs' hour.
    let next = store
        .next_run_at(&queues)
        .await
        .expect("next_run_at")
        .expect("pending jobs remain");
    let ahead = next
        .duration_since(SystemTime::now())
        .expect("the next due job is in the future");
    assert!(
        ahead > Duration::from_secs(3500) && ahead <= Duration::from_secs(3600),
        "next due in {ahead:?}"
    );
}

/// ListJobs by status reads its page from `jobq_jobs_status`, for a status
/// no job has as for one nearly all have, even under a generic plan (which
/// a prepared statement may switch to after five runs): not a walk in id
/// order over 100k jobs of other statuses. By key without a queue, likewise
/// from `jobq_jobs_by_key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_list_by_status_reads_its_page_from_the_status_index() {
    const PENDING: i64 = 100_000;
    let url = testing::fresh_database("jobq_plan").await;
    let store = store(&url).await;
    let client = store.backend().pool().get().await.expect("client");
    fill_pending(&client, PENDING, 0.0, 0).await;
    let mut failed = Vec::new();
    for _ in 0..3 {
        let id = store
            .enqueue(new_job(), SystemTime::now())
            .await
            .expect("enqueue")
            .job
            .id;
        store
            .cancel(id, "x".into(), SystemTime::now())
            .await
            .expect("cancel");
        failed.push(id);
    }
    client
        .batch_execute("ANALYZE jobq_jobs; SET plan_cache_mode = force_generic_plan")
        .await
        .expect("analyze");
    for queue in [false, true] {
        for status in [
            Status::Failed,
            Status::Running,
            Status::Done,
            Status::Pending,
        ] {
            let filters = ListFilters {
                queue,
                status: Some(status),
                key: false,
            };
            let (name, types, args) = if queue {
                (
                    "by_queue",
                    "bigint, bigint, boolean, text",
                    "0, 51, true, 'q'",
                )
            } else {
                ("all_queues", "bigint, bigint, boolean", "0, 51, true")
            };
            client
                .batch_execute(&format!(
                    "DEALLOCATE ALL; PREPARE list ({types}) AS {}",
                    list_sizes(filters)
                ))
                .await
                .expect("prepare");
            let read = buffers(&client, &format!("EXECUTE list({args})")).await;
            println!("ListJobs {name} {status:?}, first page of 50: {read} buffers");
            assert!(
                read < 50,
                "ListJobs {name} {status:?} read {read} buffers: it walks the other statuses"
            );
        }
    }
    // By key, in any queue ("where is order 4711's email?"): from
    // `jobq_jobs_by_key`, not a scan of every job.
    let filters = ListFilters {
        queue: false,
        status: None,
        key: true,
    };
    client
        .batch_execute(&format!(
            "DEALLOCATE ALL; PREPARE list (bigint, bigint, boolean, text) AS {}",
            list_sizes(filters)
        ))
        .await
        .expect("prepare");
    let read = buffers(&client, "EXECUTE list(0, 51, true, 'order-4711')").await;
    println!("ListJobs by key in any queue, first page of 50: {read} buffers");
    assert!(
        read < 50,
        "ListJobs by key read {read} buffers: it scans every job"
    );
    drop(client);

    let page = store
        .list(ListFilter {
            status: Some(Status::Failed),
            limit: 50,
            ..ListFilter::default()
        })
        .await
        .expect("list");
    let ids: Vec<_> = page.jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, failed);
    assert_eq!(page.next, None);
}
