//! The database's clock, read without a round trip.
//!
//! Most decisions read the database's clock inside the statement that
//! makes them (`now()`: leases, `run_at`, enqueue times, orphans). A few
//! are made in this process before any statement runs: which schedule
//! tick is due and when the scheduler wakes for the next, a schedule's
//! `created_at`, the retention purge's cutoff, the default cutoff of an
//! operator's purge. Reading the server's own wall clock there lets one
//! server whose clock runs ahead enqueue every tick early, date schedules
//! into the future, and purge jobs younger than the retention.
//!
//! So the server keeps a sample of the database's clock: every heartbeat
//! reads `clock_timestamp()` (it writes it into `jobq_servers` anyway) and
//! records it with the monotonic instant at which the reply had arrived.
//! The database's time now is at least the sample plus the monotonic time
//! elapsed since that instant: the sample was read before the reply
//! arrived, so [`DbClock::now`] is never ahead of the database's clock
//! (up to the rate difference of the two clocks over one heartbeat
//! interval, microseconds), and behind it by at most the heartbeat's round
//! trip. Never ahead is what the decisions need: a tick is due, or a job
//! old enough to purge, only once it is so by the database's clock. The
//! monotonic clock makes it immune to steps of the local wall clock
//! between heartbeats.

use std::{
    sync::Mutex,
    time::{Instant, SystemTime},
};

/// The latest sample of the database's clock.
#[derive(Debug, Default)]
pub struct DbClock {
    sample: Mutex<Option<(SystemTime, Instant)>>,
}

impl DbClock {
    /// Records that the database's clock read `at` before `returned` (the
    /// instant the statement that read it had returned).
    pub fn observed(&self, at: SystemTime, returned: Instant) {
        *self.sample.lock().unwrap_or_else(|p| p.into_inner()) = Some((at, returned));
    }

    /// The database's time now, never ahead of it; `None` before the first
    /// sample.
    pub fn now(&self) -> Option<SystemTime> {
        let sample = *self.sample.lock().unwrap_or_else(|p| p.into_inner());
        sample.and_then(|(at, returned)| at.checked_add(returned.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_database_time_moves_on_with_the_monotonic_clock_from_the_sample() {
        let clock = DbClock::default();
        assert_eq!(clock.now(), None);
        // The database's clock reads 1,000 s past the epoch, whatever the
        // local wall clock says.
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let returned = Instant::now()
            .checked_sub(Duration::from_millis(1_500))
            .expect("up for 1.5 s");
        clock.observed(at, returned);
        let now = clock.now().expect("a sample");
        let moved = now.duration_since(at).expect("not before the sample");
        assert!(moved >= Duration::from_millis(1_500), "{moved:?}");
        assert!(moved < Duration::from_secs(60), "{moved:?}");
    }
}
