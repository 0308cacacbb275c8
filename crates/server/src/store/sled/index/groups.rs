//! A queue's grouped jobs, for a policy's `group_max_running`.
//!
//! The queue's pending sets hold every PENDING job without a group and,
//! of the grouped ones, only those a take may lease now (the *eligible*
//! ones), so a take stays one look per priority however many jobs their
//! groups hold back. Per group this keeps its PENDING jobs in delivery
//! order and by id, and how many of its jobs run. With a limit `k`:
//! - `0` (no group limit): every PENDING job is eligible;
//! - `1` (a sequence): the group's oldest PENDING job (lowest id), only
//!   while none of the group runs;
//! - more: while fewer than `k` run, the first job of each priority the
//!   group has pending (the queue's order then finds the due one).
//!
//! A change to a group reports which entries stopped or started being
//! eligible ([`Diff`]); the index applies that to the queue's sets. A
//! change of the limit moves at most every grouped PENDING job once.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet, HashMap},
    time::SystemTime,
};

use super::At;
use crate::job::JobId;

/// A pending entry: its priority, due time and id.
pub(crate) type Entry = (i32, At, JobId);

/// Entries that left the eligible set, and entries that joined it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Diff {
    pub(crate) out: Vec<Entry>,
    pub(crate) into: Vec<Entry>,
}

impl Diff {
    fn between(before: Vec<Entry>, after: Vec<Entry>) -> Diff {
        Diff {
            out: before
                .iter()
                .filter(|e| !after.contains(e))
                .copied()
                .collect(),
            into: after
                .iter()
                .filter(|e| !before.contains(e))
                .copied()
                .collect(),
        }
    }
}

/// One group's jobs.
#[derive(Debug, Default, PartialEq)]
struct Group {
    /// PENDING jobs in delivery order: priority (highest first), `run_at`,
    /// id.
    pending: BTreeSet<(Reverse<i32>, At, JobId)>,
    /// PENDING jobs by id: the head of a sequence.
    by_id: BTreeMap<JobId, (i32, At)>,
    /// RUNNING jobs.
    running: u64,
}

impl Group {
    fn is_empty(&self) -> bool {
        self.by_id.is_empty() && self.running == 0
    }

    /// The group's eligible entries under limit `k`.
    fn eligible(&self, k: u32) -> Vec<Entry> {
        match k {
            0 => self
                .pending
                .iter()
                .map(|&(Reverse(p), at, id)| (p, at, id))
                .collect(),
            1 if self.running == 0 => self
                .by_id
                .first_key_value()
                .map(|(&id, &(p, at))| (p, at, id))
                .into_iter()
                .collect(),
            1 => Vec::new(),
            k if self.running < u64::from(k) => self.firsts(),
            _ => Vec::new(),
        }
    }

    /// The first entry of each priority: one look each.
    fn firsts(&self) -> Vec<Entry> {
        let mut firsts = Vec::new();
        let mut next = self.pending.first().copied();
        while let Some((Reverse(p), at, id)) = next {
            firsts.push((p, at, id));
            next = match p.checked_sub(1) {
                Some(lower) => self
                    .pending
                    .range((Reverse(lower), At(0), JobId(0))..)
                    .next()
                    .copied(),
                None => None,
            };
        }
        firsts
    }

    /// PENDING jobs due at `now`, counting at most `most`: each
    /// priority's due ones lead its entries.
    fn due(&self, now: At, most: u64) -> u64 {
        let mut due = 0;
        for (p, _, _) in self.firsts() {
            let from = (Reverse(p), At(0), JobId(0));
            let to = (Reverse(p), now, JobId(u64::MAX));
            due += self
                .pending
                .range(from..=to)
                .take(usize::try_from(most - due.min(most)).unwrap_or(usize::MAX))
                .count() as u64;
            if due >= most {
                break;
            }
        }
        due
    }

    /// Of the group's PENDING jobs due at `now` under limit `k`: how many
    /// are due, how many of those are eligible, and how many the limit
    /// holds back (with more than 1, a group with room holds back none,
    /// though only the first of each priority is eligible).
    fn due_counts(&self, k: u32, now: At, most: u64) -> DueCounts {
        let due = self.due(now, most);
        let eligible = self
            .eligible(k)
            .iter()
            .filter(|&&(_, at, _)| at <= now)
            .count() as u64;
        let held = match k {
            0 => 0,
            1 if self.running == 0 => due - eligible.min(due),
            k if self.running < u64::from(k) && k > 1 => 0,
            _ => due,
        };
        DueCounts {
            due,
            eligible,
            held,
        }
    }
}

