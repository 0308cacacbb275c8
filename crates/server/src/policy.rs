//! A queue's policy: how much of its work runs at once (docs/src/shaping.md).
//!
//! Limits are enforced where jobs are handed out: a take never leases a
//! job that a limit forbids, so a held job stays PENDING, spends no
//! attempt and keeps its place. A slot is freed by the job's change of
//! state as the store applies it (ack, fail, reclaim, cancel), never by an
//! RPC handler that a deadline could cut short.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The most a policy's limits may be.
pub const MOST_RUNNING: u32 = 100_000;

/// The most due jobs a Stats call counts per queue to report the held
/// ones: beyond it, the counts say "at least this many".
pub const HELD_COUNT_MOST: u64 = 100_000;

/// The most tokens a rate limit may give per period, or hold.
pub const MOST_TOKENS: u32 = 1_000_000;

/// The shortest and the longest period of a rate limit.
pub const PERIODS: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(24 * 3600));

/// A token bucket: `limit` takes per `per`, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    /// Tokens per period (at least 1).
    pub limit: u32,
    /// The period.
    pub per: Duration,
    /// The bucket's size (0: `limit`).
    pub burst: u32,
}

impl Rate {
    /// How many tokens the bucket holds when full.
    pub fn capacity(&self) -> f64 {
        f64::from(if self.burst > 0 {
            self.burst
        } else {
            self.limit
        })
    }

    /// Tokens that come back per second.
    pub fn per_second(&self) -> f64 {
        f64::from(self.limit) / self.per.as_secs_f64().max(1e-9)
    }
}

/// A rate limit's bucket: the tokens it held at `at`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// Tokens at `at`, at most the rate's capacity.
    pub tokens: f64,
    /// When `tokens` was counted.
    pub at: SystemTime,
}

impl Bucket {
    /// A full bucket at `now`.
    pub fn full(rate: &Rate, now: SystemTime) -> Bucket {
        Bucket {
            tokens: rate.capacity(),
            at: now,
        }
    }

    /// The tokens at `now` (a clock that went back adds none).
    pub fn tokens(&self, rate: &Rate, now: SystemTime) -> f64 {
        let elapsed = now.duration_since(self.at).unwrap_or_default();
        (self.tokens + elapsed.as_secs_f64() * rate.per_second()).min(rate.capacity())
    }

    /// Spends `n` tokens at `now` (the caller checked there were).
    pub fn spend(&mut self, rate: &Rate, n: f64, now: SystemTime) {
        let tokens = self.tokens(rate, now);
        self.tokens = (tokens - n).max(0.0);
        self.at = self.at.max(now);
    }

    /// When the bucket next holds a whole token (`now` if it does).
    pub fn next_token(&self, rate: &Rate, now: SystemTime) -> SystemTime {
        let missing = 1.0 - self.tokens(rate, now);
        if missing <= 0.0 {
            return now;
        }
        now + Duration::from_secs_f64(missing / rate.per_second())
    }
}

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
    /// Takes of the queue's jobs per period, over every server.
    pub rate: Option<Rate>,
    /// Takes of one group's jobs per period, over every server.
    pub group_rate: Option<Rate>,
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
        if let Some(rate) = &self.rate {
            rate.check("rate")?;
        }
        if let Some(rate) = &self.group_rate {
            rate.check("group_rate")?;
        }
        Ok(())
    }

    /// Whether `running` jobs of the queue leave room for one more.
    pub fn room(&self, running: u64) -> bool {
        self.max_running == 0 || running < u64::from(self.max_running)
    }
}

impl Rate {
    /// Checks the ranges; `field` names the rate in the message.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a limit of 0 or over
    /// [`MOST_TOKENS`], a period outside [`PERIODS`], a burst over
    /// [`MOST_TOKENS`].
    pub fn check(&self, field: &str) -> Result<()> {
        let (shortest, longest) = PERIODS;
        let bad = |what: String| Err(Error::InvalidArgument(format!("{field}: {what}")));
        if self.limit == 0 || self.limit > MOST_TOKENS {
            return bad(format!(
                "limit {} is out of range: 1..={MOST_TOKENS}",
                self.limit
            ));
        }
        if self.per < shortest || self.per > longest {
            return bad(format!(
                "per {:?} is out of range: {shortest:?}..={longest:?}",
                self.per
            ));
        }
        if self.burst > MOST_TOKENS {
            return bad(format!(
                "burst {} is out of range: 0..={MOST_TOKENS} (0: the limit)",
                self.burst
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let rate = Rate {
            limit: 10,
            per: Duration::from_secs(1),
            burst: 2,
        };
        assert!(rate.check("rate").is_ok());
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let mut b = Bucket::full(&rate, t0);
        assert_eq!(
            b.tokens(&rate, t0 + Duration::from_secs(60)),
            2.0,
            "the burst caps it"
        );
        b.spend(&rate, 2.0, t0);
        assert_eq!(b.next_token(&rate, t0), t0 + Duration::from_millis(100));
        assert!((b.tokens(&rate, t0 + Duration::from_millis(50)) - 0.5).abs() < 1e-9);
        assert_eq!(
            b.tokens(&rate, t0 - Duration::from_secs(5)),
            0.0,
            "a clock gone back"
        );
        for bad in [
            Rate { limit: 0, ..rate },
            Rate {
                per: Duration::ZERO,
                ..rate
            },
            Rate {
                burst: MOST_TOKENS + 1,
                ..rate
            },
        ] {
            let err = bad.check("rate").unwrap_err();
            assert!(err.to_string().starts_with("rate: "), "{err}");
        }
    }

    #[test]
    fn limits_are_bounded_and_zero_means_none() {
        assert!(QueuePolicy::default().is_empty());
        assert!(QueuePolicy::default().room(u64::MAX));
        let p = QueuePolicy {
            max_running: 2,
            ..QueuePolicy::default()
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
