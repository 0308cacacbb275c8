// Schedules, part of the store contract: included by
// `suite.rs`, so they run against every backend.

fn schedule(name: &str, cron: &str, created_ms: u64) -> Schedule {
    Schedule {
        name: name.into(),
        queue: "reports".into(),
        kind: "build-report".into(),
        payload: b"{\"month\":11}".to_vec(),
        cron: cron.into(),
        timezone: "Europe/Berlin".into(),
        max_attempts: 5,
        created_at: at(created_ms),
        last_tick: None,
    }
}

/// Accepts every schedule.
fn room(_: &[Schedule]) -> Result<(), jobq_server::Error> {
    Ok(())
}

fn tick_job(schedule: &Schedule, tick_ms: u64) -> NewJob {
    NewJob {
        queue: schedule.queue.clone(),
        kind: schedule.kind.clone(),
        payload: schedule.payload.clone(),
        key: Some(format!("schedule:{}:{tick_ms}", schedule.name)),
        max_attempts: schedule.max_attempts,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: jobq_server::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    }
}

#[tokio::test]
async fn a_tick_of_a_schedule_deleted_or_replaced_since_it_was_read_enqueues_nothing() {
    let (_guard, store) = fresh().await;
    let read = schedule("nightly", "0 3 * * *", 0);
    store.put_schedule(read.clone(), room).await.unwrap();
    let fired = store
        .fire_schedule(&read, at(10_000), tick_job(&read, 10_000))
        .await
        .unwrap()
        .expect("the schedule as read");
    assert_eq!(store.schedules().await.unwrap()[0].last_tick, Some(at(10_000)));

    // Replaced: the old copy's tick neither enqueues nor moves the new
    // schedule's last tick.
    let replacement = Schedule {
        queue: "other".into(),
        ..schedule("nightly", "0 3 * * *", 20_000)
    };
    store.put_schedule(replacement.clone(), room).await.unwrap();
    let stale = store
        .fire_schedule(&read, at(30_000), tick_job(&read, 30_000))
        .await
        .unwrap();
    assert!(stale.is_none(), "{stale:?}");
    assert_eq!(store.schedules().await.unwrap(), vec![replacement.clone()]);

    // Deleted: nothing either.
    store.delete_schedule("nightly").await.unwrap();
    let gone = store
        .fire_schedule(&replacement, at(40_000), tick_job(&replacement, 40_000))
        .await
        .unwrap();
    assert!(gone.is_none(), "{gone:?}");
    let jobs = store
        .list(ListFilter {
            limit: 10,
            ..ListFilter::default()
        })
        .await
        .unwrap()
        .jobs;
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, vec![fired.job.id], "only the tick of the live schedule");
}

#[tokio::test]
async fn schedules_are_stored_replaced_ticked_and_deleted_and_survive_a_reopen() {
    let (guard, store) = fresh().await;
    assert!(store.schedules().await.unwrap().is_empty());
    let nightly = schedule("nightly", "0 3 * * *", 0);
    let hourly = schedule("hourly", "0 * * * *", 1);
    store.put_schedule(nightly.clone(), room).await.unwrap();
    store.put_schedule(hourly.clone(), room).await.unwrap();
    assert_eq!(
        store.schedules().await.unwrap(),
        vec![hourly.clone(), nightly.clone()],
        "by name"
    );

    // last_tick only moves forward; an unknown name is no error, and
    // neither is another schedule of the same name (a replaced one).
    store.schedule_ticked(&hourly, at(5_000)).await.unwrap();
    store.schedule_ticked(&hourly, at(4_000)).await.unwrap();
    let gone = schedule("gone", "0 * * * *", 1);
    store.schedule_ticked(&gone, at(4_000)).await.unwrap();
    let older = schedule("hourly", "0 * * * *", 0);
    store.schedule_ticked(&older, at(8_000)).await.unwrap();
    let hourly = Schedule {
        last_tick: Some(at(5_000)),
        ..hourly
    };
    assert_eq!(store.schedules().await.unwrap()[0], hourly);
    // Back only from a last tick in the future (a clock that ran ahead).
    let ahead = SystemTime::now() + Duration::from_secs(7 * 24 * 3600);
    store.schedule_ticked(&hourly, ahead).await.unwrap();
    store.schedule_ticked(&hourly, at(6_000)).await.unwrap();
    let hourly = Schedule {
        last_tick: Some(at(6_000)),
        ..hourly
    };
    assert_eq!(store.schedules().await.unwrap()[0], hourly);

    // Creating one with the same name replaces it whole.
    let replaced = Schedule {
        cron: "*/5 * * * * *".into(),
        queue: "other".into(),
        ..schedule("nightly", "", 9_000)
    };
    store.put_schedule(replaced.clone(), room).await.unwrap();
    assert_eq!(
        store.schedules().await.unwrap(),
        vec![hourly.clone(), replaced.clone()]
    );

    assert_eq!(
        store.delete_schedule("nightly").await.unwrap(),
        Some(replaced)
    );
    assert_eq!(store.delete_schedule("nightly").await.unwrap(), None);

    drop(store);
    let store = reopen(&guard).await;
    assert_eq!(store.schedules().await.unwrap(), vec![hourly]);
}
