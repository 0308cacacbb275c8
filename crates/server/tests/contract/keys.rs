// Uniqueness rules of keys (docs/src/shaping.md, "Uniqueness"): a key
// held while its job is active or for a window, an enqueue that replaces
// a PENDING job (debounce), and the outcome each reports, kept over a
// restart. Included by `suite.rs`.

fn keyed(key: &str, unique: Uniqueness) -> NewJob {
    NewJob {
        unique,
        ..new_job("q", Some(key), 0)
    }
}

fn active() -> Uniqueness {
    Uniqueness {
        scope: KeyScope::Active,
        ..Uniqueness::default()
    }
}

fn replacing() -> Uniqueness {
    Uniqueness {
        replace: true,
        ..Uniqueness::default()
    }
}

/// The jobs of `q` that have `key`.
async fn with_key(store: &impl Store, key: &str) -> Vec<JobId> {
    store
        .list(ListFilter {
            queue: Some("q".into()),
            key: Some(key.into()),
            ..ListFilter::default()
        })
        .await
        .expect("list")
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect()
}

#[tokio::test]
async fn an_active_key_is_freed_when_its_job_finishes() {
    let dir = guard().await;
    let store = reopen(&dir).await;
    let first = store.enqueue(keyed("order-4711", active()), at(0)).await.unwrap();
    assert!(first.created);
    // PENDING, then RUNNING: the key is held.
    let again = store.enqueue(keyed("order-4711", active()), at(1)).await.unwrap();
    assert_eq!((again.created, again.replaced), (false, false));
    assert_eq!(again.job.id, first.job.id);
    let leased = take(&store, "q", at(2)).await.expect("due");
    let running = store.enqueue(keyed("order-4711", active()), at(3)).await.unwrap();
    assert_eq!((running.created, running.job.id), (false, first.job.id));
    // DONE: an active-scoped enqueue makes a new job, which takes the key.
    store.ack(first.job.id, leased.lease_id, at(4)).await.unwrap();
    let second = store.enqueue(keyed("order-4711", active()), at(5)).await.unwrap();
    assert!(second.created);
    assert_ne!(second.job.id, first.job.id);
    assert_eq!(second.job.key.as_deref(), Some("order-4711"));
    // The finished job keeps everything but the key: one job per key.
    let done = store.get(first.job.id).await.unwrap();
    assert_eq!((done.status, done.key), (Status::Done, None));
    assert_eq!(with_key(&store, "order-4711").await, [second.job.id]);
    // The default scope sees the new job as the holder.
    let plain = store.enqueue(new_job("q", Some("order-4711"), 0), at(6)).await.unwrap();
    assert_eq!((plain.created, plain.job.id), (false, second.job.id));
    // After a restart, the same: the key is the new job's alone.
    drop(store);
    let store = reopen(&dir).await;
    assert_eq!(store.get(first.job.id).await.unwrap().key, None);
    let after = store.enqueue(keyed("order-4711", active()), at(7)).await.unwrap();
    assert_eq!((after.created, after.job.id), (false, second.job.id));
    assert_eq!(with_key(&store, "order-4711").await, [second.job.id]);
}

#[tokio::test]
async fn a_key_with_a_window_is_held_that_long_after_its_enqueue() {
    let (_dir, store) = fresh().await;
    let hourly = Uniqueness {
        unique_for: Some(Duration::from_millis(1_000)),
        ..Uniqueness::default()
    };
    let first = store.enqueue(keyed("digest-7", hourly), at(0)).await.unwrap();
    // Within the window, whatever the job's state.
    let leased = take(&store, "q", at(10)).await.expect("due");
    store.ack(first.job.id, leased.lease_id, at(20)).await.unwrap();
    let within = store.enqueue(keyed("digest-7", hourly), at(999)).await.unwrap();
    assert_eq!((within.created, within.job.id), (false, first.job.id));
    // From its end on, a new job, whose own window starts.
    let next = store.enqueue(keyed("digest-7", hourly), at(1_000)).await.unwrap();
    assert!(next.created);
    let held = store.enqueue(keyed("digest-7", hourly), at(1_500)).await.unwrap();
    assert_eq!((held.created, held.job.id), (false, next.job.id));
    // A window ends for a PENDING job too: the key moves on.
    let third = store.enqueue(keyed("digest-7", hourly), at(2_000)).await.unwrap();
    assert!(third.created);
    let left = store.get(next.job.id).await.unwrap();
    assert_eq!((left.status, left.key), (Status::Pending, None));
}

