//! Three real `jobq serve` processes on one real PostgreSQL:
//! lease-ended events cross servers, a dead worker's and a dead server's
//! jobs come back, keys hold across servers, order 4711 gets one email, and
//! a schedule ticks once per tick however many servers run it.
//! The cluster comes from `JOBQ_TEST_PG` (see `scripts/pg-test.sh`); each
//! test gets a database of its own.

use std::time::{Duration, Instant};

use jobq::pb::{self, lease_event::Event};
use jobq_client::{Client, EnqueueOptions};
use jobq_server::store::postgres::testing;
use tonic::Streaming;

use crate::{
    harness::{until, ServerProcess},
    worker::{emails_for, EmailWorker},
};

/// `--server-timeout` of the test clusters: short, so a dead server is
/// found quickly.
const SERVER_TIMEOUT: Duration = Duration::from_secs(2);

/// Three servers over one fresh database, started at once (so their
/// migrations race for the advisory lock).
struct Cluster {
    servers: Vec<ServerProcess>,
    url: String,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        let url = testing::fresh_database("jobq_e2e").await;
        let dir = tempfile::tempdir().expect("tempdir");
        let timeout = humantime::format_duration(SERVER_TIMEOUT).to_string();
        let servers = std::thread::scope(|s| {
            let started: Vec<_> = (0..3)
                .map(|i| {
                    let (url, timeout, data) = (&url, &timeout, dir.path().join(format!("s{i}")));
                    s.spawn(move || {
                        ServerProcess::start(
                            &data,
                            &[
                                "--store",
                                url,
                                "--server-timeout",
                                timeout,
                                "--min-lease",
                                "10ms",
                            ],
                        )
                    })
                })
                .collect();
            started
                .into_iter()
                .map(|h| h.join().expect("start a server"))
                .collect()
        });
        Cluster {
            servers,
            url,
            _dir: dir,
        }
    }

    async fn client(&self, i: usize) -> Client {
        self.servers[i].client().await
    }
}

async fn open(c: &Client, worker: &str, capacity: u32) -> Streaming<pb::LeaseEvent> {
    c.lease(["q"], worker, capacity, Some(Duration::from_secs(60)))
        .await
        .expect("lease")
}

/// The next leased job on a stream, failing the test after 10 s.
async fn next_leased(stream: &mut Streaming<pb::LeaseEvent>) -> pb::LeasedJob {
    let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event within 10s")
        .expect("stream ok")
        .expect("stream open")
        .event
        .expect("event set");
    match event {
        Event::Leased(l) => l,
        other => panic!("expected a leased job, got {other:?}"),
    }
}

