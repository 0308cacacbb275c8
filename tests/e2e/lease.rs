//! The Lease stream, driven with the raw generated client: push delivery,
//! capacity, stream-drop reclaim, revocation, grace, draining and shutdown.

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use jobq::pb::{self, lease_event::Event};
use jobq_client::{Client, EnqueueOptions};
use tonic::Streaming;

use crate::harness::{http_get, until, ServerProcess, TestServer};

async fn open(
    c: &Client,
    queues: &[&str],
    worker: &str,
    capacity: u32,
    lease: Duration,
) -> Streaming<pb::LeaseEvent> {
    let req = pb::LeaseRequest {
        queues: queues.iter().map(|q| q.to_string()).collect(),
        worker_id: worker.into(),
        capacity,
        lease_duration: Some(lease.try_into().expect("duration")),
        held: vec![],
    };
    c.inner().lease(req).await.expect("lease").into_inner()
}

/// The next event, failing the test after 5 s.
async fn next(stream: &mut Streaming<pb::LeaseEvent>) -> Event {
    tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("an event within 5s")
        .expect("stream ok")
        .expect("stream open")
        .event
        .expect("event set")
}

async fn next_leased(stream: &mut Streaming<pb::LeaseEvent>) -> pb::LeasedJob {
    match next(stream).await {
        Event::Leased(l) => l,
        other => panic!("expected a leased job, got {other:?}"),
    }
}

/// True when nothing arrives on the stream for `quiet`.
async fn silent(stream: &mut Streaming<pb::LeaseEvent>, quiet: Duration) -> bool {
    tokio::time::timeout(quiet, stream.message()).await.is_err()
}

async fn enqueue_n(c: &Client, queue: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            c.enqueue(queue, "k", format!("{i}"), EnqueueOptions::new())
                .await
                .expect("enqueue")
                .0
                .id,
        );
    }
    ids
}

async fn status_of(c: &Client, id: &str) -> pb::Job {
    c.get_job(id.to_owned()).await.expect("get")
}

#[tokio::test]
async fn jobs_are_pushed_up_to_capacity_and_a_slot_frees_on_ack() {
    let server = TestServer::start().await;
    let c = server.client().await;
    enqueue_n(&c, "q", 5).await;
    let mut stream = open(&c, &["q"], "w1", 2, Duration::from_secs(30)).await;
    let a = next_leased(&mut stream).await;
    let _b = next_leased(&mut stream).await;
    assert!(
        silent(&mut stream, Duration::from_millis(300)).await,
        "never more than capacity unfinished jobs"
    );
    c.ack(a.job.expect("job").id, a.lease_id)
        .await
        .expect("ack");
    let _c = next_leased(&mut stream).await;
    assert!(silent(&mut stream, Duration::from_millis(200)).await);
}

#[tokio::test]
async fn a_job_is_pushed_the_moment_it_is_enqueued() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let mut stream = open(&c, &["q"], "w1", 1, Duration::from_secs(30)).await;
    assert!(silent(&mut stream, Duration::from_millis(100)).await);
    let (job, _) = c
        .enqueue("q", "k", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    assert_eq!(next_leased(&mut stream).await.job.expect("job").id, job.id);
}

#[tokio::test]
async fn queues_are_served_in_strict_priority_order() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let low = enqueue_n(&c, "low", 2).await;
    let high = enqueue_n(&c, "high", 2).await;
    let mut stream = open(&c, &["high", "low"], "w1", 1, Duration::from_secs(30)).await;
    let mut order = Vec::new();
    for _ in 0..4 {
        let l = next_leased(&mut stream).await;
        let id = l.job.expect("job").id;
        c.ack(id.clone(), l.lease_id).await.expect("ack");
        order.push(id);
    }
    assert_eq!(order, [high, low].concat());
}

#[tokio::test]
async fn a_dropped_stream_gives_its_jobs_back_at_once() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let ids = enqueue_n(&c, "q", 2).await;
    let mut stream = open(&c, &["q"], "w1", 2, Duration::from_secs(600)).await;
    next_leased(&mut stream).await;
    next_leased(&mut stream).await;
    drop(stream);
    for id in &ids {
        let job = until(
            Duration::from_secs(1),
            "reclaim within 1s of the drop",
            || async {
                let j = status_of(&c, id).await;
                (j.status == pb::JobStatus::Pending as i32).then_some(j)
            },
        )
        .await;
        assert_eq!(job.attempts, 1);
        assert_eq!(job.last_error, "worker disconnected");
        assert_eq!(
            job.history[0].outcome,
            pb::AttemptOutcome::WorkerDisconnected as i32
        );
    }
}

