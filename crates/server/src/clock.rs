//! Wall-clock times turned into tokio instants, for the loops that sleep
//! until a job or a lease is due (the reaper, Lease streams, a waiting
//! Dequeue).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// The tokio instant at which wall-clock time `t` arrives (now if past).
pub fn instant_at(t: SystemTime) -> Instant {
    let now = SystemTime::now();
    Instant::now() + t.duration_since(now).unwrap_or(Duration::ZERO)
}

/// The least wait before looking again after a take found nothing although
/// the store said a job was due: on PostgreSQL a due job whose row another
/// transaction holds (a frozen server's, for up to its idle timeout) is
/// counted due but skipped by the take, and looking again at once would
/// spin on the database.
pub const RETAKE_PAUSE: Duration = Duration::from_millis(20);

/// When to look again for a job due at `t`, at the earliest
/// [`RETAKE_PAUSE`] from now (any new job wakes the waiter sooner).
pub fn retake_at(t: SystemTime) -> Instant {
    instant_at(t).max(Instant::now() + RETAKE_PAUSE)
}
