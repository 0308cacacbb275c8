//! A queue's policy: how much of its work runs at once (docs/src/shaping.md).
//!
//! Limits are enforced where jobs are handed out: a take never leases a
//! job that a limit forbids, so a held job stays PENDING, spends no
//! attempt and keeps its place. A slot is freed by the job's change of
//! state as the store applies it (ack, fail, reclaim, cancel), never by an
//! RPC handler that a deadline could cut short.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The most a policy's limits may be.
pub const MOST_RUNNING: u32 = 100_000;

/// How a queue's work is shaped. Zero means no limit; all zero is no
/// policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePolicy {
    /// RUNNING jobs of the queue at once, over every server.
    pub max_running: u32,
    /// RUNNING jobs of one group at once. 1 makes each group a sequence:
    /// its jobs run one at a time, in enqueue order (id order), and a job
    /// that waits out a backoff or a delay holds the ones after it.
    pub group_max_running: u32,
}

impl QueuePolicy {
    /// Whether the policy limits nothing (and so is no policy).
    pub fn is_empty(&self) -> bool {
        *self == QueuePolicy::default()
    }

    /// Checks the ranges.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a limit over [`MOST_RUNNING`].
    pub fn check(&self) -> Result<()> {
        for (field, value) in [
            ("max_running", self.max_running),
            ("group_max_running", self.group_max_running),
        ] {
            if value > MOST_RUNNING {
                return Err(Error::InvalidArgument(format!(
                    "{field} {value} is out of range: 0..={MOST_RUNNING} (0: no limit)"
                )));
            }
        }
        Ok(())
    }

    /// Whether `running` jobs of the queue leave room for one more.
    pub fn room(&self, running: u64) -> bool {
        self.max_running == 0 || running < u64::from(self.max_running)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_bounded_and_zero_means_none() {
        assert!(QueuePolicy::default().is_empty());
        assert!(QueuePolicy::default().room(u64::MAX));
        let p = QueuePolicy {
            max_running: 2,
            group_max_running: 0,
        };
        assert!(p.room(1) && !p.room(2));
        assert!(p.check().is_ok());
        let over = QueuePolicy {
            group_max_running: MOST_RUNNING + 1,
            ..p
        };
        let err = over.check().unwrap_err();
        assert!(err.to_string().contains("group_max_running"), "{err}");
    }
}
