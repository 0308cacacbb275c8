//! Validation of the operator RPCs (CancelJob, PauseQueue, ResumeQueue,
//! SetQueuePolicy, DeleteJob, PurgeJobs): same rules as the rest of [`super`], kept apart so
//! neither file grows past one concern.

use std::time::SystemTime;

use jobq::pb;

use super::{invalid, job_id, kept_text, name, status_filter};
use crate::{
    config::Config,
    error::{Error, Result},
    job::{JobId, Status},
    machine,
    policy::{QueuePolicy, Rate},
    store::rules::RUNNING_PURGE,
};

/// 0001-01-01T00:00:00Z, the first second google/protobuf/timestamp.proto
/// allows.
const TIMESTAMP_MIN_SECONDS: i64 = -62_135_596_800;
/// 9999-12-31T23:59:59Z, the last.
const TIMESTAMP_MAX_SECONDS: i64 = 253_402_300_799;

/// A checked PurgeJobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purge {
    /// The queue.
    pub queue: String,
    /// DONE, FAILED, `None` for both, or PENDING.
    pub status: Option<Status>,
    /// Jobs finished before this go (`now` for PENDING, where it plays no
    /// part).
    pub finished_before: SystemTime,
}

/// A CancelJob: which job, and why. The reason follows the rule of a
/// Fail's error ([`kept_text`]): the job keeps "cancelled: <reason>", and
/// that whole text fits `--max-error-bytes` (the reason is cut to the room
/// the prefix leaves; a NUL becomes U+FFFD).
pub fn cancel(req: pb::CancelJobRequest, config: &Config) -> Result<(JobId, String)> {
    let id = job_id("id", &req.id)?;
    let room = config
        .max_error_bytes
        .saturating_sub(machine::CANCELLED_PREFIX.len());
    Ok((id, kept_text(req.reason, room)))
}

/// The queue of a PauseQueue or ResumeQueue.
pub fn queue(value: String) -> Result<String> {
    name("queue", &value)?;
    Ok(value)
}

/// Whether `queue` may be paused when `paused` queues are and it is not
/// one of them (`already`): at most `most` (`--max-paused-queues`). A
/// queue already paused always may (PauseQueue is idempotent).
pub fn pause_room(paused: usize, already: bool, most: usize) -> Result<()> {
    if !already && paused >= most {
        return Err(Error::ResourceExhausted(format!(
            "there are {paused} paused queues; the limit is {most} (--max-paused-queues): resume one first"
        )));
    }
    Ok(())
}

/// Whether `queue` may get a policy when `policies` queues have one and
/// it has none (`already` false): at most `most` (`--max-queue-policies`).
/// Changing or clearing a policy always may.
pub fn policy_room(policies: usize, already: bool, most: usize) -> Result<()> {
    if !already && policies >= most {
        return Err(Error::ResourceExhausted(format!(
            "there are {policies} queues with a policy; the limit is {most} (--max-queue-policies): clear one first"
        )));
    }
    Ok(())
}

/// A SetQueuePolicy request: the queue and its policy, range-checked.
pub fn set_policy(req: pb::SetQueuePolicyRequest) -> Result<(String, QueuePolicy)> {
    name("queue", &req.queue)?;
    let p = req.policy.unwrap_or_default();
    let rate = rate_limit("rate", p.rate)?;
    let group_rate = rate_limit("group_rate", p.group_rate)?;
    let policy = QueuePolicy {
        max_running: p.max_running,
        group_max_running: p.group_max_running,
        rate,
        group_rate,
    };
    policy.check()?;
    Ok((req.queue, policy))
}

/// A policy's rate limit: none when unset or its limit is 0 (the ranges
/// are [`QueuePolicy::check`]'s).
fn rate_limit(field: &str, rate: Option<pb::RateLimit>) -> Result<Option<Rate>> {
    let Some(r) = rate.filter(|r| r.limit > 0) else {
        return Ok(None);
    };
    let per = r
        .per
        .ok_or_else(|| invalid(format!("{field}: per is required with a limit")))?;
    let per = std::time::Duration::try_from(per)
        .map_err(|_| invalid(format!("{field}: per must not be negative")))?;
    Ok(Some(Rate {
        limit: r.limit,
        per,
        burst: r.burst,
    }))
}

/// A DeleteJob's job id.
pub fn delete(req: pb::DeleteJobRequest) -> Result<JobId> {
    job_id("id", &req.id)
}

