// Queue policies (docs/src/shaping.md): limits hold at the take, a held job
// stays PENDING with its place and attempts, and a slot comes back with
// the job's change of state. Included by `suite.rs`.

fn grouped(queue: &str, group: Option<&str>, delay_ms: u64) -> NewJob {
    NewJob {
        group: group.map(Into::into),
        ..new_job(queue, None, delay_ms)
    }
}

async fn enqueue_in(store: &impl Store, group: Option<&str>, now: SystemTime) -> Job {
    store
        .enqueue(grouped("q", group, 0), now)
        .await
        .expect("enqueue")
        .job
}

fn policy(max_running: u32, group_max_running: u32) -> QueuePolicy {
    QueuePolicy {
        max_running,
        group_max_running,
        rate: None,
        group_rate: None,
    }
}

/// Takes from `q` until nothing is handed out; the ids, in order.
async fn drain_ids(store: &impl Store, now: SystemTime) -> Vec<(JobId, LeaseId)> {
    let mut taken = Vec::new();
    while let Some(leased) = take(store, "q", now).await {
        taken.push((leased.job.id, leased.lease_id));
    }
    taken
}

#[tokio::test]
async fn max_running_holds_due_jobs_pending_until_a_slot_is_freed() {
    let (_dir, store) = fresh().await;
    store.set_policy("q", policy(2, 0)).await.expect("policy");
    let jobs: Vec<Job> = futures::future::join_all((0..4).map(|_| enqueue_in(&store, None, at(0))))
        .await;
    let taken = drain_ids(&store, at(1)).await;
    assert_eq!(taken.len(), 2, "two run at once");
    let stats = &store.stats(Some("q"), at(2)).await.unwrap()[0];
    assert_eq!((stats.pending, stats.running), (2, 2));
    assert_eq!(stats.held_max_running, 2);
    assert_eq!(stats.held_group_max_running, 0);
    assert_eq!(stats.policy, policy(2, 0));
    // Held, not rescheduled: PENDING, no attempt spent, run_at kept.
    for job in &jobs {
        let now = store.get(job.id).await.unwrap();
        if !taken.iter().any(|(id, _)| *id == job.id) {
            assert_eq!((now.status, now.attempts, now.run_at), (Status::Pending, 0, job.run_at));
        }
    }
    // An ack frees a slot, and wakes the waiters of the queue.
    let mut changes = store.changes();
    changes.borrow_and_update();
    store.ack(taken[0].0, taken[0].1, at(3)).await.unwrap();
    assert!(changes.has_changed().unwrap(), "a freed slot wakes waiters");
    assert_eq!(drain_ids(&store, at(4)).await.len(), 1);
    // A lease that runs out frees its slot too.
    store.reclaim_expired(at(4) + LEASE * 10, &|_| false).await.unwrap();
    assert_eq!(drain_ids(&store, at(5) + LEASE * 10).await.len(), 2);
    // Cleared: no limit.
    store.set_policy("q", QueuePolicy::default()).await.unwrap();
    assert_eq!(store.policy("q").await.unwrap(), QueuePolicy::default());
}

