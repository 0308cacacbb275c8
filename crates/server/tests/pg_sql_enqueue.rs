//! Enqueue from SQL (docs/src/sql-enqueue.md): `jobq_enqueue(…)` called in
//! the application's own transaction makes a job if and only if that
//! transaction commits, wakes the Lease streams at commit, holds a key once
//! against concurrent SQL and gRPC enqueues, refuses bad input with an SQL
//! error, and is all the role `jobq_producer` may do. Needs `JOBQ_TEST_PG`
//! (see `scripts/pg-test.sh`).

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use jobq_server::{
    job::{JobId, Status},
    leases::LeaseHub,
    store::{
        postgres::{testing, EnqueueLimits, PgOptions, PgStore},
        Store,
    },
    validate::{StreamSpec, TakeSpec},
    Config, Error,
};
use tokio_postgres::{error::SqlState, Client, NoTls};
use tokio_stream::StreamExt;

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect as the application");
    tokio::spawn(connection);
    client
}

fn id_of(row: &tokio_postgres::Row) -> JobId {
    JobId(u64::try_from(row.get::<_, i64>(0)).expect("a positive id"))
}

async fn jobs_in(client: &Client, queue: &str) -> i64 {
    client
        .query_one("SELECT count(*) FROM jobq_jobs WHERE queue = $1", &[&queue])
        .await
        .expect("count")
        .get(0)
}

#[tokio::test]
async fn a_job_enqueued_in_sql_exists_once_its_transaction_commits_and_wakes_a_stream() {
    let url = testing::fresh_database("jobq_sql_commit").await;
    let config = Arc::new(Config::with_data("unused"));
    let store = Arc::new(testing::store(testing::options(&url)).await);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let hub = LeaseHub::new(Arc::clone(&store), Arc::clone(&config), shutdown.clone());
    let spec = StreamSpec {
        take: TakeSpec {
            queues: vec!["emails".into()],
            worker_id: "w".into(),
            owner: None,
            lease: Duration::from_secs(30),
        },
        capacity: 1,
        held: vec![],
        caller: None,
    };
    let (mut events, _token) = hub.open(spec, (), || None).expect("open a stream");

    let mut app = connect(&url).await;
    let outside = connect(&url).await;
    let tx = app.transaction().await.expect("begin");
    tx.execute("CREATE TABLE orders (id bigint PRIMARY KEY)", &[])
        .await
        .expect("the application's own write");
    let row = tx
        .query_one(
            "SELECT jobq_enqueue(queue => 'emails', kind => 'send-email', \
             payload => convert_to('{\"order\":4711}', 'UTF8'), key => 'order-4711', \
             priority => 5, metadata => '{\"tenant\":\"acme\"}')",
            &[],
        )
        .await
        .expect("enqueue from SQL");
    let id = id_of(&row);
    assert_eq!(
        jobs_in(&outside, "emails").await,
        0,
        "not before the commit"
    );
    tx.commit().await.expect("commit");

    let event = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("the commit wakes the stream")
        .expect("open")
        .expect("an event");
    let Some(jobq::pb::lease_event::Event::Leased(leased)) = event.event else {
        panic!("expected a leased job, got {event:?}");
    };
    let job = leased.job.expect("the job");
    assert_eq!(job.id, id.to_string());
    assert_eq!(job.kind, "send-email");
    assert_eq!(job.payload, br#"{"order":4711}"#);

    let stored = store.get(id).await.expect("the job");
    assert_eq!(stored.key.as_deref(), Some("order-4711"));
    assert_eq!(stored.priority, 5);
    assert_eq!(stored.max_attempts, 3, "the server's default");
    assert_eq!(stored.status, Status::Running);
    assert_eq!(
        stored.metadata.get("tenant").map(String::as_str),
        Some("acme")
    );
    let stats = store
        .stats(Some("emails"), SystemTime::now())
        .await
        .expect("stats");
    let emails = stats.iter().find(|s| s.queue == "emails").expect("counted");
    assert_eq!(emails.running, 1, "the counts see it: {stats:?}");
    shutdown.cancel();
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_no_job() {
    let url = testing::fresh_database("jobq_sql_rollback").await;
    let store = testing::store(testing::options(&url)).await;
    let mut app = connect(&url).await;
    let tx = app.transaction().await.expect("begin");
    let row = tx
        .query_one("SELECT jobq_enqueue('emails', 'send-email')", &[])
        .await
        .expect("enqueue from SQL");
    let id = id_of(&row);
    tx.rollback().await.expect("rollback");
    assert!(matches!(store.get(id).await, Err(Error::NotFound(_))));
    assert!(testing::take(&store, &["emails"]).await.unwrap().is_none());
    assert_eq!(jobs_in(&app, "emails").await, 0);
}

#[tokio::test]
async fn one_key_in_concurrent_sql_and_grpc_enqueues_makes_one_job() {
    let url = testing::fresh_database("jobq_sql_keys").await;
    let store = Arc::new(testing::store(testing::options(&url)).await);
    let mut first = connect(&url).await;
    let mut second = connect(&url).await;
    let watcher = connect(&url).await;
    let enqueue = "SELECT jobq_enqueue('emails', 'send-email', key => 'order-4711')";

    let tx1 = first.transaction().await.expect("begin");
    let held = id_of(&tx1.query_one(enqueue, &[]).await.expect("first"));
    // A second transaction and a gRPC enqueue of the same key wait for the
    // first transaction's outcome.
    let sql = tokio::spawn(async move {
        let tx2 = second.transaction().await.expect("begin");
        let id = id_of(&tx2.query_one(enqueue, &[]).await.expect("second"));
        tx2.commit().await.expect("commit");
        id
    });
    let grpc = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let mut job = testing::job("emails");
            job.key = Some("order-4711".into());
            store.enqueue(job, SystemTime::now()).await
        })
    };
    testing::until_lock_waiters(&watcher, 2, "both wait on the key", || false).await;
    tx1.commit().await.expect("commit");

    assert_eq!(
        sql.await.unwrap(),
        held,
        "the second transaction got the first's job"
    );
    let enqueued = grpc.await.unwrap().expect("gRPC enqueue");
    assert!(!enqueued.created);
    assert_eq!(enqueued.job.id, held);
    assert_eq!(jobs_in(&watcher, "emails").await, 1);

    // And the other way round: a key a gRPC enqueue holds.
    let tx = first.transaction().await.expect("begin");
    let again = id_of(&tx.query_one(enqueue, &[]).await.expect("again"));
    tx.commit().await.expect("commit");
    assert_eq!(again, held);
}