#[tokio::test]
async fn a_hung_worker_loses_its_lease_and_is_told() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let ids = enqueue_n(&c, "q", 1).await;
    let mut stream = open(&c, &["q"], "w1", 1, Duration::from_millis(200)).await;
    let leased = next_leased(&mut stream).await;
    // No heartbeat: the lease expires and the stream is told.
    match next(&mut stream).await {
        Event::Revoked(r) => {
            assert_eq!(
                (r.job_id.as_str(), r.lease_id.as_str()),
                (ids[0].as_str(), leased.lease_id.as_str())
            );
            assert_eq!(r.reason, "lease expired");
        }
        other => panic!("expected revoked, got {other:?}"),
    }
    // The worker may be frozen: its stream gets nothing more until it
    // heartbeats, and the job goes to another worker.
    let mut other = open(&c, &["q"], "w2", 1, Duration::from_secs(60)).await;
    let again = next_leased(&mut other).await;
    assert_eq!(again.job.as_ref().expect("job").id, ids[0]);
    assert_ne!(again.lease_id, leased.lease_id);
    let err = c
        .ack(ids[0].clone(), leased.lease_id)
        .await
        .expect_err("stale");
    assert_eq!(err.code(), Some(tonic::Code::Aborted));
}

#[tokio::test]
async fn a_heartbeat_within_the_grace_keeps_the_lease() {
    // A 3 s grace: the heartbeat below must land inside it even on a
    // loaded 2-core CI machine (500 ms once did not).
    // A server process: both its listeners on port 0, the HTTP one for
    // /metrics below.
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(dir.path(), &["--disconnect-grace", "3s"]);
    let http = server.http;
    let c = server.client().await;
    let ids = enqueue_n(&c, "q", 2).await;
    let mut stream = open(&c, &["q"], "w1", 2, Duration::from_secs(60)).await;
    let a = next_leased(&mut stream).await;
    let _b = next_leased(&mut stream).await;
    drop(stream);
    // The grace starts when the server sees the stream end; a heartbeat
    // that gets there first keeps nothing (the concepts chapter's row for a stream
    // that ends).
    until(
        Duration::from_secs(10),
        "the server to see the stream end",
        || async {
            let (_, metrics) = http_get(http, "/metrics").await;
            metrics
                .lines()
                .any(|l| l == "jobq_lease_streams 0")
                .then_some(())
        },
    )
    .await;
    let kept = pb::LeaseRef {
        job_id: a.job.clone().expect("job").id,
        lease_id: a.lease_id.clone(),
        progress: None,
    };
    assert!(c
        .heartbeat("w1", vec![kept], None)
        .await
        .expect("heartbeat")
        .is_empty());
    let other = if ids[0] == a.job.clone().expect("job").id {
        &ids[1]
    } else {
        &ids[0]
    };
    until(
        Duration::from_secs(15),
        "the unheartbeated job to be reclaimed after the grace",
        || async {
            (status_of(&c, other).await.status == pb::JobStatus::Pending as i32).then_some(())
        },
    )
    .await;
    let job = status_of(&c, &a.job.expect("job").id).await;
    assert_eq!(
        job.status,
        pb::JobStatus::Running as i32,
        "the heartbeated job stays leased"
    );
    c.ack(job.id, a.lease_id).await.expect("ack");
}