/// A PurgeJobs: a named queue, a finished status (or both) and a time
/// (`now` when unset), or PENDING without a time. Never RUNNING.
pub fn purge(req: pb::PurgeJobsRequest, now: SystemTime) -> Result<Purge> {
    name("queue", &req.queue)?;
    let status = status_filter(req.status)?;
    match status {
        Some(Status::Running) => return Err(invalid(RUNNING_PURGE)),
        Some(Status::Pending) if req.finished_before.is_some() => {
            return Err(invalid(
                "finished_before applies to DONE and FAILED jobs: a PENDING job has not finished (a purge of PENDING jobs deletes every one the queue holds when it begins; leave finished_before unset)",
            ))
        }
        _ => {}
    }
    let finished_before = match req.finished_before {
        None => now,
        // google/protobuf/timestamp.proto: nanos in 0..=999_999_999.
        Some(t) if !(0..=999_999_999).contains(&t.nanos) => {
            return Err(invalid(format!(
                "finished_before.nanos {} is out of range 0..=999999999",
                t.nanos
            )))
        }
        // timestamp.proto's range; a store must be able to hold the time
        // (PostgreSQL's encoding overflows far outside it).
        Some(t) if !(TIMESTAMP_MIN_SECONDS..=TIMESTAMP_MAX_SECONDS).contains(&t.seconds) => {
            return Err(invalid(format!(
                "finished_before.seconds {} is outside 0001-01-01T00:00:00Z..=9999-12-31T23:59:59Z",
                t.seconds
            )))
        }
        Some(t) => SystemTime::try_from(t)
            .map_err(|_| invalid("finished_before is not a valid timestamp"))?,
    };
    Ok(Purge {
        queue: req.queue,
        status,
        finished_before,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::with_data("unused")
    }

    #[test]
    fn cancel_needs_a_job_id_and_cuts_a_long_reason() {
        let c = config();
        let ok = pb::CancelJobRequest {
            id: "7".into(),
            reason: "duplicate".into(),
        };
        assert_eq!(cancel(ok, &c).unwrap(), (JobId(7), "duplicate".into()));
        for id in ["", "x"] {
            let req = pb::CancelJobRequest {
                id: id.into(),
                reason: String::new(),
            };
            assert!(cancel(req, &c).is_err(), "{id:?}");
        }
        // As a Fail's error: cut, never refused; the kept text
        // ("cancelled: " and the reason) fits --max-error-bytes.
        for reason in ["r".repeat(c.max_error_bytes + 1), "é".repeat(5000)] {
            let req = pb::CancelJobRequest {
                id: "7".into(),
                reason: reason.clone(),
            };
            let (_, cut) = cancel(req, &c).expect("a long reason is cut");
            let kept = machine::cancelled(&cut);
            assert_eq!(kept.len(), c.max_error_bytes, "{kept}");
            assert!(kept.ends_with('…'), "{kept}");
            assert!(reason.starts_with(cut.trim_end_matches('…')));
        }
    }

    #[test]
    fn purge_takes_a_queue_and_a_finished_or_pending_status() {
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let req = |queue: &str, status: pb::JobStatus, at: Option<prost_types::Timestamp>| {
            pb::PurgeJobsRequest {
                queue: queue.into(),
                status: status as i32,
                finished_before: at,
            }
        };
        let all = purge(req("q", pb::JobStatus::Unspecified, None), now).unwrap();
        assert_eq!((all.status, all.finished_before), (None, now));
        let done = purge(req("q", pb::JobStatus::Done, Some(now.into())), now).unwrap();
        assert_eq!(done.status, Some(Status::Done));
        let pending = purge(req("q", pb::JobStatus::Pending, None), now).unwrap();
        assert_eq!(pending.status, Some(Status::Pending));
        let running = purge(req("q", pb::JobStatus::Running, None), now).unwrap_err();
        assert_eq!(running.code(), tonic::Code::InvalidArgument);
        assert!(running.to_string().contains("RUNNING"), "{running}");
        for bad in [
            req("", pb::JobStatus::Done, None),
            req("", pb::JobStatus::Pending, None),
            req("q", pb::JobStatus::Pending, Some(now.into())),
            req("q", pb::JobStatus::Running, None),
            req(
                "q",
                pb::JobStatus::Done,
                Some(prost_types::Timestamp {
                    seconds: 1,
                    nanos: -5,
                }),
            ),
            req(
                "q",
                pb::JobStatus::Done,
                Some(prost_types::Timestamp {
                    seconds: i64::MAX,
                    nanos: 0,
                }),
            ),
            req(
                "q",
                pb::JobStatus::Failed,
                Some(prost_types::Timestamp {
                    seconds: TIMESTAMP_MIN_SECONDS - 1,
                    nanos: 0,
                }),
            ),
        ] {
            assert!(purge(bad.clone(), now).is_err(), "{bad:?}");
        }
        let unknown = pb::PurgeJobsRequest {
            status: 99,
            ..req("q", pb::JobStatus::Done, None)
        };
        assert!(purge(unknown, now).is_err());
        for seconds in [TIMESTAMP_MIN_SECONDS, TIMESTAMP_MAX_SECONDS] {
            let at = prost_types::Timestamp { seconds, nanos: 0 };
            assert!(purge(req("q", pb::JobStatus::Done, Some(at)), now).is_ok());
        }
    }

    #[test]
    fn a_nul_in_a_cancel_reason_is_replaced_as_in_a_fail_error() {
        let req = |reason: &str| pb::CancelJobRequest {
            id: "7".into(),
            reason: reason.into(),
        };
        assert_eq!(
            cancel(req("wrong order"), &config()).unwrap().1,
            "wrong order"
        );
        assert_eq!(
            cancel(req("a\0b"), &config()).unwrap().1,
            "a\u{fffd}b",
            "the same text a Fail's error keeps"
        );
    }

    #[test]
    fn pausing_one_more_queue_than_the_limit_is_refused_unless_it_is_paused() {
        pause_room(2, false, 3).expect("room for a third");
        let err = pause_room(3, false, 3).expect_err("no room for a fourth");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.to_string().contains("--max-paused-queues"), "{err}");
        pause_room(3, true, 3).expect("pausing a paused queue is idempotent");
    }

    #[test]
    fn a_paused_queue_follows_the_name_rules() {
        assert_eq!(queue("emails".into()).unwrap(), "emails");
        assert!(queue(String::new()).is_err());
        assert!(queue("a b".into()).is_err());
    }
}