fn job_id(l: &pb::LeasedJob) -> String {
    l.job.as_ref().expect("job").id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_through_server_2_frees_the_stream_slot_on_server_1() {
    let cluster = Cluster::start().await;
    let (c1, c2) = (cluster.client(0).await, cluster.client(1).await);
    for _ in 0..2 {
        c1.enqueue("q", "k", vec![], EnqueueOptions::new())
            .await
            .expect("enqueue");
    }
    let mut stream = open(&c1, "w", 1).await;
    let first = next_leased(&mut stream).await;
    // Capacity 1, a 60 s lease: only the ack, made on another server and
    // told to server 1 by NOTIFY, can free the slot for the second job.
    c2.ack(job_id(&first), first.lease_id.clone())
        .await
        .expect("ack through server 2");
    let second = next_leased(&mut stream).await;
    assert_ne!(job_id(&first), job_id(&second));
}

/// The database stalls every server's heartbeat for longer than
/// `--server-timeout` (here: a transaction holds their `jobq_servers` rows,
/// as a stalled WAL fsync would hold their commits). When it clears, no
/// server may take the others' shared silence for death and reclaim a live
/// stream's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_stall_longer_than_the_timeout_reclaims_no_live_lease() {
    let cluster = Cluster::start().await;
    let c1 = cluster.client(0).await;
    c1.enqueue("q", "k", vec![], EnqueueOptions::new())
        .await
        .expect("enqueue");
    let mut stream = open(&c1, "w", 1).await;
    let leased = next_leased(&mut stream).await;

    let (mut db, connection) = tokio_postgres::connect(&cluster.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let stall = db.transaction().await.expect("begin");
    stall
        .execute("SELECT id FROM jobq_servers FOR UPDATE", &[])
        .await
        .expect("lock the servers' rows");
    // The stall itself: one and a half timeouts without a heartbeat.
    tokio::time::sleep(SERVER_TIMEOUT * 3 / 2).await;
    stall.rollback().await.expect("end the stall");
    let ended = std::time::SystemTime::now();

    // Every server heartbeats again, and then a whole timeout (and a
    // margin) passes: the window in which a server would judge the others.
    until(
        Duration::from_secs(20),
        "every server heartbeating again",
        || {
            let db = &db;
            async move {
                let oldest: std::time::SystemTime = db
                    .query_one("SELECT min(heartbeat_at) FROM jobq_servers", &[])
                    .await
                    .ok()?
                    .get(0);
                (oldest > ended).then_some(())
            }
        },
    )
    .await;
    let judged = Instant::now() + SERVER_TIMEOUT + Duration::from_secs(1);
    until(
        Duration::from_secs(20),
        "a timeout past the stall",
        || async { (Instant::now() > judged).then_some(()) },
    )
    .await;
    let job = c1.get_job(job_id(&leased)).await.expect("get");
    assert_eq!(job.status, pb::JobStatus::Running as i32, "{job:?}");
    assert_eq!(job.attempts, 0, "no reclaim: {job:?}");
    c1.ack(job_id(&leased), leased.lease_id.clone())
        .await
        .expect("the stream's lease still acks");
}

/// Every connection the servers hold to the database is cut at once, as a
/// failover or a database restart cuts them: pools, LISTEN connections and
/// heartbeats. The many-servers chapter promises that the servers keep running and
/// reconnect: calls may fail UNAVAILABLE meanwhile, and then an enqueue
/// through one server reaches a stream on another, and an ack through a
/// third frees that stream's slot, with no server restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_database_connection_cut_the_servers_reconnect_and_serve_on() {
    let mut cluster = Cluster::start().await;
    let (c1, c2, c3) = (
        cluster.client(0).await,
        cluster.client(1).await,
        cluster.client(2).await,
    );
    c1.enqueue("q", "k", vec![], EnqueueOptions::new())
        .await
        .expect("enqueue");
    let mut stream = open(&c1, "w", 1).await;
    let first = next_leased(&mut stream).await;

    let (db, connection) = tokio_postgres::connect(&cluster.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let cut: i64 = db
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("terminate the servers' connections")
        .get(0);
    // Each server holds at least its LISTEN connection and a pooled one.
    assert!(cut >= 6, "cut {cut} connections");

    // The second job, through server 2, retried while it is UNAVAILABLE.
    let second = until(
        Duration::from_secs(20),
        "an enqueue through server 2",
        || {
            let c2 = &c2;
            async move {
                match c2.enqueue("q", "k", vec![], EnqueueOptions::new()).await {
                    Ok((job, _)) => Some(job.id),
                    Err(e) => {
                        assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
                        None
                    }
                }
            }
        },
    )
    .await;
    // The slot is full until the ack through server 3 is heard by server
    // 1, over its new LISTEN connection or its re-check after reconnecting.
    until(Duration::from_secs(20), "an ack through server 3", || {
        let (c3, first) = (&c3, &first);
        async move {
            match c3.ack(job_id(first), first.lease_id.clone()).await {
                Ok(_) => Some(()),
                Err(e) => {
                    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
                    None
                }
            }
        }
    })
    .await;
    let next = next_leased(&mut stream).await;
    assert_eq!(job_id(&next), second, "the job enqueued after the cut");
    for s in &mut cluster.servers {
        let exited = s.child.try_wait().expect("try_wait");
        assert_eq!(exited, None, "no server exited");
    }
}

/// A worker's connection to server 1 goes half-open: the worker gives up
/// on it, reconnects to server 2 and declares its lease, which server 2
/// adopts. Server 1's old stream is told the lease moved (and frees its
/// slot); when server 1 finally sees that stream end, it reclaims nothing:
/// the worker's ack lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ending_late_on_one_server_leaves_a_lease_another_adopted() {
    let cluster = Cluster::start().await;
    let (c1, c2) = (cluster.client(0).await, cluster.client(1).await);
    c1.enqueue("q", "k", vec![], EnqueueOptions::new())
        .await
        .expect("enqueue");
    let mut old = open(&c1, "w", 1).await;
    let leased = next_leased(&mut old).await;
    let (db, connection) = tokio_postgres::connect(&cluster.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let holder = || async {
        db.query_one(
            "SELECT lease_server FROM jobq_jobs WHERE id = $1",
            &[&job_id(&leased).parse::<i64>().unwrap()],
        )
        .await
        .ok()?
        .get::<_, Option<String>>(0)
    };
    let first = holder().await.expect("server 1's stream holds it");

    let held = vec![pb::LeaseRef {
        job_id: job_id(&leased),
        lease_id: leased.lease_id.clone(),
        progress: None,
    }];
    let (_new, _token) = c2
        .lease_with_token(["q"], "w", 1, Some(Duration::from_secs(60)), held)
        .await
        .expect("reconnect to server 2");
    until(
        Duration::from_secs(10),
        "server 2 adopting the lease",
        || async { holder().await.filter(|s| *s != first).map(drop) },
    )
    .await;

    let moved = tokio::time::timeout(Duration::from_secs(10), old.message())
        .await
        .expect("an event within 10s")
        .expect("stream ok")
        .and_then(|e| e.event);
    match moved {
        Some(Event::Revoked(r)) => {
            assert_eq!(r.lease_id, leased.lease_id);
            assert!(r.reason.contains("another server"), "{}", r.reason);
        }
        other => panic!("expected the old stream to be told, got {other:?}"),
    }
    drop(old);
    c2.ack(job_id(&leased), leased.lease_id.clone())
        .await
        .expect("the adopted lease still acks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_1_killed_servers_2_and_3_reclaim_its_stream_leases_in_time() {
    let mut cluster = Cluster::start().await;
    let (c1, c2) = (cluster.client(0).await, cluster.client(1).await);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (job, _) = c2
            .enqueue("q", "k", vec![], EnqueueOptions::new())
            .await
            .expect("enqueue");
        ids.push(job.id);
    }
    let mut stream = open(&c1, "w", 3).await;
    for _ in 0..3 {
        next_leased(&mut stream).await;
    }
    cluster.servers[0].kill9();
    let killed = Instant::now();
    let limit = SERVER_TIMEOUT + Duration::from_secs(1);
    until(
        Duration::from_secs(30),
        "server 1's leases reclaimed by the others",
        || async {
            for id in &ids {
                let j = c2.get_job(id.clone()).await.expect("get");
                if j.status != pb::JobStatus::Pending as i32 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let took = killed.elapsed();
    assert!(
        took <= limit,
        "reclaimed {took:?} after the kill; --server-timeout {SERVER_TIMEOUT:?} + 1s allows {limit:?}"
    );
    for id in &ids {
        let j = c2.get_job(id.clone()).await.expect("get");
        assert_eq!(j.attempts, 1);
        assert_eq!(
            j.history[0].outcome,
            pb::AttemptOutcome::WorkerDisconnected as i32
        );
        assert_eq!(j.last_error, "worker disconnected");
    }
    // Server 3 hands them out again.
    let c3 = cluster.client(2).await;
    let mut again = open(&c3, "w2", 3).await;
    for _ in 0..3 {
        next_leased(&mut again).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_of_one_key_through_three_servers_make_one_job() {
    let cluster = Cluster::start().await;
    let mut clients = Vec::new();
    for i in 0..3 {
        clients.push(cluster.client(i).await);
    }
    let mut calls = tokio::task::JoinSet::new();
    for round in 0..10 {
        for c in &clients {
            let c = c.clone();
            calls.spawn(async move {
                c.enqueue(
                    "emails",
                    "send-email",
                    format!("try {round}").into_bytes(),
                    EnqueueOptions::new().key("order-4711"),
                )
                .await
                .expect("enqueue")
            });
        }
    }
    let mut ids = std::collections::HashSet::new();
    let mut created = 0;
    while let Some(result) = calls.join_next().await {
        let (job, was_created) = result.expect("task");
        ids.insert(job.id);
        created += usize::from(was_created);
    }
    assert_eq!(created, 1, "exactly one enqueue created the job");
    assert_eq!(ids.len(), 1, "every enqueue got the same job");
    let listed = clients[2]
        .list_jobs(pb::ListJobsRequest {
            queue: "emails".into(),
            key: "order-4711".into(),
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(listed.jobs.len(), 1);
}

/// The seed's story across servers: enqueued through server 3, sent by a
/// worker on server 1 that is SIGKILLed before it acks (the job is due
/// again within 1 s, seen from server 2), then done by a worker on server
/// 2 that finds the email already sent: one email.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_4711_across_servers_a_killed_worker_is_due_again_within_1s_and_one_email() {
    let cluster = Cluster::start().await;
    let (c2, c3) = (cluster.client(1).await, cluster.client(2).await);
    let dir = tempfile::tempdir().expect("tempdir");
    let mailbox = dir.path().join("mailbox");
    let email = serde_json::json!({ "order": "order-4711", "to": "ada@example.com" });
    let (job, _) = c3
        .enqueue_json(
            "emails",
            "send-email",
            &email,
            EnqueueOptions::new().key("order-4711"),
        )
        .await
        .expect("enqueue");

    let mut first = EmailWorker::start(&cluster.servers[0].url(), &mailbox, &["--hang-after-send"]);
    first.expect_line("SENT order-4711").await;
    first.child.kill().expect("SIGKILL");
    let killed = Instant::now();
    let _ = first.child.wait();
    let back = until(
        Duration::from_secs(10),
        "job 4711 PENDING after the kill",
        || async {
            let j = c2.get_job(job.id.clone()).await.expect("get");
            (j.status == pb::JobStatus::Pending as i32).then_some(j)
        },
    )
    .await;
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_secs(1),
        "due again {took:?} after the kill"
    );
    assert_eq!(back.attempts, 1);
    assert_eq!(
        back.history[0].outcome,
        pb::AttemptOutcome::WorkerDisconnected as i32
    );

    let mut second = EmailWorker::start(&cluster.servers[1].url(), &mailbox, &[]);
    second.expect_line("SKIP order-4711").await;
    until(Duration::from_secs(10), "job 4711 DONE", || async {
        let j = c3.get_job(job.id.clone()).await.expect("get");
        (j.status == pb::JobStatus::Done as i32).then_some(j)
    })
    .await;
    assert_eq!(emails_for(&mailbox, "order-4711"), 1);
}

/// A worker whose server dies reconnects to another server within
/// `--server-timeout` and declares its lease: that server adopts it, so it
/// is not reclaimed as the dead server's orphan, and the worker's ack
/// through the new server lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_adopted_by_another_server_outlives_its_dead_server() {
    let mut cluster = Cluster::start().await;
    let (c1, c2) = (cluster.client(0).await, cluster.client(1).await);
    let (job, _) = c2
        .enqueue("q", "k", vec![], EnqueueOptions::new())
        .await
        .expect("enqueue");
    let mut stream = open(&c1, "w", 1).await;
    let leased = next_leased(&mut stream).await;
    cluster.servers[0].kill9();
    let killed = Instant::now();
    // The worker reconnects to server 2 and declares what it holds.
    let held = vec![pb::LeaseRef {
        job_id: job.id.clone(),
        lease_id: leased.lease_id.clone(),
        progress: None,
    }];
    let (_adopting, _) = c2
        .lease_with_token(["q"], "w", 1, Some(Duration::from_secs(60)), held)
        .await
        .expect("lease on server 2");
    assert!(
        killed.elapsed() < SERVER_TIMEOUT,
        "the test reconnected too late to prove anything"
    );
    // Well past the timeout plus a tick, the job is still the worker's.
    let wait_until = killed + SERVER_TIMEOUT + Duration::from_secs(2);
    tokio::time::sleep_until(wait_until.into()).await;
    let j = c2.get_job(job.id.clone()).await.expect("get");
    assert_eq!(
        j.status,
        pb::JobStatus::Running as i32,
        "not reclaimed: {j:?}"
    );
    let acked = c2
        .ack(job.id.clone(), leased.lease_id.clone())
        .await
        .expect("the worker's ack through server 2");
    assert_eq!(acked.status, pb::JobStatus::Done as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_enqueue_each_tick_of_a_schedule_once() {
    let cluster = Cluster::start().await;
    let c = cluster.client(0).await;
    c.inner()
        .create_schedule(pb::CreateScheduleRequest {
            name: "every-second".into(),
            queue: "ticks".into(),
            kind: "tick".into(),
            cron: "* * * * * *".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    // Every server runs a scheduler over the shared table; each tick's
    // key makes it one job. Wait for a few ticks.
    let jobs = until(Duration::from_secs(30), "4 ticks", || async {
        let page = c
            .list_jobs(pb::ListJobsRequest {
                queue: "ticks".into(),
                page_size: 1000,
                omit_payload: true,
                ..Default::default()
            })
            .await
            .expect("list");
        (page.jobs.len() >= 4).then_some(page.jobs)
    })
    .await;
    let mut keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    keys.sort_unstable();
    let n = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), n, "a tick was enqueued twice: {keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("schedule:every-second:")));
    // The other servers see the schedule too (and its last run).
    let listed = cluster
        .client(2)
        .await
        .inner()
        .list_schedules(pb::ListSchedulesRequest {})
        .await
        .expect("list schedules")
        .into_inner()
        .schedules;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].last_run_at.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_server_2_sees_the_ack_made_through_server_1() {
    let cluster = Cluster::start().await;
    let (c1, c2) = (cluster.client(0).await, cluster.client(1).await);
    let (job, _) = c1
        .enqueue("q", "k", vec![], EnqueueOptions::new())
        .await
        .expect("enqueue");
    let waiting = {
        let id = job.id.clone();
        tokio::spawn(async move { c2.wait(id, Duration::from_secs(20)).await })
    };
    let mut stream = open(&c1, "w", 1).await;
    let leased = next_leased(&mut stream).await;
    let acked_at = Instant::now();
    c1.ack_with_result(job_id(&leased), leased.lease_id.clone(), b"sent".to_vec())
        .await
        .expect("ack");
    let done = waiting.await.expect("join").expect("DONE through server 2");
    eprintln!(
        "wait on server 2 returned {:?} after the ack through server 1",
        acked_at.elapsed()
    );
    assert_eq!(done.result.as_deref(), Some(&b"sent"[..]));
}
