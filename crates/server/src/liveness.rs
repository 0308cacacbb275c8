//! Whether this server may still hand out what it took.
//!
//! On a store shared by several servers, the others take a server for dead
//! once its heartbeat is older than `--server-timeout`, and reclaim its
//! streams' leases. So a server hands out nothing once its last successful
//! heartbeat is older than half of that: the heartbeat loop renews the
//! deadline after each beat, and a Lease stream checks it as each leased job
//! leaves for the wire. The check reads the clocks itself rather than
//! waiting for the heartbeat loop's verdict: a server that was frozen
//! (SIGSTOP, a paused VM) and thaws must not send a lease it buffered before
//! the freeze, which another server may have reclaimed in the meantime,
//! before its heartbeat loop has had a turn to notice. Both clocks are
//! read, the monotonic one and the wall clock (a paused VM's monotonic
//! clock may stand still while it is paused; its wall clock is set right
//! when it resumes): stale by either is stale.
//!
//! A lapse (a renewal that finds the deadline already passed) also starts
//! a new epoch. A take notes the epoch before it asks the store, and its
//! lease is sent only in that same epoch: a lease taken before a freeze is
//! never sent after it, even if a heartbeat succeeded in between and the
//! deadline is fresh again. A store of its own has no deadline.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// The deadline for handing out leases, and its epoch.
#[derive(Debug, Clone, Default)]
pub struct Liveness(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    /// Monotonic and wall-clock deadlines; none until first renewed.
    until: Option<(Instant, SystemTime)>,
    /// Bumped by every renewal that found the deadline passed.
    epoch: u64,
}

fn stale(until: Option<(Instant, SystemTime)>) -> bool {
    until.is_some_and(|(mono, wall)| Instant::now() >= mono || SystemTime::now() >= wall)
}

impl Liveness {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Live for `left` more, counted from a heartbeat sent `ago`.
    pub fn renew(&self, left: Duration, ago: Duration) {
        let mut state = self.state();
        if stale(state.until) {
            state.epoch += 1;
        }
        let left = left.saturating_sub(ago);
        state.until = Some((Instant::now() + left, SystemTime::now() + left));
    }

    /// The epoch now: what a take notes before it asks the store.
    pub fn epoch(&self) -> u64 {
        self.state().epoch
    }

    /// Whether a lease taken in `epoch` may be handed out now.
    pub fn may_send(&self, epoch: u64) -> bool {
        let state = self.state();
        state.epoch == epoch && !stale(state.until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_until_the_deadline_passes() {
        let live = Liveness::default();
        let epoch = live.epoch();
        assert!(live.may_send(epoch), "no deadline: a store of its own");
        live.renew(Duration::from_secs(60), Duration::ZERO);
        assert!(live.may_send(epoch));
        live.clone()
            .renew(Duration::from_secs(1), Duration::from_secs(2));
        assert!(!live.may_send(epoch), "a clone shares the deadline");
    }

    #[test]
    fn a_lapse_starts_an_epoch_whose_leases_alone_are_sent() {
        let live = Liveness::default();
        live.renew(Duration::ZERO, Duration::ZERO);
        let before = live.epoch();
        // The heartbeat succeeds again after the lapse: fresh, but a lease
        // taken before it stays unsent.
        live.renew(Duration::from_secs(60), Duration::ZERO);
        assert!(!live.may_send(before));
        assert!(live.may_send(live.epoch()));
        // Renewals in time keep the epoch.
        let now = live.epoch();
        live.renew(Duration::from_secs(60), Duration::ZERO);
        assert_eq!(live.epoch(), now);
    }
}
