// The store contract, included once per backend by `tests/contract.rs`:
// each module that includes it defines `TestStore`, `guard()`, `fresh()`,
// `reopen(&guard)`, `flush_rounds(&store)` and `MODEL_CASES`.
//
// One test per arrow and rule of docs/src/design.md §1, a model test against a
// plain in-memory model driven by the same state machine, concurrency and
// restart. Times are explicit (`at(ms)`), so nothing here sleeps.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use jobq_server::{
    job::{Job, JobId, KeyScope, LeaseId, Leased, NewJob, Outcome, Status, Uniqueness},
    machine::{self, Backoff, Event},
    policy::{QueuePolicy, Rate},
    schedule::Schedule,
    store::{Enqueued, FailReport, ListFilter, QueueStats, Store},
};
use proptest::prelude::*;
use tonic::Code;

include!("helpers.rs");

#[tokio::test]
async fn take_leases_a_job_to_one_worker() {
    let (_dir, store) = fresh().await;
    let job = enqueue(&store, "default", None, 0, at(0)).await;
    assert_eq!(job.status, Status::Pending);
    let leased = take(&store, "default", at(10)).await.expect("a due job");
    assert_eq!(leased.job.id, job.id);
    assert_eq!(leased.job.status, Status::Running);
    assert_eq!(leased.expires_at, at(10) + LEASE);
    assert_eq!(leased.job.lease_id(), Some(leased.lease_id));
    assert_ne!(leased.lease_id, LeaseId(0));
    assert_eq!(store.get(job.id).await.unwrap(), leased.job);
    assert!(
        take(&store, "default", at(20)).await.is_none(),
        "a RUNNING job is leased once"
    );
    assert_eq!(
        store.next_lease_expiry().await.unwrap(),
        Some(at(10) + LEASE)
    );
}

#[tokio::test]
async fn nothing_due_is_none_and_unknown_ids_are_not_found() {
    let (_dir, store) = fresh().await;
    assert!(take(&store, "default", at(0)).await.is_none());
    enqueue(&store, "default", None, 500, at(0)).await;
    assert!(
        take(&store, "default", at(499)).await.is_none(),
        "not due before run_at"
    );
    assert_eq!(
        store.next_run_at(&qs(&["other", "default"])).await.unwrap(),
        Some(at(500))
    );
    assert_eq!(code(store.get(JobId(424242)).await), Code::NotFound);
    assert_eq!(
        code(store.ack(JobId(424242), LeaseId(1), at(0)).await),
        Code::NotFound
    );
    assert_eq!(
        code(store.retry(JobId(424242), at(0)).await),
        Code::NotFound
    );
    assert!(
        take(&store, "default", at(500)).await.is_some(),
        "due at run_at"
    );
}

#[tokio::test]
async fn ack_finishes_and_a_second_ack_is_refused() {
    let (_dir, store) = fresh().await;
    enqueue(&store, "default", None, 0, at(0)).await;
    let leased = take(&store, "default", at(0)).await.unwrap();
    let done = store
        .ack(leased.job.id, leased.lease_id, at(5))
        .await
        .unwrap();
    assert_eq!(done.status, Status::Done);
    assert_eq!(done.finished_at, Some(at(5)));
    assert_eq!(done.lease, None);
    assert_eq!(
        done.history.last().and_then(|a| a.outcome),
        Some(Outcome::Acked)
    );
    assert_eq!(
        code(store.ack(done.id, leased.lease_id, at(6)).await),
        Code::FailedPrecondition
    );
    assert_eq!(store.next_lease_expiry().await.unwrap(), None);
    assert!(take(&store, "default", at(10_000)).await.is_none());
}

#[tokio::test]
async fn fail_counts_an_attempt_and_backs_off() {
    let (_dir, store) = fresh().await;
    let mut changes = store.changes();
    enqueue(&store, "default", None, 0, at(0)).await;
    assert!(changes.has_changed().unwrap(), "an enqueue wakes waiters");
    changes.borrow_and_update();
    let leased = take(&store, "default", at(0)).await.unwrap();
    let failed = store
        .fail(leased.job.id, report(leased.lease_id, None), at(10))
        .await
        .unwrap();
    assert!(changes.has_changed().unwrap(), "a fail wakes waiters");
    assert_eq!(failed.status, Status::Pending);
    assert_eq!(failed.attempts, 1);
    assert_eq!(failed.last_error.as_deref(), Some("smtp down"));
    // First backoff: base (100ms) scaled by jitter into [50%, 100%].
    assert!(
        failed.run_at >= at(60) && failed.run_at <= at(110),
        "run_at {:?}",
        failed.run_at
    );
    assert!(
        take(&store, "default", at(59)).await.is_none(),
        "waits out its backoff"
    );
    let again = take(&store, "default", at(110))
        .await
        .expect("due after the backoff");
    assert_eq!(again.job.id, failed.id);
    assert_ne!(again.lease_id, leased.lease_id);
}

#[tokio::test]
async fn a_snooze_puts_the_job_back_without_spending_an_attempt() {
    let (_dir, store) = fresh().await;
    // Three snoozes of a job of three attempts: counted, they would
    // dead-letter it.
    let job = enqueue(&store, "default", None, 0, at(0)).await;
    let mut now = 0;
    for round in 0..3 {
        let leased = take(&store, "default", at(now)).await.expect("due");
        assert_eq!(leased.job.id, job.id);
        let mut changes = store.changes();
        changes.borrow_and_update();
        let snoozed = store
            .fail(
                job.id,
                FailReport {
                    lease_id: leased.lease_id,
                    error: "429: retry after 30s".into(),
                    retry_delay: None,
                    fatal: false,
                    snooze: Some(Duration::from_secs(30)),
                },
                at(now + 1),
            )
            .await
            .expect("snooze");
        assert!(changes.has_changed().unwrap(), "a snooze wakes waiters");
        assert_eq!(snoozed.status, Status::Pending, "round {round}");
        assert_eq!(snoozed.attempts, 0, "not counted");
        assert_eq!(snoozed.last_error, None, "nothing failed");
        assert_eq!(snoozed.run_at, at(now + 1) + Duration::from_secs(30));
        let entry = snoozed.history.last().expect("its attempt");
        assert_eq!(entry.outcome, Some(jobq_server::job::Outcome::Snoozed));
        assert_eq!(entry.error.as_deref(), Some("429: retry after 30s"));
        assert!(
            take(&store, "default", at(now + 30_000)).await.is_none(),
            "not due before its snooze ends"
        );
        now += 31_001;
        // Its old lease is gone: a stale ack is refused.
        assert_eq!(
            code(store.ack(job.id, leased.lease_id, at(now)).await),
            Code::Aborted
        );
    }
    let leased = take(&store, "default", at(now)).await.expect("due again");
    let done = store
        .ack(job.id, leased.lease_id, at(now + 1))
        .await
        .expect("ack");
    assert_eq!((done.status, done.attempts), (Status::Done, 0));
    let reopened = store.get(job.id).await.expect("get");
    assert_eq!(reopened.history.len(), 4, "three snoozes and the ack");
}

