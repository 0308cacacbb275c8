// The operator's calls, part of the store contract: included by
// `suite.rs`, so they run against every backend.

#[tokio::test]
async fn cancel_dead_letters_a_pending_job_and_retry_brings_it_back() {
    let (_dir, store) = fresh().await;
    let job = enqueue(&store, "q", Some("order-1"), 0, at(0)).await;
    let cancelled = store
        .cancel(job.id, "duplicate order".into(), at(5))
        .await
        .expect("cancel");
    assert_eq!(cancelled.status, Status::Failed);
    assert_eq!(
        cancelled.last_error.as_deref(),
        Some("cancelled: duplicate order")
    );
    assert_eq!(cancelled.finished_at, Some(at(5)));
    assert_eq!(cancelled.attempts, 0);
    assert_eq!(receipt(store.get(job.id).await.unwrap()), cancelled);
    assert!(take(&store, "q", at(10)).await.is_none(), "never delivered");
    // A dead letter keeps its key, as any other.
    let again = store.enqueue(new_job("q", Some("order-1"), 0), at(11)).await;
    assert!(!again.unwrap().created);
    let back = store.retry(job.id, at(20)).await.expect("retry");
    assert_eq!(back.status, Status::Pending);
    assert_eq!(take(&store, "q", at(21)).await.unwrap().job.id, job.id);
}

#[tokio::test]
async fn cancel_revokes_a_running_lease_and_fences_its_holder() {
    let (_dir, store) = fresh().await;
    let ended = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&ended);
    store.on_lease_ended(Arc::new(move |e| seen.lock().unwrap().push(e.clone())));
    let job = enqueue(&store, "q", None, 0, at(0)).await;
    let leased = take(&store, "q", at(1)).await.unwrap();
    let cancelled = store
        .cancel(job.id, "stop".into(), at(5))
        .await
        .expect("cancel");
    assert_eq!(cancelled.status, Status::Failed);
    assert_eq!(cancelled.lease, None);
    assert_eq!(cancelled.attempts, 1);
    assert_eq!(cancelled.last_error.as_deref(), Some("cancelled: stop"));
    let attempt = cancelled.history.last().unwrap();
    assert_eq!(attempt.outcome, Some(Outcome::Revoked));
    assert_eq!(attempt.ended_at, Some(at(5)));
    {
        let ended = ended.lock().unwrap();
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert_eq!(ended[0].lease, leased.lease_id);
        assert_eq!(ended[0].outcome, Some(Outcome::Revoked));
        assert_eq!(ended[0].status, Status::Failed);
    }
    assert_eq!(
        code(store.ack(job.id, leased.lease_id, at(6)).await),
        Code::Aborted
    );
    assert_eq!(
        code(store.fail(job.id, report(leased.lease_id, None), at(6)).await),
        Code::Aborted
    );
    let extended = store
        .extend(&[(job.id, leased.lease_id)], &[], None, at(6))
        .await
        .unwrap();
    assert_eq!(code(extended.into_iter().next().unwrap()), Code::Aborted);
    assert_eq!(store.next_lease_expiry().await.unwrap(), None);
    assert_eq!(receipt(store.get(job.id).await.unwrap()), cancelled);
    let back = store.retry(job.id, at(20)).await.expect("retry");
    assert_eq!((back.status, back.attempts), (Status::Pending, 0));
    let again = take(&store, "q", at(21)).await.unwrap();
    assert_eq!(again.job.id, job.id);
    assert_ne!(again.lease_id, leased.lease_id);
}

#[tokio::test]
async fn cancel_of_a_finished_or_unknown_job_changes_nothing() {
    let (_dir, store) = fresh().await;
    enqueue(&store, "q", None, 0, at(0)).await;
    let leased = take(&store, "q", at(1)).await.unwrap();
    let done = store.ack(leased.job.id, leased.lease_id, at(2)).await.unwrap();
    assert_eq!(
        code(store.cancel(done.id, "late".into(), at(3)).await),
        Code::FailedPrecondition
    );
    assert_eq!(receipt(store.get(done.id).await.unwrap()), done);
    let pending = enqueue(&store, "q", None, 0, at(4)).await;
    let failed = store.cancel(pending.id, "x".into(), at(5)).await.unwrap();
    assert_eq!(
        code(store.cancel(failed.id, "again".into(), at(6)).await),
        Code::FailedPrecondition
    );
    assert_eq!(receipt(store.get(failed.id).await.unwrap()), failed);
    assert_eq!(
        code(store.cancel(JobId(424242), String::new(), at(7)).await),
        Code::NotFound
    );
}