#[tokio::test]
async fn a_sequence_runs_a_groups_jobs_one_at_a_time_in_enqueue_order() {
    let (_dir, store) = fresh().await;
    store.set_policy("q", policy(0, 1)).await.expect("policy");
    let a1 = enqueue_in(&store, Some("a"), at(0)).await;
    let a2 = enqueue_in(&store, Some("a"), at(0)).await;
    let b1 = enqueue_in(&store, Some("b"), at(0)).await;
    let free = enqueue_in(&store, None, at(0)).await;
    let taken = drain_ids(&store, at(1)).await;
    let ids: Vec<JobId> = taken.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [a1.id, b1.id, free.id], "one per group; no group, no limit");
    let stats = &store.stats(Some("q"), at(2)).await.unwrap()[0];
    assert_eq!(stats.held_group_max_running, 1, "a2 waits for a1");
    // a1 fails and waits out its backoff: it stays first, a2 waits.
    let failed = store
        .fail(a1.id, report(taken[0].1, Some(Duration::from_millis(500))), at(3))
        .await
        .unwrap();
    assert_eq!(failed.status, Status::Pending);
    assert!(drain_ids(&store, at(10)).await.is_empty(), "nothing overtakes a1");
    let again = drain_ids(&store, at(503)).await;
    assert_eq!(again.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [a1.id]);
    store.ack(a1.id, again[0].1, at(504)).await.unwrap();
    let next = drain_ids(&store, at(505)).await;
    assert_eq!(next.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [a2.id]);
    // A dead job no longer holds its group.
    let a3 = enqueue_in(&store, Some("a"), at(506)).await;
    let dead = FailReport {
        fatal: true,
        ..report(next[0].1, None)
    };
    assert_eq!(store.fail(a2.id, dead, at(507)).await.unwrap().status, Status::Failed);
    let last = drain_ids(&store, at(508)).await;
    assert_eq!(last.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [a3.id]);
}

#[tokio::test]
async fn a_group_limit_above_one_runs_that_many_of_a_group_and_no_more() {
    let (_dir, store) = fresh().await;
    for _ in 0..5 {
        enqueue_in(&store, Some("a"), at(0)).await;
    }
    let b = enqueue_in(&store, Some("b"), at(0)).await;
    // Set after the jobs are there: they are sorted into held and not.
    store.set_policy("q", policy(3, 2)).await.expect("policy");
    let taken = drain_ids(&store, at(1)).await;
    assert_eq!(taken.len(), 3, "max_running 3");
    let groups: Vec<Option<String>> = futures::future::join_all(
        taken.iter().map(|(id, _)| async { store.get(*id).await.unwrap().group }),
    )
    .await;
    assert_eq!(groups.iter().filter(|g| g.as_deref() == Some("a")).count(), 2);
    assert!(taken.iter().any(|(id, _)| *id == b.id), "b is not held by a");
    let stats = &store.stats(Some("q"), at(2)).await.unwrap()[0];
    assert_eq!((stats.held_group_max_running, stats.held_max_running), (3, 0));
    // Loosened: wakes waiters, and the held jobs go.
    let mut changes = store.changes();
    changes.borrow_and_update();
    store.set_policy("q", policy(0, 0)).await.unwrap();
    assert!(changes.has_changed().unwrap());
    assert_eq!(drain_ids(&store, at(3)).await.len(), 3);
}

#[tokio::test]
async fn policies_survive_a_restart_and_bad_ones_change_nothing() {
    let dir = guard().await;
    let cap = |c: &mut jobq_server::Config| c.max_queue_policies = 2;
    {
        let store = reopen_with(&dir, cap).await;
        store.set_policy("q", policy(1, 1)).await.expect("policy");
        store.set_policy("r", policy(5, 0)).await.expect("policy");
        let err = store.set_policy("s", policy(1, 0)).await.expect_err("a third");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
        assert!(err.to_string().contains("--max-queue-policies"), "{err}");
        store.set_policy("r", policy(6, 0)).await.expect("a change at the cap");
        let over = policy(jobq_server::policy::MOST_RUNNING + 1, 0);
        let err = store.set_policy("q", over).await.expect_err("out of range");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        enqueue_in(&store, Some("a"), at(0)).await;
        enqueue_in(&store, Some("a"), at(0)).await;
        assert!(take(&store, "q", at(1)).await.is_some());
        store.close().await.unwrap();
    }
    let store = reopen_with(&dir, cap).await;
    assert_eq!(store.policy("q").await.unwrap(), policy(1, 1), "kept, unchanged");
    assert_eq!(store.policy("r").await.unwrap(), policy(6, 0));
    assert!(take(&store, "q", at(2)).await.is_none(), "still one at a time");
    let listed: Vec<(String, QueuePolicy)> = store
        .stats(None, at(2))
        .await
        .unwrap()
        .into_iter()
        .filter(|s| !s.policy.is_empty())
        .map(|s| (s.queue, s.policy))
        .collect();
    assert_eq!(
        listed,
        [("q".to_owned(), policy(1, 1)), ("r".to_owned(), policy(6, 0))],
        "a queue with a policy and no jobs is listed too"
    );
}

