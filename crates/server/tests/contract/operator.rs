// The operator's calls (issue 13), part of the store contract: included by
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
    assert_eq!(store.get(job.id).await.unwrap(), cancelled);
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
        .extend(&[(job.id, leased.lease_id)], None, at(6))
        .await
        .unwrap();
    assert_eq!(code(extended.into_iter().next().unwrap()), Code::Aborted);
    assert_eq!(store.next_lease_expiry().await.unwrap(), None);
    assert_eq!(store.get(job.id).await.unwrap(), cancelled);
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
    assert_eq!(store.get(done.id).await.unwrap(), done);
    let pending = enqueue(&store, "q", None, 0, at(4)).await;
    let failed = store.cancel(pending.id, "x".into(), at(5)).await.unwrap();
    assert_eq!(
        code(store.cancel(failed.id, "again".into(), at(6)).await),
        Code::FailedPrecondition
    );
    assert_eq!(store.get(failed.id).await.unwrap(), failed);
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
    assert_eq!(store.get(pending.id).await.unwrap(), pending);
    assert_eq!(store.get(running.id).await.unwrap(), running);
}
