// Progress (docs/src/results.md, "Progress"): a heartbeat's report is kept
// with its job by the write that extends the lease, read back by gets and
// lists, kept after the job ends and across a restart, shown for the
// attempt that reported it only, and deleted with the job. Included by
// `suite.rs`.

fn progress(percent: u32, message: &str) -> Option<jobq_server::job::Report> {
    Some(jobq_server::job::Report {
        percent,
        message: message.into(),
    })
}

fn progress_of(job: &Job) -> Option<(u32, &str, SystemTime)> {
    job.progress_now()
        .map(|p| (p.percent, p.message.as_str(), p.reported_at))
}

#[tokio::test]
async fn a_heartbeats_progress_is_kept_with_its_job_until_the_job_is_deleted() {
    let dir = guard().await;
    let (first, second) = {
        let store = reopen(&dir).await;
        let first = enqueue(&store, "q", Some("import-7"), 0, at(0)).await;
        let second = enqueue(&store, "q", None, 0, at(1)).await;
        let leased = take(&store, "q", at(2)).await.expect("due");
        assert_eq!(leased.job.id, first.id);
        assert_eq!(progress_of(&store.get(first.id).await.unwrap()), None);
        let held = [(first.id, leased.lease_id)];
        let got = store
            .extend(&held, &[progress(40, "row 4,000 of 10,000")], None, at(3))
            .await
            .unwrap();
        assert!(got[0].is_ok(), "{got:?}");
        let expected = Some((40, "row 4,000 of 10,000", at(3)));
        assert_eq!(progress_of(&store.get(first.id).await.unwrap()), expected);
        // A stale lease's report changes nothing; a heartbeat without one
        // keeps the last.
        let stale = [(first.id, LeaseId(leased.lease_id.0 ^ 1))];
        let got = store
            .extend(&stale, &[progress(99, "stale")], None, at(4))
            .await
            .unwrap();
        assert!(got[0].is_err());
        store.extend(&held, &[], None, at(5)).await.unwrap();
        let job = store.get(first.id).await.unwrap();
        assert_eq!(progress_of(&job), expected);
        assert_eq!(job.lease_expires_at(), Some(at(5) + LEASE));
        store
            .extend(&held, &[progress(80, "row 8,000")], None, at(6))
            .await
            .unwrap();
        // Lists and the payload-less read (WatchJob's) carry it too.
        let page = store.list(ListFilter::default()).await.unwrap();
        let listed = page.jobs.iter().find(|j| j.id == first.id).unwrap();
        assert_eq!(progress_of(listed), Some((80, "row 8,000", at(6))));
        assert_eq!(
            progress_of(&store.peek(first.id).await.unwrap()),
            Some((80, "row 8,000", at(6)))
        );
        // Kept after the job is DONE.
        store.ack(first.id, leased.lease_id, at(7)).await.unwrap();
        // The second job reports, fails, and is taken again: the new
        // attempt has no progress until it reports.
        let leased = take(&store, "q", at(8)).await.expect("due");
        assert_eq!(leased.job.id, second.id);
        store
            .extend(&[(second.id, leased.lease_id)], &[progress(10, "")], None, at(9))
            .await
            .unwrap();
        assert_eq!(
            progress_of(&store.get(second.id).await.unwrap()),
            Some((10, "", at(9)))
        );
        store
            .fail(second.id, report(leased.lease_id, Some(Duration::ZERO)), at(10))
            .await
            .unwrap();
        let again = take(&store, "q", at(11)).await.expect("due again");
        assert_eq!(again.job.id, second.id);
        assert_eq!(progress_of(&store.get(second.id).await.unwrap()), None);
        store
            .extend(&[(second.id, again.lease_id)], &[progress(70, "again")], None, at(12))
            .await
            .unwrap();
        store.ack(second.id, again.lease_id, at(13)).await.unwrap();
        assert_eq!(
            progress_of(&store.get(second.id).await.unwrap()),
            Some((70, "again", at(12)))
        );
        (first.id, second.id)
    };
    // Durable with the heartbeat, across a restart.
    let store = reopen(&dir).await;
    assert_eq!(
        progress_of(&store.get(first).await.unwrap()),
        Some((80, "row 8,000", at(6)))
    );
    // Deleted with its job, by a delete or a purge.
    store.delete(first).await.unwrap();
    assert!(matches!(store.get(first).await, Err(jobq_server::Error::NotFound(_))));
    assert_eq!(store.purge(at(100), at(100)).await.unwrap(), 1);
    assert!(matches!(store.get(second).await, Err(jobq_server::Error::NotFound(_))));
}
