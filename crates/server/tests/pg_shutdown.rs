//! A graceful shutdown on PostgreSQL while a Lease stream's take waits on
//! the database: the take finishes, its job (which no worker received) is
//! given back without an attempt, and only then does the server leave the
//! registry. Had it left first, the take would have committed a lease of a
//! departed server, which the others reclaim as worker disconnected,
//! spending an attempt on a job that was never sent. A real server on
//! 127.0.0.1:0 over `JOBQ_TEST_PG` (see `scripts/pg-test.sh`).

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use jobq::pb::{self, job_queue_client::JobQueueClient};
use jobq_server::{
    job::{JobId, Status},
    store::{
        postgres::{testing, PgStore},
        Store,
    },
    Config,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_under_way_at_shutdown_is_given_back_before_the_server_leaves() {
    let url = testing::fresh_database("jobq_shutdown").await;
    let dir = tempfile::TempDir::new().unwrap();
    let mut config = Config::with_data(dir.path().join("data"));
    config.store = Some(url.clone());
    config.shutdown_timeout = Duration::from_secs(20);
    config.server_timeout = Duration::from_secs(1);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(jobq_server::serve(config, listener, shutdown.clone()));

    let mut c = loop {
        if let Ok(c) = JobQueueClient::connect(format!("http://{addr}")).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Due in a moment: the stream's take runs then, while the table is
    // locked below, and waits.
    let id = c
        .enqueue(pb::EnqueueRequest {
            queue: "q".into(),
            kind: "k".into(),
            delay: Some(Duration::from_millis(1500).try_into().unwrap()),
            ..Default::default()
        })
        .await
        .expect("enqueue")
        .into_inner()
        .job
        .unwrap()
        .id;
    let _stream = c
        .lease(pb::LeaseRequest {
            queues: vec!["q".into()],
            worker_id: "w".into(),
            capacity: 1,
            ..Default::default()
        })
        .await
        .expect("lease")
        .into_inner();
    let (mut admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let lock = admin.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE jobq_jobs IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let watcher = testing_client(&url).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE SKIP LOCKED%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the take never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    shutdown.cancel();
    // The server waits for the take before it leaves.
    let still = tokio::time::timeout(Duration::from_millis(500), async {
        while !server.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(still.is_err(), "the server stopped with a take under way");
    // Meanwhile it heartbeats: the others must not take a server that is
    // finishing its streams for dead (they would reclaim the leases it
    // keeps for its workers). Watched for three server timeouts.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        let fresh: bool = watcher
            .query_one(
                "SELECT bool_and(heartbeat_at > now() - interval '1 second') FROM jobq_servers",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(fresh, "a server shutting down stopped heartbeating");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lock.rollback().await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("the server stops once its stream is done")
        .unwrap()
        .unwrap();

    // A survivor finds nothing to reclaim: the job was given back.
    let survivor: Arc<PgStore> = Arc::new(testing::store(testing::options(&url)).await);
    let reclaimed = survivor.reclaim_orphaned(SystemTime::now()).await.unwrap();
    assert!(reclaimed.is_empty(), "{reclaimed:?}");
    let job = survivor.get(JobId(id.parse().unwrap())).await.unwrap();
    assert_eq!(job.status, Status::Pending, "{job:?}");
    assert_eq!(job.attempts, 0, "{job:?}");
}

async fn testing_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}