#[tokio::test]
async fn a_cancel_survives_a_reopen() {
    let dir = guard().await;
    let (pending, running) = {
        let store = reopen(&dir).await;
        let a = enqueue(&store, "q", None, 0, at(0)).await;
        let b = enqueue(&store, "q", None, 0, at(1)).await;
        let leased = take(&store, "q", at(2)).await.unwrap();
        assert_eq!(leased.job.id, a.id);
        let running = store.cancel(a.id, "r".into(), at(3)).await.unwrap();
        let pending = store.cancel(b.id, "p".into(), at(3)).await.unwrap();
        (pending, running)
    };
    let store = reopen(&dir).await;
    assert_eq!(receipt(store.get(pending.id).await.unwrap()), pending);
    assert_eq!(receipt(store.get(running.id).await.unwrap()), running);
}

#[tokio::test]
async fn a_paused_queue_hands_out_nothing_until_resumed() {
    let (_dir, store) = fresh().await;
    let running = enqueue(&store, "q", None, 0, at(0)).await;
    let leased = take(&store, "q", at(1)).await.unwrap();
    assert_eq!(leased.job.id, running.id);
    store.set_paused("q", true).await.expect("pause");
    store.set_paused("q", true).await.expect("pausing twice is fine");
    // Enqueues are accepted; nothing is taken, and no waiter is told to
    // wake for a paused queue's due jobs.
    let waiting = enqueue(&store, "q", None, 0, at(2)).await;
    enqueue(&store, "other", None, 0, at(2)).await;
    assert!(take(&store, "q", at(10)).await.is_none());
    let both = store
        .take(&qs(&["q", "other"]), "w", None, LEASE, at(10))
        .await
        .unwrap()
        .expect("the other queue still delivers");
    assert_eq!(both.job.queue, "other");
    assert_eq!(store.next_run_at(&qs(&["q"])).await.unwrap(), None);
    // The running job finishes as usual.
    store.ack(running.id, leased.lease_id, at(11)).await.unwrap();
    let stats = store.stats(Some("q"), at(12)).await.unwrap();
    assert_eq!(stats.len(), 1);
    assert!(stats[0].paused);
    assert_eq!((stats[0].pending, stats[0].done), (1, 1));
    let all = store.stats(None, at(12)).await.unwrap();
    let flags: Vec<(&str, bool)> = all.iter().map(|s| (s.queue.as_str(), s.paused)).collect();
    assert_eq!(flags, [("other", false), ("q", true)]);

    let mut changes = store.changes();
    changes.borrow_and_update();
    store.set_paused("q", false).await.expect("resume");
    assert!(changes.has_changed().unwrap(), "a resume wakes waiters");
    assert!(!store.stats(Some("q"), at(13)).await.unwrap()[0].paused);
    assert_eq!(take(&store, "q", at(13)).await.unwrap().job.id, waiting.id);
    store.set_paused("q", false).await.expect("resuming twice is fine");
}