#[tokio::test]
async fn bad_input_is_an_sql_error_and_changes_nothing() {
    let url = testing::fresh_database("jobq_sql_bad").await;
    let _store = testing::store(PgOptions {
        enqueue: EnqueueLimits {
            max_payload: 16,
            max_metadata_bytes: 16,
            ..EnqueueLimits::of(&Config::with_data("unused"))
        },
        ..testing::options(&url)
    })
    .await;
    let app = connect(&url).await;
    let cases = [
        ("jobq_enqueue('', 'k')", "queue must not be empty"),
        (
            "jobq_enqueue('emails', 'send email')",
            r#"kind contains " ""#,
        ),
        (
            "jobq_enqueue('emails', 'k', key => repeat('k', 129))",
            "key is 129 characters long",
        ),
        (
            "jobq_enqueue('emails', 'k', payload => '\\x00112233445566778899aabbccddeeff00')",
            "payload is 17 bytes; the limit is 16 (--max-payload)",
        ),
        (
            "jobq_enqueue('emails', 'k', max_attempts => 1001)",
            "max_attempts 1001 is over the limit of 1000",
        ),
        (
            "jobq_enqueue('emails', 'k', max_attempts => -1)",
            "max_attempts -1 is negative",
        ),
        (
            "jobq_enqueue('emails', 'k', priority => 101)",
            "priority 101 is out of range",
        ),
        (
            "jobq_enqueue('emails', 'k', delay => interval '-1 second')",
            "is negative",
        ),
        (
            "jobq_enqueue('emails', 'k', delay => interval '400 days')",
            "(--max-delay)",
        ),
        (
            "jobq_enqueue('emails', 'k', run_at => now(), delay => interval '1 second')",
            "give run_at or delay, not both",
        ),
        (
            "jobq_enqueue('emails', 'k', metadata => '[1]')",
            "metadata must be a JSON object of strings, not array",
        ),
        (
            "jobq_enqueue('emails', 'k', metadata => '{\"a b\":\"x\"}')",
            "metadata key contains",
        ),
        (
            "jobq_enqueue('emails', 'k', metadata => '{\"a\":1}')",
            "metadata value of \"a\" must be a string, not number",
        ),
        (
            "jobq_enqueue('emails', 'k', metadata => '{\"tenant\":\"01234567890\"}')",
            "metadata is 17 bytes",
        ),
    ];
    for (call, expected) in cases {
        let err = app
            .query_one(&format!("SELECT {call}"), &[])
            .await
            .expect_err(call);
        let db = err.as_db_error().unwrap_or_else(|| panic!("{call}: {err}"));
        assert_eq!(
            db.code(),
            &SqlState::INVALID_PARAMETER_VALUE,
            "{call}: {db}"
        );
        assert!(
            db.message().starts_with("jobq_enqueue: ") && db.message().contains(expected),
            "{call}: {:?} does not say {expected:?}",
            db.message()
        );
    }
    assert_eq!(jobs_in(&app, "emails").await, 0);
    // At the limits, it is accepted.
    app.query_one(
        "SELECT jobq_enqueue('emails', 'k', payload => '\\x00112233445566778899aabbccddeeff', \
         metadata => '{\"tenant\":\"0123456789\"}', run_at => now() + interval '1 hour')",
        &[],
    )
    .await
    .expect("at the limits");
}