/// Due PENDING grouped jobs, as [`Group::due_counts`] counts them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DueCounts {
    pub(crate) due: u64,
    pub(crate) eligible: u64,
    pub(crate) held: u64,
}

/// The groups of one queue, by name. Empty groups are dropped.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Groups(HashMap<Box<str>, Group>);

/// What a job contributes to its group: PENDING with its entry, or
/// RUNNING.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum State {
    Pending(Entry),
    Running,
}

impl Groups {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds (`add`) or removes a job's state in `group` under limit `k`.
    pub(crate) fn change(&mut self, group: &str, state: State, add: bool, k: u32) -> Diff {
        if !add && !self.0.contains_key(group) {
            return Diff::default();
        }
        let g = self.0.entry(group.into()).or_default();
        let before = if k == 0 { Vec::new() } else { g.eligible(k) };
        match (state, add) {
            (State::Pending((p, at, id)), true) => {
                g.pending.insert((Reverse(p), at, id));
                g.by_id.insert(id, (p, at));
            }
            (State::Pending((p, at, id)), false) => {
                g.pending.remove(&(Reverse(p), at, id));
                g.by_id.remove(&id);
            }
            (State::Running, true) => g.running += 1,
            (State::Running, false) => g.running = g.running.saturating_sub(1),
        }
        let diff = if k == 0 {
            // Every PENDING job is eligible: just this one moves.
            match state {
                State::Pending(e) if add => Diff {
                    out: Vec::new(),
                    into: vec![e],
                },
                State::Pending(e) => Diff {
                    out: vec![e],
                    into: Vec::new(),
                },
                State::Running => Diff::default(),
            }
        } else {
            Diff::between(before, g.eligible(k))
        };
        if g.is_empty() {
            self.0.remove(group);
        }
        diff
    }

    /// The change of the eligible set when the limit goes from `old` to
    /// `new`.
    pub(crate) fn relimit(&self, old: u32, new: u32) -> Diff {
        let mut diff = Diff::default();
        if old == new {
            return diff;
        }
        for g in self.0.values() {
            let d = Diff::between(g.eligible(old), g.eligible(new));
            diff.out.extend(d.out);
            diff.into.extend(d.into);
        }
        diff
    }

    /// Every entry eligible under `k`.
    pub(crate) fn eligible(&self, k: u32) -> Vec<Entry> {
        self.0.values().flat_map(|g| g.eligible(k)).collect()
    }

    /// The ids of every grouped PENDING job.
    pub(crate) fn pending_ids(&self) -> std::collections::HashSet<JobId> {
        self.0
            .values()
            .flat_map(|g| g.by_id.keys().copied())
            .collect()
    }

    /// The due PENDING grouped jobs at `now` under limit `k`, summed over
    /// the groups, counting about `most` due jobs at most.
    pub(crate) fn due_counts(&self, k: u32, now: SystemTime, most: u64) -> DueCounts {
        let now = At::of(now);
        let mut sum = DueCounts::default();
        for g in self.0.values() {
            let c = g.due_counts(k, now, most.saturating_sub(sum.due));
            sum.due += c.due;
            sum.eligible += c.eligible;
            sum.held += c.held;
            if sum.due >= most {
                break;
            }
        }
        sum
    }

    /// The earliest `run_at` of every grouped PENDING job, held or not:
    /// a look per group and priority.
    pub(crate) fn earliest(&self) -> Option<At> {
        self.0
            .values()
            .flat_map(|g| g.firsts())
            .map(|(_, at, _)| at)
            .min()
    }

    /// Adds the groups of `other` (other jobs).
    pub(crate) fn merge(&mut self, other: Groups) {
        for (name, theirs) in other.0 {
            let mine = self.0.entry(name).or_default();
            mine.pending.extend(theirs.pending);
            mine.by_id.extend(theirs.by_id);
            mine.running += theirs.running;
        }
    }

    /// The groups as saved: name, RUNNING count, PENDING entries.
    pub(crate) fn saved(&self) -> Vec<(&str, u64, Vec<Entry>)> {
        self.0
            .iter()
            .map(|(name, g)| {
                let entries = g.by_id.iter().map(|(&id, &(p, at))| (p, at, id)).collect();
                (&**name, g.running, entries)
            })
            .collect()
    }

