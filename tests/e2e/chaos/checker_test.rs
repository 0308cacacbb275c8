//! The checkers themselves, on made-up histories: a clean run passes, and
//! each broken promise is reported.

#[allow(unused_imports)]
use super::*;

/// The checker itself, on made-up histories: a clean run passes, and each
/// broken promise is reported (so a passing suite means something).
#[test]
fn chaos_checker_reports_each_broken_promise() {
    let line = |t: u64, worker: &str, event: &str, job: &str, lease: &str, extra: &str| Line {
        t,
        worker: worker.into(),
        event: event.into(),
        job: job.into(),
        lease: lease.into(),
        extra: extra.into(),
    };
    let attempt = |job: &str, lease: &str, worker: &str, started, ended, outcome: &str| Attempt {
        job: job.into(),
        lease: lease.into(),
        worker: worker.into(),
        started,
        ended,
        outcome: outcome.into(),
        group: String::new(),
    };
    let enqueued: BTreeMap<String, String> = [("k1".into(), "1".into())].into();
    let s = 1_000_000_000;
    // Worker a's lease 10 is lost to a server kill; worker b gets lease 11
    // and acks it.
    let clean = vec![
        line(s, "a", "leased", "1", "10", "0"),
        line(2 * s, "a", "confirm", "1", "10", &(2 * s - 1).to_string()),
        line(8 * s, "b", "leased", "1", "11", "1"),
        line(9 * s, "a", "lost", "1", "10", ""),
        line(9 * s, "b", "acked", "1", "11", &(9 * s - 5).to_string()),
    ];
    let server_kill = Fault {
        what: "SIGKILL server 0".into(),
        server: true,
        slot: Some(0),
        pg_restart: false,
        from: 3 * s,
        to: 4 * s,
    };
    let fin = |outcome_10: &str| Final {
        status: [("1".into(), "done".into())].into(),
        attempts: vec![
            attempt("1", "10", "a", s, 7 * s, outcome_10),
            attempt("1", "11", "b", 8 * s, 9 * s, "acked"),
        ],
    };
    let none = HashMap::new();
    let faults = [server_kill.clone()];
    let (bad, _) = check(
        &enqueued,
        &clean,
        &none,
        &faults,
        &fin("worker_disconnected"),
        0,
    );
    assert!(bad.is_empty(), "{bad:?}");

    // Without the server kill, the spent attempt is unexplained.
    let (bad, _) = check(&enqueued, &clean, &none, &[], &fin("lease_expired"), 0);
    assert!(
        bad.len() == 1 && bad[0].contains("no kill or freeze"),
        "{bad:?}"
    );
    // A killed worker explains it.
    let killed = [("a".to_owned(), 3 * s)].into();
    let (bad, _) = check(&enqueued, &clean, &killed, &[], &fin("lease_expired"), 0);
    assert!(bad.is_empty(), "{bad:?}");

    // Lease 10 still honoured after lease 11 reached worker b; and acked.
    let mut stale = clean.clone();
    stale.push(line(
        10 * s,
        "a",
        "acked",
        "1",
        "10",
        &(8 * s + 1).to_string(),
    ));
    let (bad, _) = check(&enqueued, &stale, &none, &faults, &fin("acked"), 0);
    let all = bad.join("\n");
    assert!(all.contains("acked under two leases"), "{all}");
    assert!(all.contains("still honoured (acked)"), "{all}");
    assert!(all.contains("done with 2 acked attempts"), "{all}");

    // A lease delivered after the ack (and after its own attempt ended), a
    // lease without an attempt; a job that is not done; an unknown job
    // left pending.
    let mut late = clean.clone();
    late.push(line(12 * s, "c", "leased", "1", "12", "2"));
    late.push(line(12 * s, "c", "leased", "1", "10", "2"));
    let mut lost = fin("worker_disconnected");
    lost.status.insert("1".into(), "running".into());
    lost.status.insert("2".into(), "pending".into());
    let (bad, _) = check(&enqueued, &late, &none, &faults, &lost, 0);
    let all = bad.join("\n");
    assert!(all.contains("after the job was acked"), "{all}");
    assert!(
        all.contains("lease 12 reached c at 12.000s, and the database has no attempt"),
        "{all}"
    );
    assert!(
        all.contains("lease 10 reached c at 12.000s, after its attempt ended"),
        "{all}"
    );
    assert!(all.contains("job 1 (key k1) ended running"), "{all}");
    assert!(all.contains("job 2 is pending at the end"), "{all}");

    // Timing. Lease 10, held through server 0 when it was killed at 3 s,
    // ended at 7 s: within the server timeout + 1 s. At 9 s it is late,
    // unless worker a declared it on a new stream in time.
    let (bad, _) = check_timing(&clean, &none, &faults, &fin("worker_disconnected"), 0);
    assert!(bad.is_empty(), "{bad:?}");
    let mut slow = fin("worker_disconnected");
    slow.attempts[0].ended = 9 * s;
    let (bad, _) = check_timing(&clean, &none, &faults, &slow, 0);
    assert!(
        bad.len() == 1 && bad[0].contains("not within") && bad[0].contains("server 0"),
        "{bad:?}"
    );
    let mut redeclared = clean.clone();
    redeclared.push(line(5 * s, "a", "stream", "", "", "1"));
    let (bad, _) = check_timing(&redeclared, &none, &faults, &slow, 0);
    assert!(bad.is_empty(), "{bad:?}");
    // Worker a killed at 3 s: its attempt must end by 4.5 s.
    let killed = [("a".to_owned(), 3 * s)].into();
    let (bad, _) = check_timing(&clean, &killed, &[], &fin("worker_disconnected"), 0);
    assert!(
        bad.len() == 1 && bad[0].contains("worker a was killed at 3.000s"),
        "{bad:?}"
    );
    let mut prompt = fin("worker_disconnected");
    prompt.attempts[0].ended = 4 * s;
    let (bad, _) = check_timing(&clean, &killed, &[], &prompt, 0);
    assert!(bad.is_empty(), "{bad:?}");

    // A kind of worker that recorded no ack.
    let workers = [
        ("a".to_owned(), Runtime::Raw),
        ("b".to_owned(), Runtime::Rust(0)),
    ];
    let (bad, _) = runtimes(&workers, &stale);
    assert!(bad.is_empty(), "{bad:?}");
    let (bad, _) = runtimes(&workers, &clean);
    assert!(
        bad.len() == 1 && bad[0].contains("raw workers recorded 1 leases and 0 acks"),
        "{bad:?}"
    );
}

