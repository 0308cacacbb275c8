//! Faults once found, each reproduced against a real server: cancelled calls
//! on a slow disk, a failing disk (fail-stop), draining strangers, frozen
//! and non-reading workers, reconnects beyond capacity.

use std::time::Duration;

use jobq::pb::{self, lease_event::Event};
use jobq_client::{Client, EnqueueOptions};
use tonic::{Code, Streaming};

use crate::harness::{until, ServerProcess, TestServer};

async fn open(
    c: &Client,
    worker: &str,
    capacity: u32,
    lease: Duration,
    held: Vec<pb::LeaseRef>,
) -> (Streaming<pb::LeaseEvent>, String) {
    c.lease_with_token(["q"], worker, capacity, Some(lease), held)
        .await
        .expect("lease")
}

async fn next_leased(stream: &mut Streaming<pb::LeaseEvent>) -> pb::LeasedJob {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("an event within 5 s")
            .expect("stream ok")
            .expect("stream open");
        if let Some(Event::Leased(l)) = event.event {
            return l;
        }
    }
}

async fn silent(stream: &mut Streaming<pb::LeaseEvent>, quiet: Duration) -> bool {
    loop {
        match tokio::time::timeout(quiet, stream.message()).await {
            Err(_) => return true,
            Ok(Ok(Some(pb::LeaseEvent {
                event: Some(Event::Revoked(_)),
            }))) => continue,
            Ok(_) => return false,
        }
    }
}

async fn enqueue(c: &Client, payload: Vec<u8>) -> String {
    c.enqueue("q", "k", payload, EnqueueOptions::new().max_attempts(10))
        .await
        .expect("enqueue")
        .0
        .id
}

fn job_id(l: &pb::LeasedJob) -> String {
    l.job.as_ref().expect("job").id.clone()
}

fn lease_ref(l: &pb::LeasedJob) -> pb::LeaseRef {
    pb::LeaseRef {
        job_id: job_id(l),
        lease_id: l.lease_id.clone(),
        progress: None,
    }
}

async fn with_deadline<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = jobq_client::Result<T>>,
) -> Result<T, Code> {
    match tokio::time::timeout(deadline, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.code().unwrap_or(Code::Unknown)),
        Err(_) => Err(Code::DeadlineExceeded),
    }
}

/// Regression: a cancelled Ack freed its stream's slot only in the
/// RPC handler's continuation, which a client's deadline drops.
#[tokio::test]
async fn a_cancelled_ack_on_a_slow_disk_still_frees_the_stream_slot() {
    let server = TestServer::with(|c| c.fault_sync_delay = Some(Duration::from_millis(1500))).await;
    let c = server.client().await;
    let first = enqueue(&c, b"1".to_vec()).await;
    let second = enqueue(&c, b"2".to_vec()).await;
    let (mut stream, _) = open(&c, "w1", 1, Duration::from_secs(60), vec![]).await;
    let a = next_leased(&mut stream).await;
    assert_eq!(job_id(&a), first);
    let acked = with_deadline(
        Duration::from_millis(300),
        c.ack(first.clone(), a.lease_id.clone()),
    )
    .await;
    assert_eq!(acked.err(), Some(Code::DeadlineExceeded));
    let b = next_leased(&mut stream).await;
    assert_eq!(job_id(&b), second, "the freed slot takes the next job");
    until(Duration::from_secs(10), "the cancelled ack is DONE", || {
        let (c, id) = (c.clone(), first.clone());
        async move {
            let job = c.get_job(id).await.ok()?;
            (job.status == pb::JobStatus::Done as i32).then_some(())
        }
    })
    .await;
}

/// Regression: a cancelled Enqueue woke nobody.
#[tokio::test]
async fn a_cancelled_enqueue_on_a_slow_disk_still_reaches_an_idle_stream() {
    let server = TestServer::with(|c| c.fault_sync_delay = Some(Duration::from_millis(1500))).await;
    let c = server.client().await;
    let (mut stream, _) = open(&c, "w1", 1, Duration::from_secs(60), vec![]).await;
    let enqueued = with_deadline(
        Duration::from_millis(300),
        c.enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new()),
    )
    .await;
    assert_eq!(enqueued.err(), Some(Code::DeadlineExceeded));
    let leased = next_leased(&mut stream).await;
    assert_eq!(leased.job.expect("job").payload, b"x");
}