#[tokio::test]
async fn a_snooze_past_max_snoozes_spends_an_attempt_and_the_counts_are_kept() {
    let dir = guard().await;
    let snooze = |lease_id| FailReport {
        lease_id,
        error: "429".into(),
        retry_delay: None,
        fatal: false,
        snooze: Some(Duration::from_millis(10)),
    };
    let id = {
        let store = reopen(&dir).await;
        let job = store
            .enqueue(
                NewJob {
                    max_attempts: 2,
                    max_snoozes: 1,
                    ..new_job("q", None, 0)
                },
                at(0),
            )
            .await
            .expect("enqueue")
            .job;
        assert_eq!((job.snoozes, job.max_snoozes), (0, 1));
        let leased = take(&store, "q", at(1)).await.expect("due");
        let once = store
            .fail(job.id, snooze(leased.lease_id), at(2))
            .await
            .expect("snooze");
        assert_eq!((once.status, once.attempts, once.snoozes), (Status::Pending, 0, 1));
        job.id
    };
    // The count survives a restart; the next snooze is over the allowance.
    let store = reopen(&dir).await;
    let job = store.get(id).await.expect("get");
    assert_eq!((job.snoozes, job.max_snoozes), (1, 1));
    let leased = take(&store, "q", at(100)).await.expect("due");
    let failed = store
        .fail(id, snooze(leased.lease_id), at(101))
        .await
        .expect("snooze");
    assert_eq!((failed.status, failed.attempts), (Status::Pending, 1));
    assert_eq!(failed.run_at, at(111), "due after the snooze");
    let entry = failed.history.last().expect("its attempt");
    assert_eq!(entry.outcome, Some(jobq_server::job::Outcome::Failed));
    assert_eq!(
        failed.last_error.as_deref(),
        Some("snoozed 1 times, its max_snoozes: 429")
    );
    let leased = take(&store, "q", at(200)).await.expect("due");
    let dead = store
        .fail(id, snooze(leased.lease_id), at(201))
        .await
        .expect("snooze");
    assert_eq!((dead.status, dead.attempts), (Status::Failed, 2), "no job snoozes forever");
    let retried = store.retry(id, at(300)).await.expect("retry");
    assert_eq!((retried.attempts, retried.snoozes), (0, 0));
    assert_eq!(store.get(id).await.expect("get").snoozes, 0);
}