#[tokio::test]
async fn a_draining_worker_gets_no_new_jobs_and_loses_nothing_when_it_closes() {
    let server = TestServer::start().await;
    let c = server.client().await;
    enqueue_n(&c, "q", 3).await;
    let (mut stream, token) = c
        .lease_with_token(["q"], "w1", 1, Some(Duration::from_secs(60)), vec![])
        .await
        .expect("lease");
    let a = next_leased(&mut stream).await;
    let lease = pb::LeaseRef {
        job_id: a.job.clone().expect("job").id,
        lease_id: a.lease_id.clone(),
        progress: None,
    };
    c.heartbeat_draining("w1", vec![lease], None, token)
        .await
        .expect("heartbeat");
    c.ack(lease_job(&a), a.lease_id.clone()).await.expect("ack");
    assert!(
        silent(&mut stream, Duration::from_millis(300)).await,
        "nothing new while draining"
    );
    drop(stream);
    let stats = c.stats(Some("q")).await.expect("stats");
    assert_eq!(
        (stats[0].pending, stats[0].running, stats[0].done),
        (2, 0, 1)
    );
    let jobs = c
        .list_jobs(pb::ListJobsRequest {
            queue: "q".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .jobs;
    assert!(
        jobs.iter().all(|j| j.attempts == 0),
        "closing after a drain reclaims nothing"
    );
}

fn lease_job(l: &pb::LeasedJob) -> String {
    l.job.as_ref().expect("job").id.clone()
}

#[tokio::test]
async fn streams_share_a_queue_and_none_starves() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let mut a = open(&c, &["q"], "wa", 2, Duration::from_secs(60)).await;
    let mut b = open(&c, &["q"], "wb", 2, Duration::from_secs(60)).await;
    enqueue_n(&c, "q", 4).await;
    let mut seen = HashSet::new();
    for _ in 0..2 {
        assert!(seen.insert(lease_job(&next_leased(&mut a).await)));
        assert!(seen.insert(lease_job(&next_leased(&mut b).await)));
    }
    assert_eq!(seen.len(), 4, "four distinct jobs, two per stream");
}

#[tokio::test]
async fn server_shutdown_ends_streams_without_reclaiming() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::at(dir.path()).await;
    let c = server.client().await;
    let ids = enqueue_n(&c, "q", 1).await;
    let mut stream = open(&c, &["q"], "w1", 1, Duration::from_secs(60)).await;
    let leased = next_leased(&mut stream).await;
    let stopping = tokio::spawn(server.stop());
    let end = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the stream ends");
    // UNAVAILABLE, as a long-poll gets: a worker can tell a restart from a
    // normal end of its stream.
    match end {
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
        other => panic!("expected UNAVAILABLE after shutdown, got {other:?}"),
    }
    drop(stream);
    stopping.await.expect("server stopped");
    // Shutdown is not worker death: the lease is kept across the restart.
    let server = TestServer::at(dir.path()).await;
    let c = server.client().await;
    let job = status_of(&c, &ids[0]).await;
    assert_eq!(
        (job.status, job.attempts),
        (pb::JobStatus::Running as i32, 0)
    );
    c.ack(ids[0].clone(), leased.lease_id)
        .await
        .expect("the old lease still acks");
}

/// A TCP proxy to the server that can go silent: it stops forwarding in both
/// directions but keeps both sockets open, like a peer whose machine froze
/// or whose network vanished without a FIN.
async fn freezable_proxy(server: std::net::SocketAddr) -> (String, Arc<AtomicBool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let frozen = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&frozen);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = tokio::net::TcpStream::connect(server)
                .await
                .expect("connect upstream");
            let (cr, cw) = client.into_split();
            let (ur, uw) = upstream.into_split();
            tokio::spawn(pipe(cr, uw, Arc::clone(&flag)));
            tokio::spawn(pipe(ur, cw, Arc::clone(&flag)));
        }
    });
    (url, frozen)
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            // Silent: hold both sockets open, forward nothing, ever.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_silent_peer_is_found_by_http2_keepalive_and_its_jobs_reclaimed() {
    let server = TestServer::with(|c| {
        c.keepalive_interval = Duration::from_millis(200);
        c.keepalive_timeout = Duration::from_millis(300);
    })
    .await;
    let c = server.client().await;
    let ids = enqueue_n(&c, "q", 1).await;
    let (proxy, frozen) = freezable_proxy(server.addr).await;
    let worker = Client::connect(proxy)
        .await
        .expect("connect through the proxy");
    let mut stream = open(&worker, &["q"], "w1", 1, Duration::from_secs(600)).await;
    next_leased(&mut stream).await;
    // No FIN, no RST: the worker just goes silent.
    frozen.store(true, Ordering::SeqCst);
    let job = until(
        Duration::from_secs(5),
        "keepalive to drop the silent connection",
        || async {
            let j = status_of(&c, &ids[0]).await;
            (j.status == pb::JobStatus::Pending as i32).then_some(j)
        },
    )
    .await;
    assert_eq!(
        job.history[0].outcome,
        pb::AttemptOutcome::WorkerDisconnected as i32,
        "not a lease expiry: the lease is 10 minutes"
    );
    drop(stream);
}
