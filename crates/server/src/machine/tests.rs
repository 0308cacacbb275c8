//! The status machine as a table: every (status, event) pair and its
//! outcome, plus the seed's worked examples.

use std::time::{Duration, SystemTime};

use super::*;
use crate::job::{JobId, LeaseId, NewJob, Outcome, Status};

const LEASE: Duration = Duration::from_secs(30);
const BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(60),
};

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn new_job(max_attempts: u32) -> Job {
    let new = NewJob {
        queue: "emails".into(),
        kind: "send-email".into(),
        payload: b"order-4711".to_vec(),
        key: Some("order-4711".into()),
        max_attempts,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: crate::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    };
    create(JobId(1), new, t(0))
}

fn take(job: Job, lease: u64, now: SystemTime) -> Result<Job, TransitionError> {
    apply(
        job,
        Event::Take {
            lease_id: LeaseId(lease),
            worker_id: "w1".into(),
            owner: None,
            lease: LEASE,
        },
        now,
    )
}

fn fail(lease: u64) -> Event {
    fail_with(lease, None, false)
}

fn fail_with(lease: u64, retry_delay: Option<Duration>, fatal: bool) -> Event {
    Event::Fail {
        lease_id: LeaseId(lease),
        error: "smtp down".into(),
        retry_delay,
        fatal,
        backoff: BACKOFF,
        jitter: 1.0,
    }
}

fn cancel(reason: &str) -> Event {
    Event::Cancel {
        reason: reason.into(),
    }
}

/// A job in each status, holding lease 7 when RUNNING.
fn in_status(status: Status) -> Job {
    let running = take(new_job(3), 7, t(1)).expect("take");
    match status {
        Status::Pending => new_job(3),
        Status::Running => running,
        Status::Done => apply(
            running,
            Event::Ack {
                lease_id: LeaseId(7),
                result: None,
            },
            t(2),
        )
        .expect("ack"),
        Status::Failed => apply(running, fail_with(7, None, true), t(2)).expect("fatal fail"),
    }
}