#[tokio::test]
async fn an_acks_result_is_kept_with_its_job_until_the_job_is_deleted() {
    let dir = guard().await;
    let (with, without, purged) = {
        let store = reopen(&dir).await;
        let with = enqueue(&store, "q", Some("order-4711"), 0, at(0)).await;
        let without = enqueue(&store, "q", None, 0, at(1)).await;
        let purged = enqueue(&store, "q", None, 0, at(2)).await;
        let leased = take(&store, "q", at(3)).await.expect("due");
        assert_eq!(leased.job.id, with.id);
        // A stale ack's result is refused with it: nothing is stored.
        assert_eq!(
            code(
                store
                    .ack_with(with.id, LeaseId(leased.lease_id.0 ^ 1), Some(b"stale".to_vec()), at(4))
                    .await
            ),
            Code::Aborted
        );
        let done = store
            .ack_with(with.id, leased.lease_id, Some(br#"{"sent":true}"#.to_vec()), at(5))
            .await
            .expect("ack");
        assert_eq!(done.status, Status::Done);
        let other = take(&store, "q", at(6)).await.expect("due");
        store.ack(other.job.id, other.lease_id, at(7)).await.expect("ack");
        let third = take(&store, "q", at(8)).await.expect("due");
        store
            .ack_with(third.job.id, third.lease_id, Some(b"gone soon".to_vec()), at(9))
            .await
            .expect("ack");
        // Lists leave results out; a get reads them.
        let page = store.list(ListFilter::default()).await.expect("list");
        assert!(page.jobs.iter().all(|j| j.result.is_none()));
        (with.id, without.id, purged.id)
    };
    // Durable with the ack, across a restart.
    let store = reopen(&dir).await;
    let got = store.get(with).await.expect("get");
    assert_eq!(got.result.as_deref(), Some(&br#"{"sent":true}"#[..]));
    assert_eq!(store.get(without).await.expect("get").result, None);
    assert_eq!(store.get(purged).await.expect("get").result.as_deref(), Some(&b"gone soon"[..]));
    // Deleted with its job, by a delete or a purge.
    store.delete(with).await.expect("delete");
    assert!(matches!(store.get(with).await, Err(jobq_server::Error::NotFound(_))));
    assert_eq!(store.purge(at(100), at(100)).await.expect("purge"), 2);
    assert!(matches!(store.get(purged).await, Err(jobq_server::Error::NotFound(_))));
}

#[tokio::test]
async fn the_last_attempt_fails_for_good() {
    let (_dir, store) = fresh().await;
    let job = enqueue(&store, "default", None, 0, at(0)).await;
    let mut now = 0;
    let mut last = job;
    for attempt in 1..=3 {
        let leased = take(&store, "default", at(now)).await.expect("due");
        last = store
            .fail(
                leased.job.id,
                report(leased.lease_id, Some(Duration::ZERO)),
                at(now + 1),
            )
            .await
            .unwrap();
        assert_eq!(last.attempts, attempt);
        now += 10;
    }
    assert_eq!(last.status, Status::Failed);
    assert_eq!(last.attempts, last.max_attempts);
    assert_eq!(last.last_error.as_deref(), Some("smtp down"));
    assert!(last.finished_at.is_some());
    assert!(
        take(&store, "default", at(1_000_000)).await.is_none(),
        "a dead letter is never delivered"
    );
    let stats = store.stats(Some("default"), at(100)).await.unwrap();
    assert_eq!(
        stats,
        vec![QueueStats {
            queue: "default".into(),
            failed: 1,
            ..QueueStats::default()
        }]
    );
}

#[tokio::test]
async fn fatal_fail_is_failed_at_once_and_retry_brings_it_back() {
    let (_dir, store) = fresh().await;
    let job = enqueue(&store, "default", None, 0, at(0)).await;
    assert_eq!(
        code(store.retry(job.id, at(1)).await),
        Code::FailedPrecondition,
        "retry of a PENDING job"
    );
    let leased = take(&store, "default", at(1)).await.unwrap();
    let fatal = FailReport {
        fatal: true,
        ..report(leased.lease_id, None)
    };
    let failed = store.fail(job.id, fatal, at(2)).await.unwrap();
    assert_eq!((failed.status, failed.attempts), (Status::Failed, 1));
    let retried = store.retry(job.id, at(50)).await.unwrap();
    assert_eq!(
        (retried.status, retried.attempts, retried.run_at),
        (Status::Pending, 0, at(50))
    );
    assert_eq!(retried.finished_at, None);
    assert_eq!(
        take(&store, "default", at(50)).await.map(|l| l.job.id),
        Some(job.id)
    );
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_and_delivered_again() {
    let (_dir, store) = fresh().await;
    let job = enqueue(&store, "default", None, 0, at(0)).await;
    let leased = take(&store, "default", at(0)).await.unwrap();
    assert!(
        store
            .reclaim_expired(at(99), &|_| false)
            .await
            .unwrap()
            .is_empty(),
        "not expired yet"
    );
    let reclaimed = store.reclaim_expired(at(100), &|_| false).await.unwrap();
    assert_eq!(reclaimed.len(), 1);
    let (after, lost) = &reclaimed[0];
    assert_eq!((after.id, *lost), (job.id, leased.lease_id));
    assert_eq!((after.status, after.attempts), (Status::Pending, 1));
    assert_eq!(after.last_error.as_deref(), Some("lease expired"));
    assert_eq!(
        after.history.last().and_then(|a| a.outcome),
        Some(Outcome::LeaseExpired)
    );
    assert_eq!(store.next_lease_expiry().await.unwrap(), None);
    let again = take(&store, "default", at(100)).await.expect("due at once");
    assert_eq!(again.job.id, job.id);
    assert_ne!(
        again.lease_id, leased.lease_id,
        "every lease gets a fresh id"
    );
}

#[tokio::test]
async fn a_stale_lease_is_aborted() {
    let (_dir, store) = fresh().await;
    let job = enqueue(&store, "default", None, 0, at(0)).await;
    let first = take(&store, "default", at(0)).await.unwrap();
    store.reclaim_expired(at(200), &|_| false).await.unwrap();
    let second = take(&store, "default", at(200)).await.unwrap();
    let stale = first.lease_id;
    assert_eq!(code(store.ack(job.id, stale, at(201)).await), Code::Aborted);
    assert_eq!(
        code(store.fail(job.id, report(stale, None), at(201)).await),
        Code::Aborted
    );
    assert_eq!(
        code(
            store
                .reclaim(job.id, stale, Outcome::Revoked, at(201))
                .await
        ),
        Code::Aborted
    );
    let extended = store
        .extend(&[(job.id, stale), (JobId(999_999), stale)], &[], None, at(201))
        .await
        .unwrap();
    assert_eq!(extended.len(), 2);
    assert_eq!(
        extended[0].as_ref().map_err(|e| e.code()).unwrap_err(),
        Code::Aborted
    );
    assert_eq!(
        extended[1].as_ref().map_err(|e| e.code()).unwrap_err(),
        Code::NotFound
    );
    // Refused calls changed nothing: the current holder still owns the job.
    assert_eq!(store.get(job.id).await.unwrap(), second.job);
    let done = store.ack(job.id, second.lease_id, at(202)).await.unwrap();
    assert_eq!(done.status, Status::Done);
}

#[tokio::test]
async fn extend_moves_the_deadline_and_reclaim_ends_the_lease() {
    let (_dir, store) = fresh().await;
    let a = enqueue(&store, "default", None, 0, at(0)).await;
    let b = enqueue(&store, "default", None, 0, at(0)).await;
    let mut lease_changes = store.lease_changes();
    let la = take(&store, "default", at(0)).await.unwrap();
    assert!(
        lease_changes.has_changed().unwrap(),
        "the first lease arms the reaper"
    );
    lease_changes.borrow_and_update();
    let lb = take(&store, "default", at(10)).await.unwrap();
    assert!(
        !lease_changes.has_changed().unwrap(),
        "a later deadline does not re-arm it"
    );
    let held = [(a.id, la.lease_id), (b.id, lb.lease_id)];
    let extended = store
        .extend(&held, &[], Some(Duration::from_millis(500)), at(50))
        .await
        .unwrap();
    assert!(extended.iter().all(|e| e
        .as_ref()
        .is_ok_and(|j| j.lease_expires_at() == Some(at(550)))));
    assert!(store
        .reclaim_expired(at(549), &|_| false)
        .await
        .unwrap()
        .is_empty());
    // A heartbeat with a short extension moves the earliest deadline up.
    store
        .extend(&held[..1], &[], Some(Duration::from_millis(5)), at(60))
        .await
        .unwrap();
    assert!(lease_changes.has_changed().unwrap());
    assert_eq!(store.next_lease_expiry().await.unwrap(), Some(at(65)));
    // An expired lease cannot be extended.
    let late = store.extend(&held[..1], &[], None, at(65)).await.unwrap();
    assert_eq!(
        late[0].as_ref().map_err(|e| e.code()).unwrap_err(),
        Code::Aborted
    );
    // Reclaiming for expiry before the deadline is refused.
    assert_eq!(
        code(
            store
                .reclaim(b.id, lb.lease_id, Outcome::LeaseExpired, at(60))
                .await
        ),
        Code::FailedPrecondition
    );
    let gone = store
        .reclaim(b.id, lb.lease_id, Outcome::WorkerDisconnected, at(60))
        .await
        .unwrap();
    assert_eq!((gone.status, gone.attempts), (Status::Pending, 1));
    assert_eq!(gone.last_error.as_deref(), Some("worker disconnected"));
    assert_eq!(store.next_lease_expiry().await.unwrap(), Some(at(65)));
}

#[tokio::test]
async fn a_key_is_held_once_per_queue() {
    let (_dir, store) = fresh().await;
    let first = store
        .enqueue(new_job("emails", Some("order-4711"), 0), at(0))
        .await
        .unwrap();
    assert!(first.created);
    let again = store
        .enqueue(new_job("emails", Some("order-4711"), 0), at(1))
        .await
        .unwrap();
    assert_eq!(
        again,
        Enqueued::existing(first.job.clone())
    );
    let other = store
        .enqueue(new_job("sms", Some("order-4711"), 0), at(2))
        .await
        .unwrap();
    assert!(other.created);
    assert_ne!(other.job.id, first.job.id);
    // The key stays held while the job runs and after it is done.
    let leased = take(&store, "emails", at(3)).await.unwrap();
    store
        .ack(leased.job.id, leased.lease_id, at(4))
        .await
        .unwrap();
    let after_done = store
        .enqueue(new_job("emails", Some("order-4711"), 0), at(5))
        .await
        .unwrap();
    assert!(!after_done.created);
    assert_eq!(after_done.job.status, Status::Done);
}

#[tokio::test]
async fn fresh_jobs_are_fifo_and_due_jobs_go_by_run_at_then_id() {
    let (_dir, store) = fresh().await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(enqueue(&store, "default", None, 0, at(0)).await.id);
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    for id in &ids {
        assert_eq!(
            take(&store, "default", at(1)).await.map(|l| l.job.id),
            Some(*id)
        );
    }
    let late = enqueue(&store, "q", None, 200, at(0)).await; // due at 200
    let early = enqueue(&store, "q", None, 0, at(50)).await; // due at 50
    let middle = enqueue(&store, "q", None, 0, at(100)).await; // due at 100
    let order: Vec<JobId> = [
        take(&store, "q", at(300)).await,
        take(&store, "q", at(300)).await,
        take(&store, "q", at(300)).await,
    ]
    .into_iter()
    .map(|l| l.unwrap().job.id)
    .collect();
    assert_eq!(order, vec![early.id, middle.id, late.id]);
}

/// A batch is FIFO whatever its payloads' sizes (the sled store keeps big
/// payloads in files, written before the batch's records).
#[tokio::test]
async fn a_batch_of_small_and_big_payloads_is_taken_in_batch_order() {
    let (_dir, store) = fresh().await;
    let sizes = [100, 256 * 1024, 100, 600, 256 * 1024, 0];
    let batch = sizes
        .iter()
        .map(|&len| NewJob {
            payload: vec![b'p'; len],
            ..new_job("mixed", None, 0)
        })
        .collect();
    let enqueued = store.enqueue_batch(batch, at(0)).await.unwrap();
    let ids: Vec<JobId> = enqueued.iter().map(|e| e.job.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in batch order: {ids:?}");
    for (id, len) in ids.iter().zip(sizes) {
        let leased = take(&store, "mixed", at(1)).await.expect("a job");
        assert_eq!(leased.job.id, *id);
        assert!(leased.job.payload == vec![b'p'; len], "{len} bytes");
    }
}

#[tokio::test]
async fn due_jobs_go_by_priority_then_run_at_then_id() {
    let (_dir, store) = fresh().await;
    let with = |priority: i32, delay_ms: u64| NewJob {
        priority,
        ..new_job("q", None, delay_ms)
    };
    let mut put = Vec::new();
    // (priority, delay, enqueued at)
    for (priority, delay_ms, now) in [
        (0, 0, 0),
        (0, 0, 1),
        (10, 0, 2),
        (-5, 0, 3),
        (10, 0, 4),
        (100, 500, 5), // the highest priority, but not due before 505
        (-100, 0, 6),
        (10, 0, 7),
    ] {
        let job = store
            .enqueue(with(priority, delay_ms), at(now))
            .await
            .expect("enqueue")
            .job;
        assert_eq!(job.priority, priority);
        put.push(job.id);
    }
    let mut order = Vec::new();
    while let Some(l) = take(&store, "q", at(100)).await {
        order.push(l.job.id);
    }
    // Priority 10 in enqueue order, then 0 (FIFO), then -5, then -100;
    // the priority-100 job is not due yet.
    let want: Vec<JobId> = [2, 4, 7, 0, 1, 3, 6].iter().map(|&i| put[i]).collect();
    assert_eq!(order, want);
    let high = take(&store, "q", at(505)).await.expect("due at 505");
    assert_eq!((high.job.id, high.job.priority), (put[5], 100));
    // A batch carries priorities too, and a failed job keeps its own.
    let batch = store
        .enqueue_batch(vec![with(-1, 0), with(1, 0)], at(600))
        .await
        .expect("batch");
    let first = take(&store, "q", at(600)).await.expect("a job");
    assert_eq!(first.job.id, batch[1].job.id);
    store
        .fail(first.job.id, report(first.lease_id, Some(Duration::ZERO)), at(601))
        .await
        .expect("fail");
    let again = take(&store, "q", at(602)).await.expect("a job");
    assert_eq!(
        (again.job.id, again.job.priority),
        (first.job.id, 1),
        "back due at once, it still goes before the lower priority"
    );
    assert_eq!(store.get(batch[0].job.id).await.unwrap().priority, -1);
}

#[tokio::test]
async fn queues_are_tried_in_the_given_order() {
    let (_dir, store) = fresh().await;
    let low = enqueue(&store, "low", None, 0, at(0)).await;
    let high = enqueue(&store, "high", None, 0, at(10)).await;
    let queues = qs(&["high", "low"]);
    let first = store
        .take(&queues, "w", None, LEASE, at(20))
        .await
        .unwrap()
        .unwrap();
    let second = store
        .take(&queues, "w", None, LEASE, at(20))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.job.id, second.job.id), (high.id, low.id));
    assert!(store
        .take(&queues, "w", None, LEASE, at(20))
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn a_reclaimed_job_goes_to_the_back() {
    let (_dir, store) = fresh().await;
    let a = enqueue(&store, "default", None, 0, at(0)).await;
    let b = enqueue(&store, "default", None, 0, at(0)).await;
    let leased = take(&store, "default", at(1)).await.unwrap();
    assert_eq!(leased.job.id, a.id);
    store
        .reclaim(a.id, leased.lease_id, Outcome::Revoked, at(2))
        .await
        .unwrap();
    let c = enqueue(&store, "default", None, 0, at(3)).await;
    let mut order = Vec::new();
    while let Some(l) = take(&store, "default", at(4)).await {
        order.push(l.job.id);
    }
    assert_eq!(order, vec![b.id, a.id, c.id]);
}

#[tokio::test]
async fn batch_enqueue_dedups_within_the_batch_and_against_the_store() {
    let (_dir, store) = fresh().await;
    let existing = enqueue(&store, "q", Some("old"), 0, at(0)).await;
    let rounds = flush_rounds(&store);
    let batch = vec![
        new_job("q", Some("k1"), 0),
        new_job("q", None, 0),
        new_job("q", Some("k1"), 0),
        new_job("other", Some("k1"), 0),
        new_job("q", Some("old"), 0),
        new_job("q", None, 0),
    ];
    let out = store.enqueue_batch(batch, at(1)).await.unwrap();
    if let (Some(before), Some(after)) = (rounds, flush_rounds(&store)) {
        assert!(after - before <= 1, "one flush for the whole batch");
    }
    let created: Vec<bool> = out.iter().map(|e| e.created).collect();
    assert_eq!(created, vec![true, true, false, true, false, true]);
    assert_eq!(out[2].job, out[0].job);
    assert_eq!(out[4].job, existing);
    let ids: Vec<JobId> = out.iter().filter(|e| e.created).map(|e| e.job.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    for e in &out {
        assert_eq!(receipt(store.get(e.job.id).await.unwrap()), e.job);
    }
    let stats = store.stats(None, at(1)).await.unwrap();
    let pending: Vec<(String, u64)> = stats.into_iter().map(|s| (s.queue, s.pending)).collect();
    assert_eq!(pending, vec![("other".into(), 1), ("q".into(), 4)]);
    assert!(store.enqueue_batch(vec![], at(2)).await.unwrap().is_empty());
}

#[tokio::test]
async fn purge_deletes_old_finished_jobs_and_frees_their_keys() {
    let (_dir, store) = fresh().await;
    let done = enqueue(&store, "q", Some("k"), 0, at(0)).await;
    let leased = take(&store, "q", at(0)).await.unwrap();
    store.ack(done.id, leased.lease_id, at(10)).await.unwrap();
    let failed = enqueue(&store, "q", None, 0, at(0)).await;
    let leased = take(&store, "q", at(20)).await.unwrap();
    let fatal = FailReport {
        fatal: true,
        ..report(leased.lease_id, None)
    };
    store.fail(failed.id, fatal, at(20)).await.unwrap();
    let pending = enqueue(&store, "q", None, 0, at(0)).await;

    assert_eq!(
        store.purge(at(10), at(10)).await.unwrap(),
        0,
        "finished_at must be strictly before"
    );
    assert_eq!(
        store.purge(at(11), at(11)).await.unwrap(),
        1,
        "the DONE job only"
    );
    assert_eq!(code(store.get(done.id).await), Code::NotFound);
    assert_eq!(store.get(failed.id).await.unwrap().status, Status::Failed);
    assert_eq!(store.purge(at(11), at(21)).await.unwrap(), 1);
    assert_eq!(store.get(pending.id).await.unwrap().status, Status::Pending);
    let stats = store.stats(Some("q"), at(30)).await.unwrap();
    assert_eq!(
        (stats[0].pending, stats[0].done, stats[0].failed),
        (1, 0, 0)
    );

    let reused = store
        .enqueue(new_job("q", Some("k"), 0), at(40))
        .await
        .unwrap();
    assert!(reused.created, "a purged job frees its key");
    assert!(reused.job.id > pending.id, "ids are never reused");
}

#[tokio::test]
async fn list_pages_are_bounded_by_bytes_and_can_leave_payloads_out() {
    let (_dir, store) = fresh().await;
    let mut ids = Vec::new();
    for i in 0..5u64 {
        let new = NewJob {
            payload: vec![b'x'; 100 * 1024],
            ..new_job("big", None, 0)
        };
        ids.push(store.enqueue(new, at(i)).await.unwrap().job.id);
    }
    // 250 KiB pages hold two 100 KiB jobs; every job is seen once.
    let (mut seen, mut after, mut pages) = (Vec::new(), None, 0);
    loop {
        let page = store
            .list(ListFilter {
                after,
                limit: 100,
                max_bytes: 250 * 1024,
                ..ListFilter::default()
            })
            .await
            .unwrap();
        pages += 1;
        assert!(!page.jobs.is_empty() && page.jobs.len() <= 2, "{}", page.jobs.len());
        assert!(page.jobs.iter().all(|j| j.payload.len() == 100 * 1024));
        seen.extend(page.jobs.iter().map(|j| j.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    assert_eq!(pages, 3);
    // A bound smaller than one job still makes progress, one job a page.
    let one = store
        .list(ListFilter {
            limit: 100,
            max_bytes: 1,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!((one.jobs.len(), one.next), (1, Some(ids[0])));
    // Without payloads the whole queue fits one small page.
    let slim = store
        .list(ListFilter {
            limit: 100,
            max_bytes: 250 * 1024,
            omit_payload: true,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(slim.jobs.len(), 5);
    assert_eq!(slim.next, None);
    assert!(slim.jobs.iter().all(|j| j.payload.is_empty()));
}

#[tokio::test]
async fn list_pages_count_each_jobs_history_against_their_bound() {
    let (_dir, store) = fresh().await;
    let mut ids = Vec::new();
    for i in 0..4u64 {
        ids.push(enqueue(&store, "h", None, 0, at(i)).await.id);
    }
    // Each job fails twice with a 60 KiB error: about 180 KiB with its
    // history, of which its record's own fields (the last error) are 60.
    let error = "e".repeat(60 * 1024);
    for round in 0..2u64 {
        for _ in 0..ids.len() {
            let now = at(10 + round);
            let leased = take(&store, "h", now).await.expect("a due job");
            let failed = FailReport {
                error: error.clone(),
                ..report(leased.lease_id, Some(Duration::ZERO))
            };
            store.fail(leased.job.id, failed, now).await.unwrap();
        }
    }
    // 250 KiB pages hold one such job each, not the four their records
    // alone would fit.
    let (mut seen, mut after) = (Vec::new(), None);
    loop {
        let page = store
            .list(ListFilter {
                after,
                limit: 100,
                max_bytes: 250 * 1024,
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(page.jobs.len(), 1, "a page over its bound");
        assert_eq!(page.jobs[0].history.len(), 2);
        seen.push(page.jobs[0].id);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ids);
}

#[tokio::test]
async fn list_pages_by_id_and_filters() {
    let (_dir, store) = fresh().await;
    let mut all = Vec::new();
    for i in 0..7u64 {
        let queue = if i % 2 == 0 { "even" } else { "odd" };
        let key = format!("k{i}");
        let job = enqueue(&store, queue, Some(&key), 0, at(i)).await;
        // As listed: with its payload.
        all.push(store.get(job.id).await.unwrap());
    }
    let leased = take(&store, "even", at(100)).await.unwrap();

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list(ListFilter {
                after,
                limit: 3,
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert!(page.jobs.len() <= 3);
        seen.extend(page.jobs.iter().map(|j| j.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, all.iter().map(|j| j.id).collect::<Vec<_>>());

    let odd = store
        .list(ListFilter {
            queue: Some("odd".into()),
            limit: 10,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(odd.jobs.len(), 3);
    assert_eq!(odd.next, None);
    let running = store
        .list(ListFilter {
            status: Some(Status::Running),
            limit: 10,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(running.jobs, vec![leased.job.clone()]);
    let by_key = ListFilter {
        queue: Some("odd".into()),
        key: Some("k3".into()),
        limit: 10,
        ..ListFilter::default()
    };
    assert_eq!(store.list(by_key).await.unwrap().jobs, vec![all[3].clone()]);
    let key_anywhere = ListFilter {
        key: Some("k3".into()),
        limit: 10,
        ..ListFilter::default()
    };
    assert_eq!(
        store.list(key_anywhere).await.unwrap().jobs,
        vec![all[3].clone()]
    );
    let wrong_queue = ListFilter {
        queue: Some("even".into()),
        key: Some("k3".into()),
        limit: 10,
        ..ListFilter::default()
    };
    assert!(store.list(wrong_queue).await.unwrap().jobs.is_empty());
    let past_the_end = ListFilter {
        after: Some(JobId(u64::MAX)),
        limit: 10,
        ..ListFilter::default()
    };
    assert_eq!(store.list(past_the_end).await.unwrap(), Default::default());
}

#[tokio::test]
async fn stats_count_per_queue_with_the_oldest_due_age() {
    let (_dir, store) = fresh().await;
    enqueue(&store, "b", None, 0, at(0)).await;
    enqueue(&store, "b", None, 0, at(30)).await;
    enqueue(&store, "b", None, 1_000, at(0)).await;
    enqueue(&store, "a", None, 500, at(0)).await;
    take(&store, "b", at(40)).await.unwrap();
    let stats = store.stats(None, at(100)).await.unwrap();
    assert_eq!(
        stats,
        vec![
            QueueStats {
                queue: "a".into(),
                pending: 1,
                ..QueueStats::default()
            },
            QueueStats {
                queue: "b".into(),
                pending: 2,
                running: 1,
                oldest_pending_age: Some(Duration::from_millis(70)),
                ..QueueStats::default()
            },
        ]
    );
    let unknown = store.stats(Some("nope"), at(100)).await.unwrap();
    assert_eq!(
        unknown,
        vec![QueueStats {
            queue: "nope".into(),
            ..QueueStats::default()
        }]
    );
}

#[tokio::test]
async fn out_of_range_times_are_invalid_not_panics() {
    let (_dir, store) = fresh().await;
    let mut forever = new_job("q", None, 0);
    forever.delay = Duration::MAX;
    assert_eq!(
        code(store.enqueue(forever, at(0)).await),
        Code::InvalidArgument
    );
    enqueue(&store, "q", None, 0, at(0)).await;
    assert_eq!(
        code(store.take(&qs(&["q"]), "w", None, Duration::MAX, at(0)).await),
        Code::InvalidArgument
    );
    let leased = take(&store, "q", at(0)).await.unwrap();
    let held = [(leased.job.id, leased.lease_id)];
    assert_eq!(
        code(store.extend(&held, &[], Some(Duration::MAX), at(1)).await),
        Code::InvalidArgument
    );
    let forever = report(leased.lease_id, Some(Duration::MAX));
    assert_eq!(
        code(store.fail(leased.job.id, forever, at(1)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        store.get(leased.job.id).await.unwrap(),
        leased.job,
        "nothing changed"
    );
}

#[tokio::test]
async fn a_reopened_store_has_every_job_and_keeps_leases() {
    let dir = guard().await;
    let (jobs, running, max_lease) = {
        let store = reopen(&dir).await;
        let mut jobs = Vec::new();
        for i in 0..6 {
            jobs.push(enqueue(&store, "q", Some(&format!("k{i}")), 0, at(i)).await);
        }
        let done = take(&store, "q", at(10)).await.unwrap();
        store.ack(done.job.id, done.lease_id, at(11)).await.unwrap();
        let failed = take(&store, "q", at(12)).await.unwrap();
        let fatal = FailReport {
            fatal: true,
            ..report(failed.lease_id, None)
        };
        store.fail(failed.job.id, fatal, at(13)).await.unwrap();
        let running = take(&store, "q", at(14)).await.unwrap();
        let mut final_jobs = Vec::new();
        for job in &jobs {
            final_jobs.push(store.get(job.id).await.unwrap());
        }
        let max_lease = running.lease_id;
        (final_jobs, running, max_lease)
    };

    let store = reopen(&dir).await;
    for job in &jobs {
        assert_eq!(
            &store.get(job.id).await.unwrap(),
            job,
            "job {} survived",
            job.id
        );
    }
    let statuses: Vec<Status> = jobs.iter().map(|j| j.status).collect();
    use Status::*;
    assert_eq!(
        statuses,
        vec![Done, Failed, Running, Pending, Pending, Pending]
    );
    assert_eq!(
        store.next_lease_expiry().await.unwrap(),
        Some(at(14) + LEASE),
        "the lease index is rebuilt"
    );
    let dup = store
        .enqueue(new_job("q", Some("k0"), 0), at(20))
        .await
        .unwrap();
    assert!(!dup.created, "the key index is rebuilt");
    let stats = store.stats(Some("q"), at(20)).await.unwrap();
    assert_eq!(
        (
            stats[0].pending,
            stats[0].running,
            stats[0].done,
            stats[0].failed
        ),
        (3, 1, 1, 1)
    );

    // A restart is not a worker death: the holder can still ack.
    let acked = store
        .ack(running.job.id, running.lease_id, at(20))
        .await
        .unwrap();
    assert_eq!(acked.status, Status::Done);
    // Delivery order continues, and ids keep increasing.
    assert_eq!(
        take(&store, "q", at(21)).await.map(|l| l.job.id),
        Some(jobs[3].id)
    );
    let newer = take(&store, "q", at(21)).await.unwrap();
    assert!(
        newer.lease_id != max_lease,
        "lease ids never repeat across restarts"
    );
    let fresh_job = enqueue(&store, "q", None, 0, at(22)).await;
    assert!(
        jobs.iter().all(|j| j.id < fresh_job.id),
        "job ids never repeat across restarts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_workers_get_every_job_exactly_once() {
    let (_dir, store) = fresh().await;
    let store = Arc::new(store);
    let mut expected = HashSet::new();
    for chunk in 0..10 {
        let batch = (0..100).map(|_| new_job("q", None, 0)).collect();
        for e in store.enqueue_batch(batch, at(chunk)).await.unwrap() {
            expected.insert(e.job.id);
        }
    }
    assert_eq!(expected.len(), 1000);
    let held = Arc::new(Mutex::new(HashSet::new()));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..16 {
        let (store, held) = (store.clone(), held.clone());
        workers.spawn(async move {
            let worker = format!("worker-{w}");
            let mut got = Vec::new();
            while let Some(leased) = store
                .take(&qs(&["q"]), &worker, None, Duration::from_secs(60), at(100))
                .await
                .unwrap()
            {
                assert!(
                    held.lock().unwrap().insert(leased.job.id),
                    "job {} held twice",
                    leased.job.id
                );
                got.push(leased.job.id);
                store
                    .ack(leased.job.id, leased.lease_id, at(101))
                    .await
                    .unwrap();
                held.lock().unwrap().remove(&leased.job.id);
            }
            got
        });
    }
    let mut delivered = Vec::new();
    while let Some(got) = workers.join_next().await {
        delivered.extend(got.unwrap());
    }
    assert_eq!(delivered.len(), 1000, "every job delivered exactly once");
    assert_eq!(delivered.iter().copied().collect::<HashSet<_>>(), expected);
    let stats = store.stats(Some("q"), at(200)).await.unwrap();
    assert_eq!(
        (stats[0].pending, stats[0].running, stats[0].done),
        (0, 0, 1000)
    );
}

// ---------------------------------------------------------------------------
// The model test: random operations against a BTreeMap driven by the same
// state machine.

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        queue: u8,
        key: Option<u8>,
        delay_ms: u64,
        max_attempts: u32,
        priority: i32,
    },
    Batch {
        jobs: Vec<(u8, Option<u8>)>,
    },
    Take {
        queues: Vec<u8>,
        lease_ms: u64,
    },
    Ack {
        pick: usize,
        right: bool,
    },
    Fail {
        pick: usize,
        right: bool,
        retry_delay_ms: Option<u64>,
        fatal: bool,
    },
    Extend {
        picks: Vec<(usize, bool)>,
        by_ms: Option<u64>,
    },
    Reclaim {
        pick: usize,
        right: bool,
        outcome: Outcome,
    },
    Retry {
        pick: usize,
    },
    Cancel {
        pick: usize,
    },
    Delete {
        pick: usize,
    },
    ReclaimExpired,
    Purge {
        done_age_ms: u64,
        failed_age_ms: u64,
    },
    Advance {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let queue = 0..3u8;
    let key = proptest::option::of(0..3u8);
    let outcome = prop_oneof![
        Just(Outcome::LeaseExpired),
        Just(Outcome::WorkerDisconnected),
        Just(Outcome::Revoked)
    ];
    prop_oneof![
        4 => (queue.clone(), key.clone(), prop_oneof![Just(0u64), 1..200u64], 1..4u32, prop_oneof![2 => Just(0), 1 => -2..=2i32, 1 => Just(-100), 1 => Just(100)])
            .prop_map(|(queue, key, delay_ms, max_attempts, priority)| Op::Enqueue { queue, key, delay_ms, max_attempts, priority }),
        1 => proptest::collection::vec((queue.clone(), key), 0..4).prop_map(|jobs| Op::Batch { jobs }),
        4 => (proptest::collection::vec(queue, 1..3), 1..200u64).prop_map(|(queues, lease_ms)| Op::Take { queues, lease_ms }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, right)| Op::Ack { pick, right }),
        2 => (any::<usize>(), any::<bool>(), proptest::option::of(0..100u64), proptest::bool::weighted(0.2))
            .prop_map(|(pick, right, retry_delay_ms, fatal)| Op::Fail { pick, right, retry_delay_ms, fatal }),
        1 => (proptest::collection::vec((any::<usize>(), any::<bool>()), 1..3), proptest::option::of(1..300u64))
            .prop_map(|(picks, by_ms)| Op::Extend { picks, by_ms }),
        1 => (any::<usize>(), any::<bool>(), outcome).prop_map(|(pick, right, outcome)| Op::Reclaim { pick, right, outcome }),
        1 => any::<usize>().prop_map(|pick| Op::Retry { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Delete { pick }),
        1 => Just(Op::ReclaimExpired),
        1 => (0..300u64, 0..300u64).prop_map(|(done_age_ms, failed_age_ms)| Op::Purge { done_age_ms, failed_age_ms }),
        3 => (0..150u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

const QUEUES: [&str; 3] = ["q0", "q1", "q2"];

/// The model: every retained job, plus the largest id the store has issued.
#[derive(Default)]
struct Model {
    jobs: BTreeMap<JobId, Job>,
    max_id: u64,
    leases: std::collections::HashSet<u64>,
}

impl Model {
    /// An id the op refers to: one of the model's jobs, or (rarely, and
    /// when there is none) an unknown one.
    fn pick(&self, pick: usize) -> JobId {
        let n = self.jobs.len();
        if n == 0 || pick % 8 == 7 {
            return JobId(1_000_000_000 + pick as u64 % 5);
        }
        *self.jobs.keys().nth(pick % n).unwrap()
    }

    /// The lease to present: the current one, or a stale one.
    fn lease(&self, id: JobId, right: bool) -> LeaseId {
        let job = self.jobs.get(&id);
        let current = job.and_then(|j| {
            j.lease_id()
                .or_else(|| j.history.last().map(|a| a.lease_id))
        });
        match (right, current) {
            (true, Some(lease)) => lease,
            (false, _) => job
                .and_then(|j| j.history.first())
                .map_or(LeaseId(7), |a| a.lease_id),
            (true, None) => LeaseId(3),
        }
    }

    fn key_holder(&self, queue: &str, key: &str) -> Option<&Job> {
        self.jobs
            .values()
            .find(|j| j.queue == queue && j.key.as_deref() == Some(key))
    }

    fn first_due(&self, queues: &[String], now: SystemTime) -> Option<JobId> {
        queues.iter().find_map(|q| {
            self.jobs
                .values()
                .filter(|j| j.queue == *q && j.status == Status::Pending && j.run_at <= now)
                .min_by_key(|j| (std::cmp::Reverse(j.priority), j.run_at, j.id))
                .map(|j| j.id)
        })
    }

    /// Applies an event; `Err` carries the gRPC code the store must give.
    fn apply(&mut self, id: JobId, event: Event, now: SystemTime) -> Result<Job, Code> {
        let job = self.jobs.get(&id).ok_or(Code::NotFound)?;
        let new = machine::apply(job.clone(), event, now)
            .map_err(|e| jobq_server::Error::from(e).code())?;
        self.jobs.insert(id, new.clone());
        Ok(new)
    }

    fn stats(&self, now: SystemTime) -> Vec<QueueStats> {
        let mut out: BTreeMap<&str, QueueStats> = BTreeMap::new();
        for job in self.jobs.values() {
            let s = out.entry(&job.queue).or_insert_with(|| QueueStats {
                queue: job.queue.clone(),
                ..Default::default()
            });
            match job.status {
                Status::Pending => s.pending += 1,
                Status::Running => s.running += 1,
                Status::Done => s.done += 1,
                Status::Failed => s.failed += 1,
            }
            if job.status == Status::Pending && job.run_at <= now {
                let age = now.duration_since(job.run_at).unwrap();
                s.oldest_pending_age = Some(s.oldest_pending_age.map_or(age, |a| a.max(age)));
            }
        }
        out.into_values().collect()
    }

    fn issued(&mut self, id: u64) {
        assert!(
            id > self.max_id,
            "id {id} not above every earlier id {}",
            self.max_id
        );
        self.max_id = id;
    }
}

fn same<T: std::fmt::Debug + PartialEq>(
    store: jobq_server::Result<T>,
    model: Result<T, Code>,
    what: &str,
) {
    match (store, model) {
        (Ok(s), Ok(m)) => assert_eq!(s, m, "{what}"),
        (Err(s), Err(m)) => assert_eq!(s.code(), m, "{what}: {s}"),
        (s, m) => panic!("{what}: store gave {s:?}, model {m:?}"),
    }
}

async fn step(store: &TestStore, model: &mut Model, now: &mut u64, op: Op) {
    let t = at(*now);
    match op {
        Op::Advance { ms } => *now += ms,
        Op::Enqueue {
            queue,
            key,
            delay_ms,
            max_attempts,
            priority,
        } => {
            let queue = QUEUES[queue as usize];
            let key = key.map(|k| format!("key-{k}"));
            let new = NewJob {
                max_attempts,
                priority,
                delay: Duration::from_millis(delay_ms),
                ..new_job(queue, key.as_deref(), 0)
            };
            let got = store.enqueue(new.clone(), t).await.unwrap();
            match key.as_deref().and_then(|k| model.key_holder(queue, k)) {
                Some(holder) => assert_eq!(
                    got,
                    Enqueued::existing(receipt(holder.clone()))
                ),
                None => {
                    assert!(got.created);
                    model.issued(got.job.id.0);
                    let created = machine::create(got.job.id, new, t);
                    assert_eq!(got.job, receipt(created.clone()));
                    model.jobs.insert(got.job.id, created);
                }
            }
        }
        Op::Batch { jobs } => {
            let batch: Vec<NewJob> = jobs
                .iter()
                .map(|&(q, k)| {
                    new_job(
                        QUEUES[q as usize],
                        k.map(|k| format!("key-{k}")).as_deref(),
                        0,
                    )
                })
                .collect();
            let got = store.enqueue_batch(batch.clone(), t).await.unwrap();
            assert_eq!(got.len(), batch.len());
            for (new, got) in batch.into_iter().zip(got) {
                match new
                    .key
                    .as_deref()
                    .and_then(|k| model.key_holder(&new.queue, k))
                {
                    Some(holder) => assert_eq!(
                        got,
                        Enqueued::existing(receipt(holder.clone()))
                    ),
                    None => {
                        assert!(got.created);
                        model.issued(got.job.id.0);
                        let created = machine::create(got.job.id, new, t);
                        assert_eq!(got.job, receipt(created.clone()));
                        model.jobs.insert(got.job.id, created);
                    }
                }
            }
        }
        Op::Take { queues, lease_ms } => {
            let queues: Vec<String> = queues
                .iter()
                .map(|&q| QUEUES[q as usize].to_string())
                .collect();
            let lease = Duration::from_millis(lease_ms);
            let got = store.take(&queues, "w", None, lease, t).await.unwrap();
            match (got, model.first_due(&queues, t)) {
                (None, None) => {}
                (Some(leased), Some(id)) => {
                    assert_eq!(leased.job.id, id, "take delivers the first due job");
                    assert!(
                        model.leases.insert(leased.lease_id.0),
                        "lease ids are never reused"
                    );
                    let event = Event::Take {
                        lease_id: leased.lease_id,
                        worker_id: "w".into(),
                        owner: None,
                        lease,
                    };
                    let expected = model.apply(id, event, t).unwrap();
                    assert_eq!(leased.job, expected);
                    assert_eq!(leased.expires_at, t + lease);
                }
                (got, want) => panic!("take gave {got:?}, model wants {want:?}"),
            }
        }
        Op::Ack { pick, right } => {
            let id = model.pick(pick);
            let lease_id = model.lease(id, right);
            let got = store.ack(id, lease_id, t).await;
            same(
                got,
                model.apply(
                    id,
                    Event::Ack {
                        lease_id,
                        result: None,
                    },
                    t,
                ).map(receipt),
                "ack",
            );
        }
        Op::Fail {
            pick,
            right,
            retry_delay_ms,
            fatal,
        } => {
            let id = model.pick(pick);
            let lease_id = model.lease(id, right);
            let retry_delay = retry_delay_ms.map(Duration::from_millis);
            let report = FailReport {
                lease_id,
                error: "boom".into(),
                retry_delay,
                fatal,
                snooze: None,
            };
            let got = store.fail(id, report, t).await;
            let event = |jitter| Event::Fail {
                lease_id,
                error: "boom".into(),
                retry_delay,
                fatal,
                backoff: BACKOFF,
                jitter,
            };
            let before = model.jobs.get(&id).cloned();
            let soonest = model.apply(id, event(0.0), t);
            if let Some(before) = before {
                model.jobs.insert(id, before);
            }
            let latest = model.apply(id, event(1.0), t);
            match (got, soonest, latest) {
                (Ok(got), Ok(soonest), Ok(latest)) => {
                    // The jitter is the store's; only run_at may differ.
                    assert!(soonest.run_at <= got.run_at && got.run_at <= latest.run_at);
                    assert_eq!(
                        Job {
                            run_at: soonest.run_at,
                            ..got.clone()
                        },
                        receipt(soonest.clone())
                    );
                    model.jobs.insert(
                        id,
                        Job {
                            run_at: got.run_at,
                            ..soonest
                        },
                    );
                }
                (got, _, latest) => same(got, latest.map(receipt), "fail"),
            }
        }
        Op::Extend { picks, by_ms } => {
            let leases: Vec<(JobId, LeaseId)> = picks
                .iter()
                .map(|&(pick, right)| {
                    let id = model.pick(pick);
                    (id, model.lease(id, right))
                })
                .collect();
            let extend_by = by_ms.map(Duration::from_millis);
            let got = store.extend(&leases, &[], extend_by, t).await.unwrap();
            assert_eq!(got.len(), leases.len());
            for (got, &(id, lease_id)) in got.into_iter().zip(&leases) {
                same(
                    got,
                    model
                        .apply(
                            id,
                            Event::Extend {
                                lease_id,
                                extend_by,
                                progress: None,
                            },
                            t,
                        )
                        .map(receipt),
                    "extend",
                );
            }
        }
        Op::Reclaim {
            pick,
            right,
            outcome,
        } => {
            let id = model.pick(pick);
            let lease_id = model.lease(id, right);
            let got = store.reclaim(id, lease_id, outcome, t).await;
            same(
                got,
                model
                    .apply(id, Event::Reclaim { lease_id, outcome }, t)
                    .map(receipt),
                "reclaim",
            );
        }
        Op::Retry { pick } => {
            let id = model.pick(pick);
            same(
                store.retry(id, t).await,
                model.apply(id, Event::Retry, t).map(receipt),
                "retry",
            );
        }
        Op::Cancel { pick } => {
            let id = model.pick(pick);
            let reason = format!("op {pick}");
            same(
                store.cancel(id, reason.clone(), t).await,
                model.apply(id, Event::Cancel { reason }, t).map(receipt),
                "cancel",
            );
        }
        Op::Delete { pick } => {
            let id = model.pick(pick);
            let expected = match model.jobs.get(&id) {
                None => Err(Code::NotFound),
                Some(job) => match machine::deletable(job) {
                    Ok(()) => {
                        model.jobs.remove(&id);
                        Ok(())
                    }
                    Err(e) => Err(jobq_server::Error::from(e).code()),
                },
            };
            same(store.delete(id).await, expected, "delete");
        }
        Op::ReclaimExpired => {
            let mut got = store.reclaim_expired(t, &|_| false).await.unwrap();
            got.sort_by_key(|(job, _)| job.id);
            let expired: Vec<(JobId, LeaseId)> = model
                .jobs
                .values()
                .filter(|j| {
                    j.status == Status::Running && j.lease_expires_at().is_some_and(|e| e <= t)
                })
                .map(|j| (j.id, j.lease_id().unwrap()))
                .collect();
            let mut want = Vec::new();
            for (id, lease_id) in expired {
                let event = Event::Reclaim {
                    lease_id,
                    outcome: Outcome::LeaseExpired,
                };
                want.push((receipt(model.apply(id, event, t).unwrap()), lease_id));
            }
            assert_eq!(got, want, "reclaim_expired");
        }
        Op::Purge {
            done_age_ms,
            failed_age_ms,
        } => {
            let done_before = t - Duration::from_millis(done_age_ms);
            let failed_before = t - Duration::from_millis(failed_age_ms);
            let got = store.purge(done_before, failed_before).await.unwrap();
            let before = model.jobs.len();
            model.jobs.retain(|_, j| match (j.status, j.finished_at) {
                (Status::Done, Some(f)) => f >= done_before,
                (Status::Failed, Some(f)) => f >= failed_before,
                _ => true,
            });
            assert_eq!(got, (before - model.jobs.len()) as u64, "purged");
        }
    }
}

/// Everything the store shows agrees with the model.
async fn check(store: &TestStore, model: &Model, now: SystemTime) {
    for (id, job) in &model.jobs {
        assert_eq!(&store.get(*id).await.unwrap(), job);
    }
    let all = store
        .list(ListFilter {
            limit: 10_000,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        all.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        model.jobs.keys().copied().collect::<Vec<_>>()
    );
    assert_eq!(all.next, None);
    for status in Status::ALL {
        for queue in QUEUES {
            let filter = ListFilter {
                queue: Some(queue.into()),
                status: Some(status),
                limit: 2,
                ..ListFilter::default()
            };
            let page = store.list(filter).await.unwrap();
            let want: Vec<JobId> = model
                .jobs
                .values()
                .filter(|j| j.queue == queue && j.status == status)
                .map(|j| j.id)
                .take(2)
                .collect();
            assert_eq!(page.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), want);
        }
    }
    for status in Status::ALL {
        // By status alone, page by page.
        let (mut seen, mut after) = (Vec::new(), None);
        loop {
            let page = store
                .list(ListFilter {
                    status: Some(status),
                    after,
                    limit: 3,
                    ..ListFilter::default()
                })
                .await
                .unwrap();
            seen.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let want: Vec<JobId> = model
            .jobs
            .values()
            .filter(|j| j.status == status)
            .map(|j| j.id)
            .collect();
        assert_eq!(seen, want, "list by {status:?}");
    }
    assert_eq!(store.stats(None, now).await.unwrap(), model.stats(now));
    let queues: Vec<String> = QUEUES.iter().map(|q| q.to_string()).collect();
    let next_run_at = model
        .jobs
        .values()
        .filter(|j| j.status == Status::Pending)
        .map(|j| j.run_at)
        .min();
    assert_eq!(store.next_run_at(&queues).await.unwrap(), next_run_at);
    let next_expiry = model
        .jobs
        .values()
        .filter_map(|j| j.lease_expires_at())
        .min();
    assert_eq!(store.next_lease_expiry().await.unwrap(), next_expiry);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: MODEL_CASES, ..ProptestConfig::default() })]

    #[test]
    fn the_store_behaves_like_the_model(ops in proptest::collection::vec(op(), 1..40), reopen_at in 0..40usize) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let dir = guard().await;
            let mut store = reopen(&dir).await;
            let mut model = Model::default();
            let mut now = 0;
            for (i, op) in ops.into_iter().enumerate() {
                if i == reopen_at {
                    // A restart in the middle changes nothing visible.
                    drop(store);
                    store = reopen(&dir).await;
                }
                step(&store, &mut model, &mut now, op).await;
                check(&store, &model, at(now)).await;
            }
        });
    }
}

include!("keys.rs");
include!("operator.rs");
include!("policies.rs");
include!("progress.rs");
include!("schedules.rs");
