//! Takes in flight, and the leases that ended while they were.
//!
//! A stream registers itself as the owner of a lease only once its take
//! returns. A lease that ends in between (a CancelJob right after the
//! take, another server's reclaim) publishes its lease-ended event while
//! nobody owns it, so no stream hears it; the stream would then push a job
//! whose lease is over and keep its slot until a heartbeat reconciles it
//! (never, for a client that does not heartbeat). So the hub remembers the
//! unowned ends that happen while a take is in flight, and a take that
//! returns one of them drops its job instead of pushing it.
//!
//! Only ends that happen while some take is in flight are kept, and only
//! as long as a take that began before them is still in flight.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::job::LeaseId;

/// The takes in flight and the unowned lease ends since the oldest.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    /// The number the next unowned end gets.
    next: u64,
    /// Takes in flight, counted by the number they began at.
    takes: BTreeMap<u64, usize>,
    /// Leases that ended unowned while a take was in flight, by number
    /// (oldest first, to prune)...
    ended: VecDeque<(u64, LeaseId)>,
    /// ...and the same by lease, to look up: a finish must not scan them
    /// all under the hub's lock (a shared store's other servers end many
    /// leases this one does not own).
    by_lease: HashMap<LeaseId, u64>,
}

impl InFlight {
    /// A take begins; returns what [`InFlight::finish`] needs.
    pub(super) fn begin(&mut self) -> u64 {
        *self.takes.entry(self.next).or_default() += 1;
        self.next
    }

    /// A lease ended that no stream owns.
    pub(super) fn ended_unowned(&mut self, lease: LeaseId) {
        if !self.takes.is_empty() {
            self.ended.push_back((self.next, lease));
            self.by_lease.insert(lease, self.next);
            self.next += 1;
        }
    }

    /// The take begun at `since` returned `lease` (or nothing): whether
    /// that lease ended meanwhile.
    pub(super) fn finish(&mut self, since: u64, lease: Option<LeaseId>) -> bool {
        let ended =
            lease.is_some_and(|lease| self.by_lease.get(&lease).is_some_and(|&n| n >= since));
        if let Some(count) = self.takes.get_mut(&since) {
            *count -= 1;
            if *count == 0 {
                self.takes.remove(&since);
            }
        }
        match self.takes.keys().next() {
            None => {
                self.ended.clear();
                self.by_lease.clear();
            }
            Some(&oldest) => {
                while let Some(&(n, lease)) = self.ended.front().filter(|&&(n, _)| n < oldest) {
                    self.ended.pop_front();
                    // Unless the same lease ended again later (a duplicate event).
                    if self.by_lease.get(&lease) == Some(&n) {
                        self.by_lease.remove(&lease);
                    }
                }
            }
        }
        ended
    }

    /// Unowned ends kept (tests).
    #[cfg(test)]
    fn kept(&self) -> usize {
        assert!(self.by_lease.len() <= self.ended.len());
        self.ended.len()
    }
}

#[cfg(test)]
mod tests {
    use super::InFlight;
    use crate::job::LeaseId;

    #[test]
    fn a_lease_that_ended_during_its_take_is_known_to_have_ended() {
        let mut f = InFlight::default();
        let take = f.begin();
        f.ended_unowned(LeaseId(7));
        assert!(
            f.finish(take, Some(LeaseId(7))),
            "cancelled before it was owned"
        );
        assert_eq!(f.kept(), 0, "nothing in flight, nothing kept");
    }

    #[test]
    fn an_end_before_the_take_began_or_of_another_lease_is_not_its_own() {
        let mut f = InFlight::default();
        let first = f.begin();
        f.ended_unowned(LeaseId(1));
        let second = f.begin();
        f.ended_unowned(LeaseId(2));
        // A lease id is fresh per take; this only checks the bookkeeping.
        assert!(
            !f.finish(second, Some(LeaseId(1))),
            "ended before `second` began"
        );
        assert!(!f.finish(first, Some(LeaseId(3))), "another lease");
    }

    #[test]
    fn a_lease_that_ends_twice_is_still_known_after_its_first_end_is_pruned() {
        let mut f = InFlight::default();
        let old = f.begin();
        f.ended_unowned(LeaseId(9));
        let young = f.begin();
        f.ended_unowned(LeaseId(9));
        f.finish(old, None);
        assert_eq!(f.kept(), 1);
        assert!(
            f.finish(young, Some(LeaseId(9))),
            "its second end is still kept"
        );
    }

    #[test]
    fn ends_are_kept_only_while_an_older_take_is_in_flight() {
        let mut f = InFlight::default();
        f.ended_unowned(LeaseId(1));
        assert_eq!(f.kept(), 0, "no take in flight: nothing to race with");
        let slow = f.begin();
        for lease in 0..100 {
            let take = f.begin();
            f.ended_unowned(LeaseId(lease));
            f.finish(take, None);
        }
        assert_eq!(f.kept(), 100, "the slow take may still return one");
        f.finish(slow, None);
        assert_eq!(f.kept(), 0);
        let a = f.begin();
        f.ended_unowned(LeaseId(5));
        let b = f.begin();
        f.ended_unowned(LeaseId(6));
        f.finish(a, None);
        assert_eq!(f.kept(), 1, "only what `b` may race with");
        assert!(f.finish(b, Some(LeaseId(6))));
    }
}
