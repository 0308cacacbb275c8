//! Whether this server may still hand out what it took.
//!
//! On a store shared by several servers, the others take a server for dead
//! once its heartbeat is older than `--server-timeout`, and reclaim its
//! streams' leases. So a server hands out nothing once its last successful
//! heartbeat is older than half of that: the heartbeat loop renews the
//! deadline after each beat, and a Lease stream checks it as each leased job
//! leaves for the wire. The check reads the monotonic clock itself rather
//! than waiting for the heartbeat loop's verdict: a server that was frozen
//! (SIGSTOP, a paused VM) and thaws must not send a lease it buffered before
//! the freeze, which another server may have reclaimed in the meantime,
//! before its heartbeat loop has had a turn to notice. A store of its own
//! has no deadline.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A shared deadline for handing out leases; none until first renewed.
#[derive(Debug, Clone, Default)]
pub struct Liveness(Arc<Mutex<Option<Instant>>>);

impl Liveness {
    /// Live until `until` (a heartbeat's send time plus half the timeout).
    pub fn renew(&self, until: Instant) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }

    /// Whether leases may be handed out now.
    pub fn is_live(&self) -> bool {
        match *self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            None => true,
            Some(until) => Instant::now() < until,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn live_until_the_deadline_passes() {
        let live = Liveness::default();
        assert!(live.is_live(), "no deadline: a store of its own");
        live.renew(Instant::now() + Duration::from_secs(60));
        assert!(live.is_live());
        live.clone().renew(Instant::now());
        assert!(!live.is_live(), "a clone shares the deadline");
    }
}