#[tokio::test]
async fn pausing_past_max_paused_queues_is_refused_and_changes_nothing() {
    let dir = guard().await;
    let cap = |c: &mut jobq_server::Config| c.max_paused_queues = 3;
    {
        let store = reopen_with(&dir, cap).await;
        for queue in ["a", "b", "c"] {
            store.set_paused(queue, true).await.expect("within the cap");
        }
        let err = store.set_paused("d", true).await.expect_err("a fourth");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        assert!(err.to_string().contains("--max-paused-queues"), "{err}");
        store
            .set_paused("a", true)
            .await
            .expect("pausing a paused queue at the cap is OK");
        enqueue(&store, "d", None, 0, at(0)).await;
        let paused: Vec<String> = store
            .stats(None, at(1))
            .await
            .unwrap()
            .into_iter()
            .filter(|s| s.paused)
            .map(|s| s.queue)
            .collect();
        assert_eq!(paused, ["a", "b", "c"], "the refused pause left nothing");
        assert!(take(&store, "d", at(2)).await.is_some(), "d is not paused");
        store.set_paused("b", false).await.expect("resume");
        store.set_paused("d", true).await.expect("room again");
    }
    // The count survives a reopen; the limit is the reopened store's.
    {
        let store = reopen_with(&dir, cap).await;
        let err = store.set_paused("e", true).await.expect_err("still full");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    }
    let store = reopen_with(&dir, |c| c.max_paused_queues = 4).await;
    store.set_paused("e", true).await.expect("a higher limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_pauses_stay_within_max_paused_queues() {
    let dir = guard().await;
    let store = Arc::new(reopen_with(&dir, |c| c.max_paused_queues = 3).await);
    let pauses = (0..12).map(|i| {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.set_paused(&format!("q{i}"), true).await })
    });
    let mut codes = Vec::new();
    for pause in pauses {
        codes.push(match pause.await.expect("no panic") {
            Ok(()) => Code::Ok,
            Err(e) => e.code(),
        });
    }
    let ok = codes.iter().filter(|&&c| c == Code::Ok).count();
    assert_eq!(ok, 3, "{codes:?}");
    assert!(
        codes.iter().all(|&c| matches!(c, Code::Ok | Code::ResourceExhausted)),
        "{codes:?}"
    );
    let stats = store.stats(None, at(0)).await.unwrap();
    assert_eq!(stats.iter().filter(|s| s.paused).count(), 3, "{stats:?}");
}

#[tokio::test]
async fn a_paused_queue_without_jobs_is_listed_and_a_pause_survives_a_reopen() {
    let dir = guard().await;
    {
        let store = reopen(&dir).await;
        store.set_paused("empty", true).await.unwrap();
        store.set_paused("q", true).await.unwrap();
        enqueue(&store, "q", None, 0, at(0)).await;
        store.set_paused("gone", true).await.unwrap();
        store.set_paused("gone", false).await.unwrap();
    }
    let store = reopen(&dir).await;
    assert!(take(&store, "q", at(10)).await.is_none(), "still paused");
    let stats = store.stats(None, at(10)).await.unwrap();
    let flags: Vec<(&str, bool, u64)> = stats
        .iter()
        .map(|s| (s.queue.as_str(), s.paused, s.pending))
        .collect();
    assert_eq!(flags, [("empty", true, 0), ("q", true, 1)]);
    // Names whose order depends on the collation (PostgreSQL's default
    // may put "a-c" after "ab"): each is still reported paused.
    for queue in ["ab", "a-c", "B", "b"] {
        store.set_paused(queue, true).await.unwrap();
        enqueue(&store, queue, None, 0, at(0)).await;
    }
    let stats = store.stats(None, at(10)).await.unwrap();
    assert!(stats.iter().all(|s| s.paused), "{stats:?}");
    for queue in ["ab", "a-c", "B", "b"] {
        store.set_paused(queue, false).await.unwrap();
    }
    assert_eq!(
        store.stats(Some("empty"), at(10)).await.unwrap(),
        vec![QueueStats {
            queue: "empty".into(),
            paused: true,
            ..QueueStats::default()
        }]
    );
    store.set_paused("q", false).await.unwrap();
    assert!(take(&store, "q", at(11)).await.is_some());
}