#[test]
fn the_transition_table() {
    use Status::*;
    // (from, event, expected status or error kind)
    let now = t(10);
    let table: Vec<(Status, Event, Result<Status, &str>)> = vec![
        (
            Pending,
            Event::Take {
                lease_id: LeaseId(8),
                worker_id: "w2".into(),
                owner: None,
                lease: LEASE,
            },
            Ok(Running),
        ),
        (
            Running,
            Event::Take {
                lease_id: LeaseId(8),
                worker_id: "w2".into(),
                owner: None,
                lease: LEASE,
            },
            Err("not allowed"),
        ),
        (
            Done,
            Event::Take {
                lease_id: LeaseId(8),
                worker_id: "w2".into(),
                owner: None,
                lease: LEASE,
            },
            Err("not allowed"),
        ),
        (
            Failed,
            Event::Take {
                lease_id: LeaseId(8),
                worker_id: "w2".into(),
                owner: None,
                lease: LEASE,
            },
            Err("not allowed"),
        ),
        (
            Running,
            Event::Ack {
                lease_id: LeaseId(7),
                result: None,
            },
            Ok(Done),
        ),
        (
            Running,
            Event::Ack {
                lease_id: LeaseId(6),
                result: None,
            },
            Err("stale"),
        ),
        (
            Pending,
            Event::Ack {
                lease_id: LeaseId(7),
                result: None,
            },
            Err("stale"),
        ),
        (
            Done,
            Event::Ack {
                lease_id: LeaseId(7),
                result: None,
            },
            Err("not allowed"),
        ),
        (
            Done,
            Event::Ack {
                lease_id: LeaseId(6),
                result: None,
            },
            Err("stale"),
        ),
        (
            Failed,
            Event::Ack {
                lease_id: LeaseId(7),
                result: None,
            },
            Err("stale"),
        ),
        (Running, fail(7), Ok(Pending)),
        (Running, fail(6), Err("stale")),
        (Pending, fail(7), Err("stale")),
        (Done, fail(7), Err("not allowed")),
        (
            Running,
            Event::Extend {
                lease_id: LeaseId(7),
                extend_by: None,
                progress: None,
            },
            Ok(Running),
        ),
        (
            Running,
            Event::Extend {
                lease_id: LeaseId(6),
                extend_by: None,
                progress: None,
            },
            Err("stale"),
        ),
        (
            Pending,
            Event::Extend {
                lease_id: LeaseId(7),
                extend_by: None,
                progress: None,
            },
            Err("stale"),
        ),
        (
            Running,
            Event::Reclaim {
                lease_id: LeaseId(7),
                outcome: Outcome::WorkerDisconnected,
            },
            Ok(Pending),
        ),
        (
            Running,
            Event::Reclaim {
                lease_id: LeaseId(7),
                outcome: Outcome::Revoked,
            },
            Ok(Pending),
        ),
        (
            Running,
            Event::Reclaim {
                lease_id: LeaseId(7),
                outcome: Outcome::LeaseExpired,
            },
            Err("not expired"),
        ),
        (
            Running,
            Event::Reclaim {
                lease_id: LeaseId(6),
                outcome: Outcome::WorkerDisconnected,
            },
            Err("stale"),
        ),
        (
            Running,
            Event::Return {
                lease_id: LeaseId(7),
                if_expired: false,
            },
            Ok(Pending),
        ),
        (
            Running,
            Event::Return {
                lease_id: LeaseId(6),
                if_expired: false,
            },
            Err("stale"),
        ),
        (
            Pending,
            Event::Return {
                lease_id: LeaseId(7),
                if_expired: false,
            },
            Err("stale"),
        ),
        (
            Running,
            Event::Return {
                lease_id: LeaseId(7),
                if_expired: true,
            },
            Err("not expired"),
        ),
        (
            Done,
            Event::Return {
                lease_id: LeaseId(7),
                if_expired: false,
            },
            Err("not allowed"),
        ),
        (
            Running,
            Event::RestartGrace {
                lease_id: LeaseId(7),
                grace: None,
            },
            Ok(Running),
        ),
        (
            Running,
            Event::RestartGrace {
                lease_id: LeaseId(6),
                grace: None,
            },
            Err("stale"),
        ),
        (
            Failed,
            Event::RestartGrace {
                lease_id: LeaseId(7),
                grace: None,
            },
            Err("stale"),
        ),
        (Pending, Event::Retry, Err("not allowed")),
        (Running, Event::Retry, Err("not allowed")),
        (Done, Event::Retry, Err("not allowed")),
        (Failed, Event::Retry, Ok(Pending)),
        (Pending, cancel("stop"), Ok(Failed)),
        (Running, cancel("stop"), Ok(Failed)),
        (Done, cancel("stop"), Err("not allowed")),
        (Failed, cancel("stop"), Err("not allowed")),
    ];
    for (from, event, expected) in table {
        let job = in_status(from);
        let name = event.name();
        let got = apply(job.clone(), event, now);
        match (got, expected) {
            (Ok(after), Ok(status)) => assert_eq!(after.status, status, "{from} --{name}-->"),
            (Err(err), Err(kind)) => {
                let actual = match err {
                    TransitionError::NotAllowed { .. } => "not allowed",
                    TransitionError::StaleLease { .. } => "stale",
                    TransitionError::NotExpired { .. } => "not expired",
                    TransitionError::NotDue { .. } => "not due",
                    TransitionError::Expired { .. } => "expired",
                    TransitionError::Running { .. } => "running",
                };
                assert_eq!(actual, kind, "{from} --{name}--> {err}");
            }
            (got, expected) => panic!("{from} --{name}-->: got {got:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn take_sets_running_with_taken_at_and_a_lease() {
    let job = take(new_job(3), 7, t(5)).expect("take");
    assert_eq!(job.status, Status::Running);
    let lease = job.lease.as_ref().expect("lease");
    assert_eq!(
        (lease.id, lease.taken_at, lease.expires_at),
        (LeaseId(7), t(5), t(5) + LEASE)
    );
    assert_eq!(job.history.len(), 1);
    assert_eq!(job.attempts, 0, "a take is not an attempt that ended");
}

#[test]
fn a_job_is_not_taken_before_run_at() {
    let mut job = new_job(3);
    job.run_at = t(100);
    assert!(matches!(
        take(job, 1, t(99)),
        Err(TransitionError::NotDue { .. })
    ));
}

#[test]
fn ack_makes_it_done_and_a_second_ack_is_rejected() {
    let job = apply(
        in_status(Status::Running),
        Event::Ack {
            lease_id: LeaseId(7),
            result: None,
        },
        t(3),
    )
    .expect("ack");
    assert_eq!(job.status, Status::Done);
    assert_eq!(job.finished_at, Some(t(3)));
    assert!(job.lease.is_none());
    assert_eq!(job.history[0].outcome, Some(Outcome::Acked));
    assert!(matches!(
        apply(
            job,
            Event::Ack {
                lease_id: LeaseId(7),
                result: None
            },
            t(4)
        ),
        Err(TransitionError::NotAllowed { .. })
    ));
}

#[test]
fn an_ack_after_a_failed_attempt_clears_last_error_and_the_history_keeps_it() {
    let job = apply(in_status(Status::Running), fail(7), t(3)).expect("fail");
    assert_eq!(job.last_error.as_deref(), Some("smtp down"));
    let job = take(job, 8, t(1_000)).expect("take again");
    let job = apply(
        job,
        Event::Ack {
            lease_id: LeaseId(8),
            result: None,
        },
        t(1_001),
    )
    .expect("ack");
    assert_eq!(job.status, Status::Done);
    assert_eq!(job.last_error, None, "the last attempt ended well");
    assert_eq!(job.history[0].error.as_deref(), Some("smtp down"));
    assert_eq!(job.history[1].outcome, Some(Outcome::Acked));
}

#[test]
fn a_snooze_puts_the_job_back_without_counting_the_attempt() {
    let snooze = |lease: u64, delay: u64| Event::Snooze {
        lease_id: LeaseId(lease),
        reason: "429".into(),
        delay: Duration::from_secs(delay),
    };
    let job = apply(in_status(Status::Running), snooze(7, 30), t(3)).expect("snooze");
    assert_eq!((job.status, job.attempts), (Status::Pending, 0));
    assert_eq!(job.run_at, t(33));
    assert!(job.lease.is_none());
    assert_eq!(job.last_error, None, "nothing failed");
    let last = job.history.last().unwrap();
    assert_eq!(
        (last.outcome, last.error.as_deref()),
        (Some(Outcome::Snoozed), Some("429"))
    );
    // Only the holder of a running job may snooze it.
    assert!(matches!(
        apply(in_status(Status::Running), snooze(8, 0), t(3)),
        Err(TransitionError::StaleLease { .. })
    ));
    assert!(apply(in_status(Status::Pending), snooze(7, 0), t(3)).is_err());
}

#[test]
fn a_replace_changes_a_pending_job_and_a_freed_key_leaves_the_rest() {
    let replace = || Event::Replace {
        payload: b"v2".to_vec(),
        metadata: [("edit".to_string(), "2".to_string())].into(),
        delay: Duration::from_secs(5),
    };
    let job = apply(new_job(3), replace(), t(10)).expect("replace");
    assert_eq!((job.payload.as_slice(), job.run_at), (&b"v2"[..], t(15)));
    assert_eq!(job.metadata.get("edit").map(String::as_str), Some("2"));
    assert_eq!(
        (job.id, job.status, job.attempts),
        (JobId(1), Status::Pending, 0)
    );
    for status in [Status::Running, Status::Done, Status::Failed] {
        assert!(
            apply(in_status(status), replace(), t(10)).is_err(),
            "{status:?}"
        );
    }
    for status in [
        Status::Pending,
        Status::Running,
        Status::Done,
        Status::Failed,
    ] {
        let before = in_status(status);
        let freed = apply(before.clone(), Event::FreeKey, t(10)).expect("free key");
        assert_eq!(
            freed,
            Job {
                key: None,
                ..before
            }
        );
    }
}

#[test]
fn a_snooze_past_max_snoozes_is_a_failed_attempt() {
    let snooze = |lease: u64| Event::Snooze {
        lease_id: LeaseId(lease),
        reason: "429".into(),
        delay: Duration::from_secs(30),
    };
    let mut job = Job {
        max_snoozes: 2,
        ..new_job(2)
    };
    // Two snoozes are free.
    for lease in 1..=2 {
        job = take(job, lease, t(lease * 100)).expect("take");
        job = apply(job, snooze(lease), t(lease * 100)).expect("snooze");
        assert_eq!(
            (job.status, job.attempts, job.snoozes),
            (Status::Pending, 0, lease as u32)
        );
    }
    // The third counts: a failed attempt, due after the snooze.
    job = take(job, 3, t(300)).expect("take");
    job = apply(job, snooze(3), t(300)).expect("snooze");
    assert_eq!(
        (job.status, job.attempts, job.snoozes),
        (Status::Pending, 1, 2)
    );
    assert_eq!(job.run_at, t(330));
    let error = "snoozed 2 times, its max_snoozes: 429";
    assert_eq!(job.last_error.as_deref(), Some(error));
    let last = job.history.last().unwrap();
    assert_eq!(
        (last.outcome, last.error.as_deref()),
        (Some(Outcome::Failed), Some(error))
    );
    // On the last attempt, FAILED: no job snoozes forever.
    job = take(job, 4, t(400)).expect("take");
    job = apply(job, snooze(4), t(400)).expect("snooze");
    assert_eq!((job.status, job.attempts), (Status::Failed, 2));
    assert_eq!(job.finished_at, Some(t(400)));
    // A retry starts both counts again.
    job = apply(job, Event::Retry, t(500)).expect("retry");
    assert_eq!(
        (job.status, job.attempts, job.snoozes),
        (Status::Pending, 0, 0)
    );
    // None allowed: the first snooze is a failure.
    let job = Job {
        max_snoozes: 0,
        ..new_job(3)
    };
    let job = take(job, 1, t(1)).expect("take");
    let job = apply(job, snooze(1), t(1)).expect("snooze");
    assert_eq!((job.attempts, job.snoozes), (1, 0));
    assert!(OVER_SNOOZED_PREFIX_MAX >= over_snoozed(u32::MAX, "").len());
}

#[test]
fn fail_with_attempts_left_backs_off_and_comes_back() {
    let job = apply(in_status(Status::Running), fail(7), t(3)).expect("fail");
    assert_eq!((job.status, job.attempts), (Status::Pending, 1));
    assert_eq!(job.last_error.as_deref(), Some("smtp down"));
    assert_eq!(
        job.run_at,
        t(3) + Duration::from_secs(1),
        "first backoff is the base (jitter 1.0)"
    );
    assert!(
        take(job.clone(), 8, t(3)).is_err(),
        "not due during the backoff"
    );
    assert_eq!(
        take(job, 8, t(4)).expect("due again").status,
        Status::Running
    );
}

#[test]
fn a_retry_delay_overrides_the_backoff() {
    let job = apply(
        in_status(Status::Running),
        fail_with(7, Some(Duration::ZERO), false),
        t(3),
    )
    .expect("fail");
    assert_eq!(job.run_at, t(3));
}

#[test]
fn the_third_fail_of_three_is_final() {
    let mut job = new_job(3);
    for attempt in 1..=3u64 {
        job = take(job, attempt, t(attempt * 100)).expect("take");
        job = apply(job, fail(attempt), t(attempt * 100 + 1)).expect("fail");
    }
    assert_eq!((job.status, job.attempts), (Status::Failed, 3));
    assert_eq!(job.last_error.as_deref(), Some("smtp down"));
    assert!(job.finished_at.is_some());
    assert!(
        take(job, 9, t(10_000)).is_err(),
        "a dead letter is never delivered"
    );
}

#[test]
fn a_fatal_failure_is_final_at_once() {
    let job = apply(in_status(Status::Running), fail_with(7, None, true), t(3)).expect("fail");
    assert_eq!((job.status, job.attempts), (Status::Failed, 1));
}

#[test]
fn the_seed_crash_example_an_expired_lease_comes_back_with_one_more_attempt() {
    // job 4711: running, attempts 0, taken at t; the worker dies; the lease runs out.
    let running = take(new_job(3), 7, t(0)).expect("take");
    let reclaimed = apply(
        running,
        Event::Reclaim {
            lease_id: LeaseId(7),
            outcome: Outcome::LeaseExpired,
        },
        t(31),
    )
    .expect("reclaim");
    assert_eq!((reclaimed.status, reclaimed.attempts), (Status::Pending, 1));
    assert!(reclaimed.lease.is_none(), "taken_at: t -> none");
    assert_eq!(
        reclaimed.run_at,
        t(31),
        "due again at once, behind the jobs already due"
    );
    assert_eq!(reclaimed.last_error.as_deref(), Some("lease expired"));
    assert_eq!(reclaimed.history[0].outcome, Some(Outcome::LeaseExpired));
    let again = take(reclaimed, 8, t(31)).expect("delivered a second time, as promised");
    assert_eq!(again.history.len(), 2);
}

#[test]
fn reclaim_on_the_last_attempt_is_final() {
    let running = take(new_job(1), 7, t(0)).expect("take");
    let job = apply(
        running,
        Event::Reclaim {
            lease_id: LeaseId(7),
            outcome: Outcome::WorkerDisconnected,
        },
        t(1),
    )
    .expect("reclaim");
    assert_eq!((job.status, job.attempts), (Status::Failed, 1));
    assert_eq!(job.last_error.as_deref(), Some("worker disconnected"));
}

#[test]
fn a_stale_lease_cannot_complete_a_job_leased_again() {
    let running = take(new_job(3), 7, t(0)).expect("take");
    let reclaimed = apply(
        running,
        Event::Reclaim {
            lease_id: LeaseId(7),
            outcome: Outcome::LeaseExpired,
        },
        t(31),
    )
    .expect("reclaim");
    let again = take(reclaimed, 8, t(32)).expect("take");
    for event in [
        Event::Ack {
            lease_id: LeaseId(7),
            result: None,
        },
        fail(7),
        Event::Extend {
            lease_id: LeaseId(7),
            extend_by: None,
            progress: None,
        },
    ] {
        assert!(matches!(
            apply(again.clone(), event, t(33)),
            Err(TransitionError::StaleLease { .. })
        ));
    }
    assert_eq!(
        apply(
            again,
            Event::Ack {
                lease_id: LeaseId(8),
                result: None
            },
            t(33)
        )
        .expect("holder acks")
        .status,
        Status::Done
    );
}

#[test]
fn extend_moves_the_deadline_but_not_past_expiry() {
    let running = take(new_job(3), 7, t(0)).expect("take");
    let extended = apply(
        running.clone(),
        Event::Extend {
            lease_id: LeaseId(7),
            extend_by: Some(Duration::from_secs(5)),
            progress: None,
        },
        t(20),
    )
    .expect("extend");
    assert_eq!(extended.lease_expires_at(), Some(t(25)));
    let expired = apply(
        running,
        Event::Extend {
            lease_id: LeaseId(7),
            extend_by: None,
            progress: None,
        },
        t(30),
    );
    assert!(matches!(expired, Err(TransitionError::Expired { .. })));
}

#[test]
fn retry_resets_attempts() {
    let job = apply(in_status(Status::Failed), Event::Retry, t(50)).expect("retry");
    assert_eq!(
        (job.status, job.attempts, job.run_at, job.finished_at),
        (Status::Pending, 0, t(50), None)
    );
}

#[test]
fn attempts_never_exceed_max_attempts() {
    // Every way an attempt can end, repeated past the limit.
    for outcome in [
        Outcome::LeaseExpired,
        Outcome::WorkerDisconnected,
        Outcome::Revoked,
    ] {
        let mut job = new_job(2);
        let mut lease = 0;
        while job.status != Status::Failed {
            lease += 1;
            job = take(job, lease, t(lease * 100)).expect("take");
            job = apply(
                job,
                Event::Reclaim {
                    lease_id: LeaseId(lease),
                    outcome,
                },
                t(lease * 100 + 31),
            )
            .expect("reclaim");
            assert!(job.attempts <= job.max_attempts);
        }
        assert_eq!(job.attempts, 2);
    }
}

#[test]
fn backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
    let b = Backoff {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(10),
    };
    assert_eq!(b.delay(1, 1.0), Duration::from_secs(1));
    assert_eq!(b.delay(2, 1.0), Duration::from_secs(2));
    assert_eq!(b.delay(3, 1.0), Duration::from_secs(4));
    assert_eq!(b.delay(10, 1.0), Duration::from_secs(10));
    assert_eq!(b.delay(1000, 1.0), Duration::from_secs(10));
    assert_eq!(b.delay(3, 0.0), Duration::from_secs(2));
}

#[test]
fn history_keeps_the_most_recent_attempts() {
    let mut job = new_job(MAX_HISTORY as u32 + 10);
    for lease in 1..=(MAX_HISTORY as u64 + 5) {
        job = take(job, lease, t(lease * 100)).expect("take");
        job = apply(
            job,
            fail_with(lease, Some(Duration::ZERO), false),
            t(lease * 100 + 1),
        )
        .expect("fail");
    }
    assert_eq!(job.history.len(), MAX_HISTORY);
    assert_eq!(
        job.history.last().map(|a| a.lease_id),
        Some(LeaseId(MAX_HISTORY as u64 + 5))
    );
    assert_eq!(
        job.history[0].lease_id,
        LeaseId(6),
        "the oldest ones were dropped"
    );
}

#[test]
fn a_returned_take_costs_no_attempt_and_keeps_its_place() {
    let job = new_job(3);
    let run_at = job.run_at;
    let taken = take(job.clone(), 7, t(5)).expect("take");
    let back = apply(
        taken,
        Event::Return {
            lease_id: LeaseId(7),
            if_expired: false,
        },
        t(6),
    )
    .expect("return");
    assert_eq!(back.status, Status::Pending);
    assert_eq!(back.attempts, 0);
    assert_eq!(back.run_at, run_at, "it keeps its place in the queue");
    assert!(back.history.is_empty(), "the undone take leaves no attempt");
    assert!(back.lease.is_none());
}

#[test]
fn restart_grace_extends_a_lapsed_lease_from_startup_but_never_shortens() {
    // Lease 7 taken at t(1) for 30 s (see `take`): expires at t(31).
    let running = in_status(Status::Running);
    let expires = running.lease_expires_at().expect("leased");
    let graced = apply(
        running.clone(),
        Event::RestartGrace {
            lease_id: LeaseId(7),
            grace: Some(Duration::from_secs(30)),
        },
        t(100),
    )
    .expect("grace");
    assert_eq!(graced.lease_expires_at(), Some(t(130)));
    let early = apply(
        running,
        Event::RestartGrace {
            lease_id: LeaseId(7),
            grace: Some(Duration::from_secs(1)),
        },
        t(2),
    )
    .expect("grace");
    assert_eq!(early.lease_expires_at(), Some(expires), "never shortened");
}

#[test]
fn cancel_of_a_pending_job_dead_letters_it_with_the_reason() {
    let job = apply(in_status(Status::Pending), cancel("duplicate order"), t(5)).expect("cancel");
    assert_eq!(job.status, Status::Failed);
    assert_eq!(
        job.last_error.as_deref(),
        Some("cancelled: duplicate order")
    );
    assert_eq!(job.finished_at, Some(t(5)));
    assert_eq!(job.attempts, 0, "no run, no attempt");
    assert!(job.history.is_empty());
    let back = apply(job, Event::Retry, t(6)).expect("retry brings it back");
    assert_eq!(back.status, Status::Pending);
}

#[test]
fn cancel_of_a_running_job_revokes_its_attempt_and_fences_its_lease() {
    let job = apply(in_status(Status::Running), cancel("stop"), t(5)).expect("cancel");
    assert_eq!(job.status, Status::Failed);
    assert!(job.lease.is_none());
    assert_eq!(job.attempts, 1);
    let attempt = job.history.last().expect("the attempt");
    assert_eq!(attempt.outcome, Some(Outcome::Revoked));
    assert_eq!(attempt.ended_at, Some(t(5)));
    assert_eq!(attempt.error.as_deref(), Some("cancelled: stop"));
    // The holder's late ack, fail and heartbeat are stale (ABORTED).
    for late in [
        Event::Ack {
            lease_id: LeaseId(7),
            result: None,
        },
        fail(7),
        Event::Extend {
            lease_id: LeaseId(7),
            extend_by: None,
            progress: None,
        },
    ] {
        let err = apply(job.clone(), late, t(6)).expect_err("late");
        assert!(matches!(err, TransitionError::StaleLease { .. }), "{err}");
    }
    // On its last attempt it still never exceeds max_attempts.
    let mut last = take(new_job(1), 9, t(1)).expect("take");
    last = apply(last, cancel(""), t(2)).expect("cancel");
    assert_eq!((last.attempts, last.max_attempts), (1, 1));
    assert_eq!(last.last_error.as_deref(), Some("cancelled"), "no reason");
}

#[test]
fn only_a_running_job_cannot_be_deleted() {
    for status in Status::ALL {
        let got = deletable(&in_status(status));
        if status == Status::Running {
            let err = got.expect_err("running");
            assert!(err.to_string().contains("cancel it first"), "{err}");
        } else {
            assert_eq!(got, Ok(()), "{status}");
        }
    }
}

#[test]
fn a_job_keeps_its_priority_through_every_transition() {
    // Rule 5 orders due jobs by priority first: a retry, a reclaim or a
    // backoff changes when a job is due, never its priority.
    let mut job = new_job(2);
    job.priority = -42;
    let taken = take(job, 7, t(1)).expect("take");
    let failed = apply(taken, fail(7), t(2)).expect("fail");
    assert_eq!(failed.priority, -42);
    let taken = take(failed, 8, t(100)).expect("take again");
    let reclaimed = apply(
        taken,
        Event::Reclaim {
            lease_id: LeaseId(8),
            outcome: Outcome::LeaseExpired,
        },
        t(200),
    )
    .expect("reclaim");
    assert_eq!(reclaimed.status, Status::Failed);
    let retried = apply(reclaimed, Event::Retry, t(300)).expect("retry");
    assert_eq!((retried.status, retried.priority), (Status::Pending, -42));
}

/// A heartbeat's report becomes the job's latest progress, stamped when it
/// was applied; one without a report keeps the last; a refused heartbeat
/// (a stale lease) keeps nothing; later events leave it as it was.
#[test]
fn a_heartbeat_keeps_its_progress_report_as_the_jobs_latest() {
    let beat = |job: Job, lease: u64, progress: Option<(u32, &str)>, now| {
        apply(
            job,
            Event::Extend {
                lease_id: LeaseId(lease),
                extend_by: None,
                progress: progress.map(|(percent, message)| crate::job::Report {
                    percent,
                    message: message.into(),
                }),
            },
            now,
        )
    };
    let job = take(new_job(3), 7, t(1)).unwrap();
    let job = beat(job, 7, Some((40, "row 4,000")), t(2)).unwrap();
    let expected = Some(crate::job::Progress {
        percent: 40,
        message: "row 4,000".into(),
        reported_at: t(2),
        lease_id: LeaseId(7),
    });
    assert_eq!(job.progress, expected);
    let job = beat(job, 7, None, t(3)).unwrap();
    assert_eq!(job.progress, expected);
    assert!(beat(job.clone(), 6, Some((90, "stale")), t(4)).is_err());
    let done = apply(
        job,
        Event::Ack {
            lease_id: LeaseId(7),
            result: None,
        },
        t(5),
    )
    .unwrap();
    assert_eq!(done.progress, expected);
}