/// Regression: a draining heartbeat stopped every stream with the same
/// worker id, for good.
#[tokio::test]
async fn draining_stops_only_the_senders_own_stream() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (mut a, token_a) = open(&c, "same", 1, Duration::from_secs(60), vec![]).await;
    let (mut b, _) = open(&c, "same", 1, Duration::from_secs(60), vec![]).await;
    c.heartbeat_draining("same", vec![], None, token_a)
        .await
        .expect("heartbeat");
    let id = enqueue(&c, b"1".to_vec()).await;
    let got = next_leased(&mut b).await;
    assert_eq!(job_id(&got), id, "the other stream still gets work");
    c.ack(id, got.lease_id.clone()).await.expect("ack");
    assert!(silent(&mut a, Duration::from_millis(300)).await);
    drop(a);
    let id = enqueue(&c, b"2".to_vec()).await;
    assert_eq!(job_id(&next_leased(&mut b).await), id);
}

/// Regression: a frozen worker (its stream open, nothing read or
/// heartbeated) was fed the same job after each expiry.
#[tokio::test]
async fn a_stream_whose_lease_expired_unheartbeated_is_fed_again_only_after_a_heartbeat() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let (mut frozen, token) = open(&c, "w1", 1, Duration::from_millis(200), vec![]).await;
    let id = enqueue(&c, b"1".to_vec()).await;
    let first = next_leased(&mut frozen).await;
    assert_eq!(job_id(&first), id);
    // No heartbeat: the lease expires; the stream gets nothing more.
    assert!(silent(&mut frozen, Duration::from_millis(700)).await);
    let (mut other, _) = open(&c, "w2", 1, Duration::from_secs(60), vec![]).await;
    let again = next_leased(&mut other).await;
    assert_eq!(job_id(&again), id, "the job goes to another worker");
    c.ack(id, again.lease_id.clone()).await.expect("ack");
    // The frozen worker thaws and heartbeats: it is fed again.
    c.inner()
        .heartbeat(pb::HeartbeatRequest {
            worker_id: "w1".into(),
            stream_token: token,
            ..Default::default()
        })
        .await
        .expect("heartbeat");
    drop(other);
    let id = enqueue(&c, b"2".to_vec()).await;
    assert_eq!(job_id(&next_leased(&mut frozen).await), id);
}

/// Regression: a stream that does not read was fed up to its
/// capacity again and again, each expiry costing an attempt although not one
/// byte reached a worker.
#[tokio::test]
async fn a_stream_that_does_not_read_is_not_fed_and_costs_no_attempts() {
    let server = TestServer::start().await;
    let c = server.client().await;
    // 12 jobs of 600 KiB: the client's HTTP/2 window (2 MiB) takes a few.
    let mut ids = Vec::new();
    for i in 0..12u8 {
        ids.push(enqueue(&c, vec![i; 600 * 1024]).await);
    }
    let (stream, _) = open(&c, "w1", 10, Duration::from_millis(300), vec![]).await;
    // Never read. What is measured is what happens over time: five lease
    // lengths, in which the old server re-fed the stream after each expiry.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let tally = |c: Client, ids: Vec<String>| async move {
        let (mut running, mut attempts) = (0, 0);
        for id in ids {
            let job = c.get_job(id).await.expect("get");
            running += usize::from(job.status == pb::JobStatus::Running as i32);
            attempts += job.attempts;
        }
        (running, attempts)
    };
    let (running, attempts) = tally(c.clone(), ids.clone()).await;
    assert!(
        running <= 5,
        "a non-reading stream holds at most what the transport took: {running}"
    );
    assert!(
        attempts <= 5,
        "expiries of undelivered jobs cost no attempts: {attempts}"
    );
    drop(stream);
    // What it never pulled is given back at once, attempt-free.
    let (running, after) = until(Duration::from_secs(5), "nothing RUNNING", || {
        let (c, ids) = (c.clone(), ids.clone());
        async move {
            let (running, attempts) = tally(c, ids).await;
            (running == 0).then_some((running, attempts))
        }
    })
    .await;
    assert_eq!(running, 0);
    assert!(
        after <= 5,
        "{after} attempts spent on a worker that read nothing"
    );
}