#[tokio::test]
async fn a_replace_debounces_a_pending_job_and_follows_a_running_one() {
    let dir = guard().await;
    let store = reopen(&dir).await;
    let first = store
        .enqueue(
            NewJob {
                payload: b"v1".to_vec(),
                ..keyed("reindex-9", replacing())
            },
            at(0),
        )
        .await
        .unwrap();
    assert!(first.created);
    // PENDING: the payload, metadata and due time are the latest enqueue's.
    for (n, payload) in [(1u64, vec![b'x'; 2_000]), (2, b"v3".to_vec())] {
        let mut metadata = BTreeMap::new();
        metadata.insert("edit".to_string(), n.to_string());
        let replaced = store
            .enqueue(
                NewJob {
                    payload: payload.clone(),
                    metadata: metadata.clone(),
                    delay: Duration::from_millis(500),
                    ..keyed("reindex-9", replacing())
                },
                at(n * 100),
            )
            .await
            .unwrap();
        assert_eq!((replaced.created, replaced.replaced), (false, true));
        assert_eq!(replaced.job.id, first.job.id);
        assert_eq!(replaced.job.run_at, at(n * 100 + 500));
        let got = store.get(first.job.id).await.unwrap();
        assert_eq!((got.payload, got.metadata), (payload, metadata));
    }
    assert!(take(&store, "q", at(699)).await.is_none(), "not due before the last delay");
    // Replaced jobs keep their id, attempts and history, across a restart.
    drop(store);
    let store = reopen(&dir).await;
    let leased = take(&store, "q", at(700)).await.expect("due");
    assert_eq!(leased.job.id, first.job.id);
    assert_eq!(leased.job.payload, b"v3");
    // RUNNING: its worker has the payload; the enqueue makes a successor,
    // which takes the key over, and the running job goes on without it.
    let successor = store
        .enqueue(
            NewJob {
                payload: b"v4".to_vec(),
                ..keyed("reindex-9", replacing())
            },
            at(800),
        )
        .await
        .unwrap();
    assert_eq!((successor.created, successor.replaced), (true, false));
    assert_ne!(successor.job.id, first.job.id);
    assert_eq!(successor.job.key.as_deref(), Some("reindex-9"));
    let running = store.get(first.job.id).await.unwrap();
    assert_eq!((running.status, running.key, running.payload), (Status::Running, None, b"v3".to_vec()));
    // The next edit debounces the successor, not the running job.
    let again = store
        .enqueue(
            NewJob {
                payload: b"v5".to_vec(),
                ..keyed("reindex-9", replacing())
            },
            at(850),
        )
        .await
        .unwrap();
    assert_eq!((again.replaced, again.job.id), (true, successor.job.id));
    store.ack(first.job.id, leased.lease_id, at(900)).await.unwrap();
    drop(store);
    let store = reopen(&dir).await;
    let next = take(&store, "q", at(1_000)).await.expect("the successor");
    assert_eq!((next.job.id, next.job.payload), (successor.job.id, b"v5".to_vec()));
    store.ack(next.job.id, next.lease_id, at(1_001)).await.unwrap();
    // A finished job keeps a retained key; only an active scope frees it.
    let kept = store.enqueue(keyed("reindex-9", replacing()), at(1_100)).await.unwrap();
    assert_eq!((kept.created, kept.replaced), (false, false));
    let both = Uniqueness {
        scope: KeyScope::Active,
        replace: true,
        unique_for: None,
    };
    let fresh_one = store.enqueue(keyed("reindex-9", both), at(1_200)).await.unwrap();
    assert!(fresh_one.created);
}

#[tokio::test]
async fn a_batch_with_a_replacing_entry_makes_one_job_with_the_latest_payload() {
    let (_dir, store) = fresh().await;
    let got = store
        .enqueue_batch(
            vec![
                NewJob {
                    payload: b"v1".to_vec(),
                    ..keyed("k", Uniqueness::default())
                },
                NewJob {
                    payload: b"v2".to_vec(),
                    ..keyed("k", replacing())
                },
                keyed("k", Uniqueness::default()),
            ],
            at(0),
        )
        .await
        .unwrap();
    let outcomes: Vec<(bool, bool)> = got.iter().map(|e| (e.created, e.replaced)).collect();
    assert_eq!(outcomes, [(true, false), (false, true), (false, false)]);
    assert!(got.iter().all(|e| e.job.id == got[0].job.id));
    assert_eq!(store.get(got[0].job.id).await.unwrap().payload, b"v2");
}

