//! Payloads that carry their own send time.
//!
//! The latency workloads measure from just before the Enqueue RPC is sent
//! to when a worker sees the job. The job id is only known from the
//! Enqueue reply, which may arrive *after* the Lease stream delivered the
//! job, so instead of a map by id the producer writes a monotonic
//! timestamp (nanoseconds since a process-wide origin) into the payload.
//! Producer and worker are in the same process: the same clock.

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

/// The smallest payload that holds a stamp: send time and sequence number.
pub const MIN_LEN: usize = 16;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// A payload of `len` bytes (at least [`MIN_LEN`]) stamped with now and
/// `seq`. Take it right before sending.
pub fn payload(len: usize, seq: u64) -> Vec<u8> {
    let mut bytes = vec![b'x'; len.max(MIN_LEN)];
    let nanos = u64::try_from(origin().elapsed().as_nanos()).unwrap_or(u64::MAX);
    bytes[..8].copy_from_slice(&nanos.to_le_bytes());
    bytes[8..16].copy_from_slice(&seq.to_le_bytes());
    bytes
}

/// How long ago `payload` was stamped; `None` when it carries no stamp.
pub fn age(payload: &[u8]) -> Option<Duration> {
    let nanos = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    let sent = origin().checked_add(Duration::from_nanos(nanos))?;
    Some(Instant::now().saturating_duration_since(sent))
}

/// The sequence number in a stamped payload.
#[cfg(test)]
pub fn seq(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_round_trips_and_ages() {
        let p = payload(100, 42);
        assert_eq!(p.len(), 100);
        assert_eq!(seq(&p), Some(42));
        std::thread::sleep(Duration::from_millis(5));
        let age = age(&p).unwrap();
        assert!(age >= Duration::from_millis(5) && age < Duration::from_secs(5));
    }

    #[test]
    fn short_payloads_grow_to_hold_the_stamp() {
        assert_eq!(payload(0, 1).len(), MIN_LEN);
        assert_eq!(age(b"short"), None);
    }
}
