//! What the Rust Worker tells a running handler, and what it tells the
//! application: a cancelled job's handler runs its own cancel branch
//! within `cancel_grace` (its future is not dropped first), a handler
//! hears `draining` at shutdown, a snooze and a drain deadline put a job
//! back without spending an attempt, and a worker that cannot reach its
//! server says so (`on_connection_error`) and gives up when asked to
//! (`give_up_after`).

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use jobq::pb;
use jobq_client::{EnqueueOptions, Error, HandlerError, JobContext, Worker};
use tokio_util::sync::CancellationToken;

use crate::harness::{free_port, until, TestServer};

/// A worker on queue `q` with one slot and a long lease.
fn worker(url: &str, shutdown: &CancellationToken) -> jobq_client::WorkerBuilder {
    Worker::builder(url)
        .queues(["q"])
        .capacity(1)
        .lease(Duration::from_secs(600))
        .drain_timeout(Duration::from_secs(10))
        .shutdown(shutdown.clone())
}

#[tokio::test]
async fn a_cancelled_handler_runs_its_own_cancel_branch_within_the_grace() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let started = Arc::new(tokio::sync::Notify::new());
    let cleaned_up: Arc<Mutex<Option<Instant>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let (s, done) = (Arc::clone(&started), Arc::clone(&cleaned_up));
    let w = worker(&server.url(), &shutdown)
        .cancel_grace(Duration::from_secs(5))
        .handler("slow", move |ctx: JobContext| {
            let (s, done) = (Arc::clone(&s), Arc::clone(&done));
            async move {
                s.notify_one();
                tokio::select! {
                    _ = ctx.cancelled() => {
                        // The cleanup awaits, as a real rollback would.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        *done.lock().unwrap() = Some(Instant::now());
                        Err(HandlerError::retry("stopped: the job was cancelled"))
                    }
                    () = std::future::pending::<()>() => Ok(()),
                }
            }
        })
        .build();
    let run = tokio::spawn(w.run());
    let (job, _) = c
        .enqueue("q", "slow", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(20), started.notified())
        .await
        .expect("the handler starts");
    let sent = Instant::now();
    c.cancel_job(job.id.clone(), "order refunded")
        .await
        .expect("cancel");
    let at = until(
        Duration::from_secs(5),
        "the handler's cancel branch",
        || {
            let done = Arc::clone(&cleaned_up);
            async move { *done.lock().unwrap() }
        },
    )
    .await;
    assert!(
        at.duration_since(sent) < Duration::from_secs(2),
        "{:?}",
        at - sent
    );
    // Its error is not reported: the lease was revoked with the cancel.
    let j = c.get_job(job.id.clone()).await.expect("get");
    assert_eq!(j.status, pb::JobStatus::Failed as i32);
    assert_eq!(j.last_error, "cancelled: order refunded");
    shutdown.cancel();
    run.await.expect("join").expect("worker");
}

#[tokio::test]
async fn a_handler_hears_draining_at_shutdown_and_its_job_is_acked() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let started = Arc::new(tokio::sync::Notify::new());
    let shutdown = CancellationToken::new();
    let s = Arc::clone(&started);
    let w = worker(&server.url(), &shutdown)
        .handler("long", move |ctx: JobContext| {
            let s = Arc::clone(&s);
            async move {
                assert!(!ctx.is_draining());
                s.notify_one();
                // A long job that checkpoints and stops early on a drain.
                tokio::select! {
                    _ = ctx.draining() => Ok(()),
                    () = tokio::time::sleep(Duration::from_secs(600)) => {
                        Err(HandlerError::fatal("never told of the drain"))
                    }
                }
            }
        })
        .build();
    let run = tokio::spawn(w.run());
    let (job, _) = c
        .enqueue("q", "long", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(20), started.notified())
        .await
        .expect("the handler starts");
    let asked = Instant::now();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the drain ends as soon as the handler returns")
        .expect("join")
        .expect("worker");
    assert!(asked.elapsed() < Duration::from_secs(5));
    let j = c.get_job(job.id.clone()).await.expect("get");
    assert_eq!(
        (j.status, j.attempts),
        (pb::JobStatus::Done as i32, 0),
        "acked: {j:?}"
    );
}

#[tokio::test]
async fn a_call_that_gets_no_reply_names_the_server_in_one_line() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let c = jobq_client::Client::connect_lazy(url.clone()).expect("lazy");
    let err = c.stats(None).await.expect_err("nothing listens");
    assert!(err.is_transient());
    assert_eq!(err.code(), Some(tonic::Code::Unavailable));
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("no reply from {url} (Unavailable): ")),
        "{text}"
    );
    assert!(text.to_lowercase().contains("connection refused"), "{text}");
    assert!(!format!("{err:?}").contains('\n'), "{err:?}");
}