#[tokio::test]
async fn a_rate_limit_hands_out_its_burst_then_a_token_per_interval() {
    let (_dir, store) = fresh().await;
    let rate = Rate {
        limit: 10,
        per: Duration::from_secs(1),
        burst: 3,
    };
    let limited = QueuePolicy {
        rate: Some(rate),
        ..QueuePolicy::default()
    };
    store.set_policy("q", limited).await.expect("policy");
    assert_eq!(store.policy("q").await.unwrap(), limited);
    for _ in 0..12 {
        enqueue_in(&store, None, at(0)).await;
    }
    assert_eq!(drain_ids(&store, at(1_000)).await.len(), 3, "the burst");
    assert!(drain_ids(&store, at(1_050)).await.is_empty(), "half a token");
    assert_eq!(drain_ids(&store, at(1_100)).await.len(), 1, "one per 100 ms");
    assert_eq!(drain_ids(&store, at(5_000)).await.len(), 3, "never more than the burst");
    // Held, not spent: the rest are PENDING with no attempt.
    let stats = &store.stats(Some("q"), at(5_000)).await.unwrap()[0];
    assert_eq!((stats.pending, stats.running), (5, 7));
    // A new policy starts with a full bucket.
    store.set_policy("q", limited).await.unwrap();
    assert_eq!(drain_ids(&store, at(5_001)).await.len(), 3);
    let bad = QueuePolicy {
        rate: Some(Rate {
            per: Duration::ZERO,
            ..rate
        }),
        ..QueuePolicy::default()
    };
    let err = store.set_policy("q", bad).await.expect_err("a zero period");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert_eq!(store.policy("q").await.unwrap(), limited, "unchanged");
}

#[tokio::test]
async fn a_group_rate_limits_each_group_and_not_the_others() {
    let (_dir, store) = fresh().await;
    let per_group = QueuePolicy {
        group_rate: Some(Rate {
            limit: 10,
            per: Duration::from_secs(1),
            burst: 2,
        }),
        ..QueuePolicy::default()
    };
    store.set_policy("q", per_group).await.expect("policy");
    for _ in 0..5 {
        enqueue_in(&store, Some("a"), at(0)).await;
    }
    for _ in 0..3 {
        enqueue_in(&store, Some("b"), at(0)).await;
    }
    let free = enqueue_in(&store, None, at(0)).await;
    let group_of = |id: JobId| {
        let store = &store;
        async move { store.get(id).await.unwrap().group }
    };
    let mut groups = Vec::new();
    for (id, _) in drain_ids(&store, at(1_000)).await {
        groups.push(group_of(id).await);
    }
    let count = |g: Option<&str>| groups.iter().filter(|x| x.as_deref() == g).count();
    assert_eq!((count(Some("a")), count(Some("b")), count(None)), (2, 2, 1), "each group's burst, and the free job");
    assert!(groups.contains(&None) && store.get(free.id).await.unwrap().status == Status::Running);
    assert!(drain_ids(&store, at(1_050)).await.is_empty(), "half a token each");
    // A token each 100 ms: one of a and one of b.
    let next = drain_ids(&store, at(1_100)).await;
    assert_eq!(next.len(), 2);
    // b has no jobs left; a's last two come 100 ms apart... or at once
    // after a quiet spell, up to the burst.
    assert_eq!(drain_ids(&store, at(10_000)).await.len(), 2);
    assert!(drain_ids(&store, at(20_000)).await.is_empty());
}