    /// The groups from what [`Groups::saved`] wrote.
    pub(crate) fn from_saved(saved: Vec<(String, u64, Vec<Entry>)>) -> Groups {
        let mut groups = Groups::default();
        for (name, running, entries) in saved {
            let g = groups.0.entry(name.into()).or_default();
            g.running += running;
            for (p, at, id) in entries {
                g.pending.insert((Reverse(p), at, id));
                g.by_id.insert(id, (p, at));
            }
        }
        groups.0.retain(|_, g| !g.is_empty());
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(p: i32, at: u64, id: u64) -> Entry {
        (p, At(at), JobId(id))
    }

    fn apply(eligible: &mut Vec<Entry>, diff: Diff) {
        eligible.retain(|x| !diff.out.contains(x));
        eligible.extend(diff.into);
        eligible.sort_by_key(|&(p, at, id)| (Reverse(p), at, id));
    }

    #[test]
    fn a_sequence_offers_its_oldest_job_only_while_none_runs() {
        let mut groups = Groups::default();
        let mut eligible = Vec::new();
        // The oldest job is delayed (at 50); the next is due at 10.
        apply(
            &mut eligible,
            groups.change("a", State::Pending(e(0, 50, 1)), true, 1),
        );
        apply(
            &mut eligible,
            groups.change("a", State::Pending(e(5, 10, 2)), true, 1),
        );
        assert_eq!(eligible, vec![e(0, 50, 1)], "nothing overtakes the oldest");
        assert_eq!(
            groups.due_counts(1, SystemTime::UNIX_EPOCH, u64::MAX).held,
            0
        );
        // Taken: the group runs one, and offers nothing.
        apply(
            &mut eligible,
            groups.change("a", State::Pending(e(0, 50, 1)), false, 1),
        );
        apply(&mut eligible, groups.change("a", State::Running, true, 1));
        assert_eq!(eligible, vec![]);
        // Done: the next one is offered.
        apply(&mut eligible, groups.change("a", State::Running, false, 1));
        assert_eq!(eligible, vec![e(5, 10, 2)]);
        // Removing the limit offers every job; back to 1, the oldest.
        apply(
            &mut eligible,
            groups.change("a", State::Pending(e(0, 60, 3)), true, 1),
        );
        apply(&mut eligible, groups.relimit(1, 0));
        assert_eq!(eligible, vec![e(5, 10, 2), e(0, 60, 3)]);
        apply(&mut eligible, groups.relimit(0, 1));
        assert_eq!(eligible, vec![e(5, 10, 2)]);
    }

    #[test]
    fn a_group_limit_offers_the_first_job_of_each_priority_while_it_has_room() {
        let mut groups = Groups::default();
        let mut eligible = Vec::new();
        for entry in [e(1, 10, 1), e(1, 5, 2), e(0, 1, 3), e(0, 2, 4)] {
            apply(
                &mut eligible,
                groups.change("a", State::Pending(entry), true, 2),
            );
        }
        apply(
            &mut eligible,
            groups.change("b", State::Pending(e(0, 3, 5)), true, 2),
        );
        assert_eq!(eligible, vec![e(1, 5, 2), e(0, 1, 3), e(0, 3, 5)]);
        apply(&mut eligible, groups.change("a", State::Running, true, 2));
        apply(&mut eligible, groups.change("a", State::Running, true, 2));
        assert_eq!(eligible, vec![e(0, 3, 5)], "a runs 2: full");
        let at = |t: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(t);
        let counts = groups.due_counts(2, at(4), u64::MAX);
        assert_eq!(counts.held, 2, "ids 3 and 4 are due and held");
        assert_eq!(counts.due, 3, "and b's 5");
        assert_eq!(groups.due_counts(2, at(100), u64::MAX).held, 4);
        apply(&mut eligible, groups.change("a", State::Running, false, 2));
        assert_eq!(eligible, vec![e(1, 5, 2), e(0, 1, 3), e(0, 3, 5)]);
        assert_eq!(
            groups.due_counts(2, at(100), u64::MAX).held,
            0,
            "a has room"
        );
        assert_eq!(groups.earliest(), Some(At(1)));
    }

    #[test]
    fn empty_groups_are_dropped_and_saved_groups_read_back() {
        let mut groups = Groups::default();
        groups.change("a", State::Pending(e(0, 1, 1)), true, 0);
        groups.change("b", State::Running, true, 0);
        let saved: Vec<(String, u64, Vec<Entry>)> = groups
            .saved()
            .into_iter()
            .map(|(n, r, es)| (n.to_owned(), r, es))
            .collect();
        assert_eq!(Groups::from_saved(saved), groups);
        groups.change("a", State::Pending(e(0, 1, 1)), false, 0);
        groups.change("b", State::Running, false, 0);
        assert!(groups.is_empty());
    }
}