#[tokio::test]
async fn a_replaced_payload_from_any_place_reads_back_after_a_restart() {
    let dir = guard().await;
    // Payloads from 4 KiB go to files on sled (PostgreSQL ignores it).
    let tweak = |c: &mut Config| c.payload_file_bytes = 4096;
    let big = |b: u8| vec![b; 10_000];
    let mut ids = Vec::new();
    {
        let store = reopen_with(&dir, tweak).await;
        // In a file, in the tree, inline: each replaced by each kind.
        for (n, (from, to)) in [
            (big(1), b"small".to_vec()),
            (vec![2; 1_000], big(3)),
            (b"small".to_vec(), vec![4; 1_000]),
            (big(5), big(6)),
        ]
        .into_iter()
        .enumerate()
        {
            let key = format!("doc-{n}");
            let first = store
                .enqueue(
                    NewJob {
                        payload: from,
                        ..keyed(&key, Uniqueness::default())
                    },
                    at(0),
                )
                .await
                .unwrap();
            let replaced = store
                .enqueue(
                    NewJob {
                        payload: to.clone(),
                        ..keyed(&key, replacing())
                    },
                    at(1),
                )
                .await
                .unwrap();
            assert!(replaced.replaced);
            assert_eq!(store.get(first.job.id).await.unwrap().payload, to);
            ids.push((first.job.id, to));
        }
    }
    let store = reopen_with(&dir, tweak).await;
    for (id, payload) in &ids {
        assert_eq!(&store.get(*id).await.unwrap().payload, payload);
    }
    // Taken (its payload moves apart on sled), then read again.
    for _ in &ids {
        let leased = take(&store, "q", at(10)).await.expect("due");
        let (_, payload) = ids.iter().find(|(id, _)| *id == leased.job.id).unwrap();
        assert_eq!(&leased.job.payload, payload);
        assert_eq!(&store.get(leased.job.id).await.unwrap().payload, payload);
    }
}

#[tokio::test]
async fn concurrent_enqueues_that_take_a_key_over_make_one_job() {
    let (_dir, store) = fresh().await;
    let store = Arc::new(store);
    let first = store.enqueue(keyed("export-7", active()), at(0)).await.unwrap();
    let leased = take(&*store, "q", at(1)).await.expect("due");
    store.ack(first.job.id, leased.lease_id, at(2)).await.unwrap();
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.enqueue(keyed("export-7", active()), at(3)).await })
        })
        .collect();
    let mut got = Vec::new();
    for racer in racers {
        got.push(racer.await.unwrap().expect("every enqueue succeeds"));
    }
    assert_eq!(got.iter().filter(|e| e.created).count(), 1, "{got:?}");
    let new = got.iter().find(|e| e.created).unwrap().job.id;
    assert!(got.iter().all(|e| e.job.id == new));
    assert_eq!(with_key(&*store, "export-7").await, [new]);
}

/// A debounce's successor of a RUNNING job waits for it under a sequence
/// (the key as the group, `group_max_running 1`): the edit made while the
/// job ran runs once it has ended, not beside it.
#[tokio::test]
async fn a_successor_in_a_sequence_waits_for_the_running_job() {
    let (_dir, store) = fresh().await;
    store
        .set_policy(
            "q",
            QueuePolicy {
                max_running: 0,
                group_max_running: 1,
                rate: None,
                group_rate: None,
            },
        )
        .await
        .unwrap();
    let edit = |payload: &[u8]| NewJob {
        payload: payload.to_vec(),
        group: Some("doc-9".into()),
        ..keyed("doc-9", replacing())
    };
    let first = store.enqueue(edit(b"v1"), at(0)).await.unwrap();
    let leased = take(&store, "q", at(1)).await.expect("due");
    assert_eq!(leased.job.id, first.job.id);
    let successor = store.enqueue(edit(b"v2"), at(2)).await.unwrap();
    assert!(successor.created);
    assert!(take(&store, "q", at(3)).await.is_none(), "held behind the running job");
    store.ack(first.job.id, leased.lease_id, at(4)).await.unwrap();
    let next = take(&store, "q", at(5)).await.expect("its turn");
    assert_eq!((next.job.id, next.job.payload), (successor.job.id, b"v2".to_vec()));
}