#[tokio::test]
async fn a_worker_without_a_server_reports_each_failure_and_gives_up_when_asked() {
    // Nothing listens on this port.
    let url = format!("http://127.0.0.1:{}", free_port());
    let reports = Arc::new(AtomicUsize::new(0));
    let longest: Arc<Mutex<Duration>> = Arc::default();
    let (n, l) = (Arc::clone(&reports), Arc::clone(&longest));
    let shutdown = CancellationToken::new();
    let w = worker(&url, &shutdown)
        .give_up_after(Duration::from_secs(1))
        .on_connection_error(move |err, down_for| {
            assert!(err.is_transient(), "{err}");
            n.fetch_add(1, Ordering::SeqCst);
            let mut l = l.lock().unwrap();
            *l = (*l).max(down_for);
        })
        .handler("k", |_ctx: JobContext| async { Ok::<(), HandlerError>(()) })
        .build();
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), w.run())
        .await
        .expect("run returned instead of retrying for ever")
        .expect_err("no server: gives up");
    assert!(started.elapsed() >= Duration::from_secs(1));
    let Error::Unreachable { down_for, last } = &err else {
        panic!("expected Unreachable, got {err:?}");
    };
    assert!(*down_for >= Duration::from_secs(1), "{down_for:?}");
    assert!(!last.is_empty());
    // How much past the second it gives up depends on the reconnect
    // backoff and the machine's load; the message names the time.
    assert!(
        err.to_string().starts_with(&format!(
            "no lease stream for {:.1} s",
            down_for.as_secs_f64()
        )),
        "{err}"
    );
    assert!(reports.load(Ordering::SeqCst) >= 2, "each failure reported");
    assert!(*longest.lock().unwrap() >= Duration::from_secs(1));
}

#[tokio::test]
async fn a_handler_that_snoozes_puts_its_job_back_without_spending_an_attempt() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let r = Arc::clone(&runs);
    let w = worker(&server.url(), &shutdown)
        .handler("charge", move |_ctx: JobContext| {
            let r = Arc::clone(&r);
            async move {
                // The payment API says "429, Retry-After" twice, then works.
                if r.fetch_add(1, Ordering::SeqCst) < 2 {
                    return Err(HandlerError::snooze(
                        "429: retry after 100ms",
                        Duration::from_millis(100),
                    ));
                }
                Ok(())
            }
        })
        .build();
    let run = tokio::spawn(w.run());
    // One attempt: counted, the first snooze would dead-letter it.
    let (job, _) = c
        .enqueue("q", "charge", "x", EnqueueOptions::new().max_attempts(1))
        .await
        .expect("enqueue");
    let done = until(Duration::from_secs(20), "the job DONE", || async {
        let j = c.get_job(job.id.clone()).await.expect("get");
        (j.status == pb::JobStatus::Done as i32).then_some(j)
    })
    .await;
    assert_eq!(done.attempts, 0, "{done:?}");
    let outcomes: Vec<i32> = done.history.iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        [
            pb::AttemptOutcome::Snoozed as i32,
            pb::AttemptOutcome::Snoozed as i32,
            pb::AttemptOutcome::Acked as i32
        ]
    );
    assert_eq!(done.history[0].error, "429: retry after 100ms");
    shutdown.cancel();
    run.await.expect("join").expect("worker");
}

#[tokio::test]
async fn a_job_cut_off_by_the_drain_deadline_is_given_back_without_spending_an_attempt() {
    let server = TestServer::start().await;
    let c = server.client().await;
    let started = Arc::new(tokio::sync::Notify::new());
    let shutdown = CancellationToken::new();
    let s = Arc::clone(&started);
    let w = worker(&server.url(), &shutdown)
        .drain_timeout(Duration::from_millis(200))
        .cancel_grace(Duration::ZERO)
        .handler("stuck", move |_ctx: JobContext| {
            let s = Arc::clone(&s);
            async move {
                s.notify_one();
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let run = tokio::spawn(w.run());
    let (job, _) = c
        .enqueue("q", "stuck", "x", EnqueueOptions::new())
        .await
        .expect("enqueue");
    tokio::time::timeout(Duration::from_secs(20), started.notified())
        .await
        .expect("the handler starts");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the drain ends at its deadline")
        .expect("join")
        .expect("worker");
    let j = c.get_job(job.id.clone()).await.expect("get");
    assert_eq!(
        (j.status, j.attempts),
        (pb::JobStatus::Pending as i32, 0),
        "due again at once, no attempt spent: {j:?}"
    );
    let last = j.history.last().expect("the cut-off run");
    assert_eq!(last.outcome, pb::AttemptOutcome::Snoozed as i32);
    assert!(last.error.contains("drain deadline"), "{}", last.error);
}