#[tokio::test]
async fn the_producer_role_may_enqueue_and_nothing_else() {
    let url = testing::fresh_database("jobq_sql_role").await;
    let _store = testing::store(testing::options(&url)).await;
    let admin = connect(&url).await;
    let app_role = format!("jobq_app_{:08x}", rand::random::<u32>());
    admin
        .batch_execute(&format!(
            "CREATE ROLE {app_role} LOGIN IN ROLE jobq_producer"
        ))
        .await
        .expect("create the application's role");
    let mut as_app: tokio_postgres::Config = url.parse().unwrap();
    as_app.user(&app_role);
    let (app, connection) = as_app.connect(NoTls).await.expect("connect as the app");
    tokio::spawn(connection);

    // Where jobq's schema lets others create objects, what they put there
    // never runs as jobq's owner inside the function (its search_path is
    // pg_catalog alone).
    admin
        .batch_execute(&format!("GRANT CREATE ON SCHEMA public TO {app_role}"))
        .await
        .expect("let the app create in public");
    app.batch_execute(
        "CREATE FUNCTION public.hijack(jsonb, jsonb) RETURNS text LANGUAGE plpgsql AS \
         $$BEGIN RAISE EXCEPTION 'hijacked as %', current_user; END$$; \
         CREATE OPERATOR public.#>> (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = public.hijack); \
         CREATE FUNCTION public.octet_length(text) RETURNS integer LANGUAGE plpgsql AS \
         $$BEGIN RAISE EXCEPTION 'hijacked as %', current_user; END$$",
    )
    .await
    .expect("plant objects in public");
    let enqueued = app
        .query_one(
            "SELECT jobq_enqueue('emails', 'send-email', metadata => '{\"tenant\":\"acme\"}')",
            &[],
        )
        .await;
    app.batch_execute(
        "DROP OPERATOR public.#>> (jsonb, jsonb); DROP FUNCTION public.hijack(jsonb, jsonb); \
         DROP FUNCTION public.octet_length(text)",
    )
    .await
    .expect("clean up");
    admin
        .batch_execute(&format!("REVOKE CREATE ON SCHEMA public FROM {app_role}"))
        .await
        .expect("revoke");
    let denied = app.query("SELECT * FROM jobq_jobs", &[]).await;
    let insert = app
        .execute(
            "UPDATE jobq_enqueue_limits SET max_payload = 1000000000",
            &[],
        )
        .await;
    drop(app);
    admin
        .batch_execute(&format!("DROP ROLE {app_role}"))
        .await
        .ok();
    enqueued.expect("jobq_producer may call jobq_enqueue");
    for refused in [denied.map(|_| ()), insert.map(|_| ())] {
        let err = refused.expect_err("jobq_producer may not touch the tables");
        assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");
    }
    // PUBLIC may not call it: only roles that were granted it.
    let public: bool = admin
        .query_one(
            "SELECT has_function_privilege('public', 'jobq_enqueue(text, text, bytea, text, \
             timestamptz, interval, integer, integer, jsonb)', 'EXECUTE')",
            &[],
        )
        .await
        .expect("privileges")
        .get(0);
    assert!(!public);
}

#[tokio::test]
async fn the_limits_start_at_the_defaults_and_each_server_publishes_its_own() {
    let url = testing::fresh_database("jobq_sql_limits").await;
    jobq_server::store::postgres::migrate(&url)
        .await
        .expect("migrate");
    let app = connect(&url).await;
    let read = || async {
        let row = app
            .query_one(
                "SELECT max_payload, default_max_attempts, max_attempts, max_metadata_bytes, \
                 extract(epoch FROM max_delay)::float8 FROM jobq_enqueue_limits",
                &[],
            )
            .await
            .expect("the limits");
        EnqueueLimits {
            max_payload: usize::try_from(row.get::<_, i64>(0)).unwrap(),
            default_max_attempts: u32::try_from(row.get::<_, i64>(1)).unwrap(),
            max_attempts_limit: u32::try_from(row.get::<_, i64>(2)).unwrap(),
            max_metadata_bytes: usize::try_from(row.get::<_, i64>(3)).unwrap(),
            max_delay: Duration::from_secs_f64(row.get::<_, f64>(4)),
        }
    };
    let defaults = EnqueueLimits::of(&Config::with_data("unused"));
    assert_eq!(
        read().await,
        defaults,
        "the migration's row is the flags' defaults"
    );
    let custom = EnqueueLimits {
        max_payload: 100,
        default_max_attempts: 7,
        max_attempts_limit: 9,
        max_metadata_bytes: 10,
        max_delay: Duration::from_secs(90),
    };
    let _store: PgStore = testing::store(PgOptions {
        enqueue: custom.clone(),
        ..testing::options(&url)
    })
    .await;
    assert_eq!(read().await, custom);
    let id = id_of(
        &app.query_one("SELECT jobq_enqueue('emails', 'k')", &[])
            .await
            .expect("enqueue"),
    );
    let attempts: i32 = app
        .query_one(
            "SELECT max_attempts FROM jobq_jobs WHERE id = $1",
            &[&i64::try_from(id.0).unwrap()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 7, "the published default");
}