#[tokio::test]
async fn delete_removes_a_job_for_good_and_frees_its_key_but_not_a_running_one() {
    let (_dir, store) = fresh().await;
    let pending = enqueue(&store, "q", Some("k1"), 0, at(0)).await;
    let running_job = enqueue(&store, "q", Some("k2"), 0, at(1)).await;
    store.delete(pending.id).await.expect("delete a PENDING job");
    assert_eq!(code(store.get(pending.id).await), Code::NotFound);
    assert_eq!(code(store.delete(pending.id).await), Code::NotFound);
    let again = store.enqueue(new_job("q", Some("k1"), 0), at(2)).await.unwrap();
    assert!(again.created, "the key is free again");
    assert_ne!(again.job.id, pending.id, "ids are never reused");

    let leased = take(&store, "q", at(3)).await.unwrap();
    assert_eq!(leased.job.id, running_job.id);
    let err = store.delete(running_job.id).await.expect_err("running");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("cancel it first"), "{err}");
    assert_eq!(store.get(running_job.id).await.unwrap(), leased.job);
    let done = store.ack(leased.job.id, leased.lease_id, at(4)).await.unwrap();
    store.delete(done.id).await.expect("delete a DONE job");
    let failed = store.cancel(again.job.id, "x".into(), at(5)).await.unwrap();
    store.delete(failed.id).await.expect("delete a FAILED job");
    let stats = store.stats(Some("q"), at(6)).await.unwrap();
    assert_eq!(
        (stats[0].pending, stats[0].running, stats[0].done, stats[0].failed),
        (0, 0, 0, 0)
    );
    let fresh = store.enqueue(new_job("q", Some("k2"), 0), at(7)).await.unwrap();
    assert!(fresh.created);
}

#[tokio::test]
async fn a_delete_survives_a_reopen() {
    let dir = guard().await;
    let id = {
        let store = reopen(&dir).await;
        let job = enqueue(&store, "q", Some("k"), 0, at(0)).await;
        store.delete(job.id).await.unwrap();
        job.id
    };
    let store = reopen(&dir).await;
    assert_eq!(code(store.get(id).await), Code::NotFound);
    assert!(take(&store, "q", at(1)).await.is_none());
}

/// `n` jobs of `queue`, finished at `at(ms)`: DONE, or FAILED when `fail`.
async fn finished(store: &TestStore, queue: &str, n: usize, fail: bool, ms: u64) -> Vec<JobId> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let job = enqueue(store, queue, None, 0, at(ms)).await;
        ids.push(job.id);
        if fail {
            store.cancel(job.id, "old".into(), at(ms)).await.unwrap();
        } else {
            let leased = store
                .take(&qs(&[queue]), "w", None, LEASE, at(ms))
                .await
                .unwrap()
                .unwrap();
            store.ack(leased.job.id, leased.lease_id, at(ms)).await.unwrap();
        }
    }
    ids
}