/// Regression: after a reconnect a worker held its old leases plus a
/// full capacity of new ones.
#[tokio::test]
async fn a_reconnecting_worker_never_exceeds_its_capacity() {
    let server = TestServer::with(|c| c.disconnect_grace = Duration::from_secs(30)).await;
    let c = server.client().await;
    for i in 0..5u8 {
        enqueue(&c, vec![i]).await;
    }
    let (mut first, _) = open(&c, "w1", 2, Duration::from_secs(60), vec![]).await;
    let a = next_leased(&mut first).await;
    let b = next_leased(&mut first).await;
    // The connection drops (the grace keeps the leases); the worker comes
    // back declaring what it still holds.
    drop(first);
    let (mut second, _) = open(
        &c,
        "w1",
        2,
        Duration::from_secs(60),
        vec![lease_ref(&a), lease_ref(&b)],
    )
    .await;
    assert!(
        silent(&mut second, Duration::from_millis(400)).await,
        "full: the two held leases count"
    );
    c.ack(job_id(&a), a.lease_id.clone())
        .await
        .expect("the held lease acks");
    let next = next_leased(&mut second).await;
    assert_ne!(job_id(&next), job_id(&b));
    let running = c.stats(Some("q")).await.expect("stats")[0].running;
    assert_eq!(running, 2);
}

/// Regression: after a failed fsync the server went on serving.
#[tokio::test]
async fn a_failed_fsync_stops_the_server_and_it_exits_non_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(
        dir.path(),
        &["--fault-sync-after", "12", "--fault-sync-error", "EIO"],
    );
    let c = server.client().await;
    let (mut stream, _) = open(&c, "w1", 100, Duration::from_secs(60), vec![]).await;
    let mut acked = Vec::new();
    let err = loop {
        match c
            .enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
            .await
        {
            Ok((job, _)) => acked.push(job.id),
            Err(e) => break e,
        }
        assert!(acked.len() < 50, "the injected failure never came");
    };
    // UNAVAILABLE from a handler that saw the failure, or from a connection
    // the stopping server refused. The failing round may also be one a
    // take of the open stream asked for, with no enqueue in flight: then
    // the next enqueue can be sent just as the exiting server closes the
    // connection, and is CANCELLED (no server is left to answer it).
    assert!(
        matches!(err.code(), Some(Code::Unavailable | Code::Cancelled)),
        "{err:?}"
    );
    // The storage error itself is for the server's log (docs/src/design.md §2).
    // (The server exits after the fail-stop, so the first error may also be
    // a refused connection, which names the client's own OS error.)
    assert!(
        !err.to_string().contains("fsync") && !err.to_string().contains("sled"),
        "{err}"
    );
    // The stream ends, and nothing is pushed after the failure.
    let mut pushed = 0;
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("the stream ends")
        {
            Ok(Some(_)) => pushed += 1,
            other => break other,
        }
    };
    assert!(pushed <= acked.len(), "{pushed} pushed of {}", acked.len());
    match end {
        Err(status) => assert_eq!(status.code(), Code::Unavailable),
        Ok(None) => panic!("the stream ended with OK"),
        Ok(Some(_)) => unreachable!(),
    }
    let status = tokio::task::spawn_blocking(move || server.child.wait().expect("wait"))
        .await
        .expect("join");
    assert!(!status.success(), "the process exits non-zero: {status}");
    // A restart recovers every acknowledged enqueue from the disk.
    let server = ServerProcess::start(dir.path(), &[]);
    let c = server.client().await;
    for id in acked {
        c.get_job(id).await.expect("acknowledged enqueues survive");
    }
}

/// `--deliver-before-fsync`, as docs/src/durability.md says: a worker can be handed a
/// job whose enqueue a crash then undoes. Every flush round stalls
/// (`--fault-sync-delay`) before it writes anything out; the job is pushed
/// to a waiting worker while its enqueue waits for its round; a SIGKILL
/// then loses the round. The producer got no reply (and retries, with a
/// key if it must not run twice), and after the restart the job does not
/// exist, in no state.
#[tokio::test]
async fn with_deliver_before_fsync_a_pushed_job_vanishes_with_its_unacknowledged_enqueue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(
        dir.path(),
        &["--fault-sync-delay", "60s", "--deliver-before-fsync"],
    );
    let c = server.client().await;
    let (mut stream, _) = open(&c, "w1", 1, Duration::from_secs(60), vec![]).await;
    let enqueue = tokio::spawn({
        let c = c.clone();
        async move {
            c.enqueue("q", "k", b"order-4711".to_vec(), EnqueueOptions::new())
                .await
        }
    });
    let pushed = next_leased(&mut stream).await;
    assert_eq!(pushed.job.expect("job").payload, b"order-4711");
    server.kill9();
    assert!(
        enqueue.await.expect("join").is_err(),
        "the enqueue got no reply"
    );
    let server = ServerProcess::start(dir.path(), &[]);
    let left = server
        .client()
        .await
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .expect("list")
        .jobs;
    assert!(
        left.is_empty(),
        "neither the enqueue nor the take survived: {left:?}"
    );
}
