//! Jittered exponential backoff for reconnects and for retrying an ack or
//! fail while the server is unreachable.

use std::time::Duration;

/// First reconnect delay (before jitter).
pub(crate) const BASE: Duration = Duration::from_millis(100);
/// Longest reconnect delay (before jitter).
pub(crate) const MAX: Duration = Duration::from_secs(5);

/// Exponential backoff with "equal jitter": attempt `n` waits between half
/// and all of `min(max, base * 2^n)`. The half that is fixed keeps a
/// restarting server from being hammered; the random half spreads a fleet of
/// workers that all lost the same server at once.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(BASE, MAX)
    }
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            attempt: 0,
        }
    }

    /// The next delay, drawing the jitter from the thread RNG.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = delay_for(self.base, self.max, self.attempt, rand::random::<f64>());
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    /// Back to the first delay; call once a connection proved healthy.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// The delay for `attempt` (0-based) with `jitter` in `[0, 1)`. Pure, so the
/// schedule is testable without an RNG.
pub(crate) fn delay_for(base: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let ceiling = base.saturating_mul(1u32 << attempt.min(31)).min(max);
    let half = ceiling / 2;
    half + half.mul_f64(jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn first_delay_is_half_to_full_base() {
        assert_eq!(delay_for(BASE, MAX, 0, 0.0), 50 * MS);
        assert_eq!(delay_for(BASE, MAX, 0, 1.0), 100 * MS);
        assert_eq!(delay_for(BASE, MAX, 0, 0.5), 75 * MS);
    }

    #[test]
    fn doubles_then_caps() {
        let ceilings: Vec<_> = (0..10).map(|n| delay_for(BASE, MAX, n, 1.0)).collect();
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000].map(|ms| ms * MS)
        );
    }

    #[test]
    fn huge_attempts_do_not_overflow() {
        assert_eq!(delay_for(BASE, MAX, u32::MAX, 1.0), MAX);
        assert_eq!(delay_for(BASE, MAX, u32::MAX, 0.0), MAX / 2);
    }

    #[test]
    fn out_of_range_jitter_is_clamped() {
        assert_eq!(delay_for(BASE, MAX, 0, 7.0), 100 * MS);
        assert_eq!(delay_for(BASE, MAX, 0, -1.0), 50 * MS);
    }

    #[test]
    fn next_stays_in_range_and_reset_restarts() {
        let mut backoff = Backoff::default();
        for n in 0..8 {
            let ceiling = delay_for(BASE, MAX, n, 1.0);
            let d = backoff.next_delay();
            assert!(d >= ceiling / 2 && d <= ceiling, "attempt {n}: {d:?}");
        }
        backoff.reset();
        assert!(backoff.next_delay() <= BASE);
    }
}
