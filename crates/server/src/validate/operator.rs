//! Validation of the operator RPCs (CancelJob, PauseQueue, ResumeQueue,
//! DeleteJob, PurgeJobs): same rules as the rest of [`super`], kept apart so
//! neither file grows past one concern.

use std::time::SystemTime;

use jobq::pb;

use super::{invalid, job_id, name, no_nul, status_filter};
use crate::{
    config::Config,
    error::Result,
    job::{JobId, Status},
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
    /// DONE, FAILED, or `None` for both.
    pub status: Option<Status>,
    /// Jobs finished before this go.
    pub finished_before: SystemTime,
}

/// A CancelJob: which job, and why. The reason is operator input, so an
/// over-long one, or one with a NUL character, is refused (not cut or
/// mended, as a handler's error is): the operator sees the rule and
/// nothing changes.
pub fn cancel(req: pb::CancelJobRequest, config: &Config) -> Result<(JobId, String)> {
    let id = job_id("id", &req.id)?;
    if req.reason.len() > config.max_error_bytes {
        return Err(invalid(format!(
            "reason is {} bytes long; the limit is {} (--max-error-bytes)",
            req.reason.len(),
            config.max_error_bytes
        )));
    }
    no_nul("reason", &req.reason)?;
    Ok((id, req.reason))
}

/// The queue of a PauseQueue or ResumeQueue.
pub fn queue(value: String) -> Result<String> {
    name("queue", &value)?;
    Ok(value)
}

/// A DeleteJob's job id.
pub fn delete(req: pb::DeleteJobRequest) -> Result<JobId> {
    job_id("id", &req.id)
}

/// A PurgeJobs: a named queue, a finished status (or both), and a time
/// (`now` when unset).
pub fn purge(req: pb::PurgeJobsRequest, now: SystemTime) -> Result<Purge> {
    name("queue", &req.queue)?;
    let status = status_filter(req.status)?;
    if let Some(s @ (Status::Pending | Status::Running)) = status {
        return Err(invalid(format!(
            "status {s} cannot be purged: only DONE and FAILED jobs (delete a PENDING job with DeleteJob)"
        )));
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
    fn cancel_needs_a_job_id_and_a_bounded_reason() {
        let c = config();
        let ok = pb::CancelJobRequest {
            id: "7".into(),
            reason: "duplicate".into(),
        };
        assert_eq!(cancel(ok, &c).unwrap(), (JobId(7), "duplicate".into()));
        for (id, reason) in [
            ("", String::new()),
            ("x", String::new()),
            ("7", "r".repeat(c.max_error_bytes + 1)),
        ] {
            let req = pb::CancelJobRequest {
                id: id.into(),
                reason,
            };
            assert!(cancel(req, &c).is_err(), "{id:?}");
        }
    }

    #[test]
    fn purge_takes_a_queue_and_a_finished_status() {
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
        for bad in [
            req("", pb::JobStatus::Done, None),
            req("q", pb::JobStatus::Pending, None),
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
    fn a_cancel_reason_with_a_nul_is_refused() {
        let req = |reason: &str| pb::CancelJobRequest {
            id: "7".into(),
            reason: reason.into(),
        };
        assert_eq!(
            cancel(req("wrong order"), &config()).unwrap().1,
            "wrong order"
        );
        let err = cancel(req("a\0b"), &config()).unwrap_err().to_string();
        assert!(err.contains("reason") && err.contains("NUL"), "{err}");
    }

    #[test]
    fn a_paused_queue_follows_the_name_rules() {
        assert_eq!(queue("emails".into()).unwrap(), "emails");
        assert!(queue(String::new()).is_err());
        assert!(queue("a b".into()).is_err());
    }
}