#[tokio::test]
async fn purge_jobs_deletes_one_queues_finished_jobs_by_status_and_age() {
    let (_dir, store) = fresh().await;
    let old_done = finished(&store, "q", 3, false, 10).await;
    let old_failed = finished(&store, "q", 2, true, 10).await;
    let new_done = finished(&store, "q", 1, false, 500).await;
    let other = finished(&store, "other", 2, false, 10).await;
    let first = enqueue(&store, "q", None, 0, at(20)).await;
    let second = enqueue(&store, "q", None, 0, at(20)).await;
    let leased = store
        .take(&qs(&["q"]), "w", None, LEASE, at(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leased.job.id, first.id);
    let (running_id, pending_id) = (first.id, second.id);

    assert_eq!(
        store.purge_jobs("q", Some(Status::Done), at(100)).await.unwrap(),
        3
    );
    for id in &old_done {
        assert_eq!(code(store.get(*id).await), Code::NotFound);
    }
    for id in old_failed.iter().chain(&new_done).chain(&other) {
        assert!(store.get(*id).await.is_ok(), "job {id} kept");
    }
    assert_eq!(
        store.purge_jobs("q", Some(Status::Failed), at(100)).await.unwrap(),
        2
    );
    // Both statuses, up to a later time: the newer DONE job goes too, the
    // other queue's jobs and the PENDING and RUNNING ones never.
    assert_eq!(store.purge_jobs("q", None, at(10_000)).await.unwrap(), 1);
    assert_eq!(store.purge_jobs("q", None, at(10_000)).await.unwrap(), 0);
    assert_eq!(store.get(running_id).await.unwrap().status, Status::Running);
    assert_eq!(store.get(pending_id).await.unwrap().status, Status::Pending);
    for id in &other {
        assert!(store.get(*id).await.is_ok());
    }
    assert_eq!(
        code(store.purge_jobs("q", Some(Status::Running), at(10_000)).await),
        Code::InvalidArgument
    );
    assert_eq!(store.get(running_id).await.unwrap().status, Status::Running);
    assert_eq!(store.get(pending_id).await.unwrap().status, Status::Pending);
}

/// The service over `store`, as a server runs it (no tokens: open).
fn service(
    store: &Arc<TestStore>,
) -> (
    Arc<jobq_server::service::JobQueueService<TestStore>>,
    tokio_util::sync::CancellationToken,
) {
    let config = Arc::new(jobq_server::Config::with_data("unused"));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let hub = jobq_server::leases::LeaseHub::new(
        Arc::clone(store),
        Arc::clone(&config),
        shutdown.clone(),
    );
    let svc = jobq_server::service::JobQueueService::new(
        Arc::clone(store),
        hub,
        config,
        shutdown.clone(),
    );
    (Arc::new(svc), shutdown)
}

fn purge_request(
    queue: &str,
    status: i32,
    finished_before: Option<SystemTime>,
) -> tonic::Request<jobq::pb::PurgeJobsRequest> {
    tonic::Request::new(jobq::pb::PurgeJobsRequest {
        queue: queue.into(),
        status,
        finished_before: finished_before.map(Into::into),
    })
}

/// Counts of one queue: (pending, running, done, failed).
async fn counts(store: &TestStore, queue: &str) -> (u64, u64, u64, u64) {
    let stats = store.stats(Some(queue), at(1_000_000)).await.unwrap();
    stats
        .iter()
        .find(|s| s.queue == queue)
        .map_or((0, 0, 0, 0), |s| (s.pending, s.running, s.done, s.failed))
}

/// A purge of more than ten thousand PENDING jobs of one queue, through
/// the RPC: every PENDING job of that queue goes, in many short batches,
/// while a Lease stream on another queue keeps being served; the queue's
/// RUNNING job and every job of the other queues stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_pending_jobs_leaves_other_queues_and_running_jobs_and_serves_streams() {
    use jobq::pb::{self, job_queue_server::JobQueue};
    use tokio_stream::StreamExt;

    let (_dir, store) = fresh().await;
    let store = Arc::new(store);
    const JUNK: usize = 10_500;
    for chunk in 0..JUNK / 1_500 {
        let batch = (0..1_500)
            .map(|i| new_job("junk", None, if i % 10 == 0 { 3_600_000 } else { 0 }))
            .collect();
        store.enqueue_batch(batch, at(chunk as u64)).await.unwrap();
    }
    let running = take(&*store, "junk", at(100)).await.expect("a junk job");
    let others: Vec<JobId> = store
        .enqueue_batch((0..50).map(|_| new_job("other", None, 0)).collect(), at(100))
        .await
        .unwrap()
        .iter()
        .map(|e| e.job.id)
        .collect();
    let other_running = take(&*store, "other", at(101)).await.expect("an other job");
    assert_eq!(counts(&store, "junk").await, (JUNK as u64 - 1, 1, 0, 0));

    let (svc, shutdown) = service(&store);
    let mut stream = svc
        .lease(tonic::Request::new(pb::LeaseRequest {
            queues: vec!["work".into()],
            worker_id: "w".into(),
            capacity: 1,
            ..Default::default()
        }))
        .await
        .expect("lease")
        .into_inner();
    let purge = tokio::spawn({
        let svc = Arc::clone(&svc);
        async move {
            svc.purge_jobs(purge_request("junk", pb::JobStatus::Pending as i32, None))
                .await
        }
    });
    // Until the purge ends: a job enqueued on the stream's queue is pushed
    // to it, and acked, freeing the stream's slot for the next.
    let mut served_meanwhile = 0;
    while !purge.is_finished() {
        let job = store
            .enqueue(new_job("work", None, 0), SystemTime::now())
            .await
            .unwrap()
            .job;
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the stream pushes the job during the purge");
        let Some(Ok(pb::LeaseEvent {
            event: Some(pb::lease_event::Event::Leased(leased)),
        })) = event
        else {
            panic!("expected a leased job, got {event:?}");
        };
        assert_eq!(leased.job.as_ref().unwrap().id, job.id.to_string());
        let lease = LeaseId(leased.lease_id.parse().unwrap());
        store.ack(job.id, lease, SystemTime::now()).await.unwrap();
        if !purge.is_finished() {
            served_meanwhile += 1;
        }
    }
    let deleted = purge
        .await
        .unwrap()
        .expect("a purge of PENDING jobs")
        .into_inner()
        .deleted;
    assert_eq!(deleted, JUNK as u64 - 1);
    assert!(
        served_meanwhile > 0,
        "the stream was served while the purge ran"
    );
    println!("{served_meanwhile} jobs went through the stream during the purge");
    assert_eq!(counts(&store, "junk").await, (0, 1, 0, 0));
    assert_eq!(counts(&store, "other").await, (49, 1, 0, 0));
    for id in &others {
        assert!(store.get(*id).await.is_ok(), "job {id} of another queue stays");
    }
    let pending = store
        .list(ListFilter {
            queue: Some("junk".into()),
            status: Some(Status::Pending),
            limit: 10,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert!(pending.jobs.is_empty(), "{:?}", pending.jobs);
    assert_eq!(store.next_run_at(&qs(&["junk"])).await.unwrap(), None);
    // The RUNNING jobs were left to their workers.
    store
        .ack(running.job.id, running.lease_id, at(200))
        .await
        .expect("the junk queue's RUNNING job is acked");
    store
        .ack(other_running.job.id, other_running.lease_id, at(200))
        .await
        .expect("the other queue's RUNNING job is acked");
    shutdown.cancel();
}

/// What goes with a purged PENDING job, and what stays: delayed and due
/// jobs go, in a paused queue too (which stays paused); a key is free
/// again, so its next enqueue makes a new job; DONE and FAILED jobs stay.
/// Bad requests (RUNNING, PENDING with a time, an unknown status) are
/// INVALID_ARGUMENT and change nothing.
#[tokio::test]
async fn a_purge_of_pending_jobs_frees_their_keys_and_refuses_bad_requests() {
    use jobq::pb::{self, job_queue_server::JobQueue};

    let (_dir, store) = fresh().await;
    let store = Arc::new(store);
    let keyed = enqueue(&*store, "q", Some("order-4711"), 0, at(0)).await;
    let delayed = enqueue(&*store, "q", Some("later"), 3_600_000, at(0)).await;
    let mut urgent = new_job("q", None, 0);
    urgent.priority = 100;
    store.enqueue(urgent, at(0)).await.unwrap();
    let done = enqueue(&*store, "q", None, 0, at(0)).await;
    let failed = enqueue(&*store, "q", None, 0, at(0)).await;
    let running = enqueue(&*store, "q", None, 0, at(0)).await;
    let leased = |l: Option<Leased>| l.expect("a due job");
    // The urgent job comes first; then the keyed one, then the rest in
    // order: take until the chosen ones are reached.
    let mut held = Vec::new();
    while held.len() < 6 {
        let Some(l) = take(&*store, "q", at(10)).await else {
            break;
        };
        held.push(l);
    }
    // Put back what is not meant to be RUNNING: DONE, FAILED, and the
    // others PENDING again (a give-back returns a job without an attempt).
    let mut kept_running = None;
    for l in held {
        let id = l.job.id;
        if id == done.id {
            store.ack(id, l.lease_id, at(20)).await.unwrap();
        } else if id == failed.id {
            store.cancel(id, "bad".into(), at(20)).await.unwrap();
        } else if id == running.id {
            kept_running = Some(l);
        } else {
            store.give_back(id, l.lease_id, at(20)).await.unwrap();
        }
    }
    let running = leased(kept_running);
    store.set_paused("q", true).await.unwrap();
    let other = enqueue(&*store, "elsewhere", Some("order-4711"), 0, at(30)).await;
    let before = counts(&store, "q").await;
    assert_eq!(before, (3, 1, 1, 1));

    let (svc, shutdown) = service(&store);
    for (status, finished_before, what) in [
        (pb::JobStatus::Running as i32, None, "RUNNING"),
        (pb::JobStatus::Pending as i32, Some(at(100)), "finished_before"),
        (99, None, "99"),
    ] {
        let err = svc
            .purge_jobs(purge_request("q", status, finished_before))
            .await
            .expect_err("a bad purge is refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(what), "{err:?}");
        assert_eq!(counts(&store, "q").await, before, "a refused purge changes nothing");
    }
    assert_eq!(
        code(store.purge_jobs("q", Some(Status::Running), at(100)).await),
        Code::InvalidArgument
    );
    assert_eq!(counts(&store, "q").await, before);

    let deleted = svc
        .purge_jobs(purge_request("q", pb::JobStatus::Pending as i32, None))
        .await
        .expect("a purge of PENDING jobs")
        .into_inner()
        .deleted;
    assert_eq!(deleted, 3);
    assert_eq!(counts(&store, "q").await, (0, 1, 1, 1));
    for id in [keyed.id, delayed.id] {
        assert_eq!(code(store.get(id).await), Code::NotFound);
    }
    for id in [done.id, failed.id, running.job.id, other.id] {
        assert!(store.get(id).await.is_ok(), "job {id} stays");
    }
    let stats = store.stats(Some("q"), at(100)).await.unwrap();
    assert!(stats[0].paused, "the queue stays paused");
    assert_eq!(stats[0].oldest_pending_age, None);
    // Nothing left to purge.
    let again = svc
        .purge_jobs(purge_request("q", pb::JobStatus::Pending as i32, None))
        .await
        .unwrap()
        .into_inner()
        .deleted;
    assert_eq!(again, 0);

    // The keys are free: their next enqueue makes a new job.
    let reused = store
        .enqueue(new_job("q", Some("order-4711"), 0), at(200))
        .await
        .unwrap();
    assert!(reused.created, "a purged PENDING job frees its key");
    assert!(reused.job.id > keyed.id);
    let later = store
        .enqueue(new_job("q", Some("later"), 0), at(200))
        .await
        .unwrap();
    assert!(later.created);
    store.set_paused("q", false).await.unwrap();
    assert_eq!(take(&*store, "q", at(300)).await.unwrap().job.id, reused.job.id);
    store
        .ack(running.job.id, running.lease_id, at(300))
        .await
        .expect("the RUNNING job was left to its worker");
    shutdown.cancel();
}

#[tokio::test]
async fn purge_jobs_goes_through_more_than_one_batch() {
    let (_dir, store) = fresh().await;
    // More than either engine's chunk (sled 256, PostgreSQL 1000), FAILED
    // jobs between PENDING ones, and some DONE.
    let batch: Vec<NewJob> = (0..2200).map(|_| new_job("q", None, 0)).collect();
    let jobs = store.enqueue_batch(batch, at(0)).await.unwrap();
    for e in jobs.iter().step_by(2) {
        store.cancel(e.job.id, String::new(), at(1)).await.unwrap();
    }
    for _ in 0..20 {
        let leased = take(&store, "q", at(1)).await.unwrap();
        store.ack(leased.job.id, leased.lease_id, at(1)).await.unwrap();
    }
    assert_eq!(store.purge_jobs("q", None, at(2)).await.unwrap(), 1120);
    let stats = store.stats(Some("q"), at(3)).await.unwrap();
    assert_eq!(
        (stats[0].pending, stats[0].done, stats[0].failed),
        (1080, 0, 0)
    );
}

#[tokio::test]
async fn a_purge_pass_stops_at_the_first_job_enqueued_well_after_every_cutoff() {
    use jobq_server::store::{rules::Retention, Backend};
    let (_dir, store) = fresh().await;
    // Finished jobs, all enqueued long after the cutoffs: none is
    // purgeable, and the pass ends at once (on sled, at the first one read,
    // of more than a step reads; `pg_purge` covers PostgreSQL's stop, which
    // needs more than one window of ids).
    let batch: Vec<NewJob> = (0..1100).map(|_| new_job("q", None, 0)).collect();
    for e in store.enqueue_batch(batch, at(100_000)).await.unwrap() {
        store
            .cancel(e.job.id, String::new(), at(100_001))
            .await
            .unwrap();
    }
    let retention = Retention {
        done_before: at(1_000),
        failed_before: at(1_000),
        queue: None,
        pending_through: None,
    };
    assert_eq!(
        store.backend().purge_chunk(None, retention).await.unwrap(),
        (0, None),
        "the first job read ends the pass"
    );
}