/// The limits checker on made-up runs: six at once pass, a seventh that
/// overlaps them is reported however short, an end stamped within the
/// slack after the next start is not, and so is a third run of a group.
#[test]
fn chaos_limits_checker_reports_a_broken_limit() {
    const MS: u64 = 1_000_000;
    let run = |group: &'static str, started: u64, ended: u64| Run {
        group,
        started: started * MS,
        ended: ended * MS,
    };
    let six: Vec<Run<'_>> = (0..6)
        .map(|i| run(["a", "b", "c"][i % 3], 0, 1_000))
        .collect();
    let (bad, _) = check_limits("test", &six, PG_SLACK);
    assert!(bad.is_empty(), "{bad:?}");
    // A seventh, 5 ms long, while the six run.
    let mut seven = six;
    seven.push(run("d", 500, 505));
    let (bad, _) = check_limits("test", &seven, PG_SLACK);
    assert_eq!(bad.len(), 1, "{bad:?}");
    // A seventh that starts as one of the six ends, that end stamped 5 ms
    // late: stamps out of order, not seven at once.
    let mut handover: Vec<Run<'_>> = (0..6)
        .map(|i| run(["a", "b", "c"][i % 3], 0, 1_000))
        .collect();
    handover[0].ended = 1_005 * MS;
    handover.push(run("d", 1_000, 2_000));
    let (bad, _) = check_limits("test", &handover, PG_SLACK);
    assert!(bad.is_empty(), "{bad:?}");
    // Three of group a at once.
    let group = vec![run("a", 0, 100), run("a", 10, 100), run("a", 20, 30)];
    let (bad, _) = check_limits("test", &group, PG_SLACK);
    assert_eq!(bad.len(), 1, "{bad:?}");
}
