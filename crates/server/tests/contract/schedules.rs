// Schedules (issue 13), part of the store contract: included by
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

#[tokio::test]
async fn schedules_are_stored_replaced_ticked_and_deleted_and_survive_a_reopen() {
    let (guard, store) = fresh().await;
    assert!(store.schedules().await.unwrap().is_empty());
    let nightly = schedule("nightly", "0 3 * * *", 0);
    let hourly = schedule("hourly", "0 * * * *", 1);
    store.put_schedule(nightly.clone()).await.unwrap();
    store.put_schedule(hourly.clone()).await.unwrap();
    assert_eq!(
        store.schedules().await.unwrap(),
        vec![hourly.clone(), nightly.clone()],
        "by name"
    );

    // last_tick only moves forward; an unknown name is no error.
    store.schedule_ticked("hourly", at(5_000)).await.unwrap();
    store.schedule_ticked("hourly", at(4_000)).await.unwrap();
    store.schedule_ticked("gone", at(4_000)).await.unwrap();
    let hourly = Schedule {
        last_tick: Some(at(5_000)),
        ..hourly
    };
    assert_eq!(store.schedules().await.unwrap()[0], hourly);
    // Back only from a last tick in the future (a clock that ran ahead).
    let ahead = SystemTime::now() + Duration::from_secs(7 * 24 * 3600);
    store.schedule_ticked("hourly", ahead).await.unwrap();
    store.schedule_ticked("hourly", at(6_000)).await.unwrap();
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
    store.put_schedule(replaced.clone()).await.unwrap();
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
