//! Validation of the operator RPCs (CancelJob, PauseQueue, ResumeQueue,
//! DeleteJob, PurgeJobs): same rules as the rest of [`super`], kept apart so
//! neither file grows past one concern.

use jobq::pb;

use super::{invalid, job_id, name};
use crate::{config::Config, error::Result, job::JobId};

/// A CancelJob: which job, and why. The reason is operator input, so an
/// over-long one is refused (not cut, as a handler's error is): the
/// operator sees the limit and nothing changes.
pub fn cancel(req: pb::CancelJobRequest, config: &Config) -> Result<(JobId, String)> {
    let id = job_id("id", &req.id)?;
    if req.reason.len() > config.max_error_bytes {
        return Err(invalid(format!(
            "reason is {} bytes long; the limit is {} (--max-error-bytes)",
            req.reason.len(),
            config.max_error_bytes
        )));
    }
    Ok((id, req.reason))
}

/// The queue of a PauseQueue or ResumeQueue.
pub fn queue(value: String) -> Result<String> {
    name("queue", &value)?;
    Ok(value)
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
    fn a_paused_queue_follows_the_name_rules() {
        assert_eq!(queue("emails".into()).unwrap(), "emails");
        assert!(queue(String::new()).is_err());
        assert!(queue("a b".into()).is_err());
    }
}
