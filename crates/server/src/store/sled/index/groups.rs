//! A queue's grouped jobs, for a policy's `group_max_running` and
//! `group_rate`.
//!
//! The queue's pending sets hold every PENDING job without a group and,
//! of the grouped ones, only those a take may lease now (the *eligible*
//! ones), so a take stays one look per priority however many jobs their
//! groups hold back. Per group this keeps its PENDING jobs in delivery
//! order and by id, and how many of its jobs run. Under a [`Rule`]:
//! - no group limit and no group rate: every PENDING job is eligible;
//! - `k = 1` (a sequence): the group's oldest PENDING job (lowest id),
//!   only while none of the group runs;
//! - otherwise, while fewer than `k` run (or with no limit): the first job
//!   of each priority the group has pending (the queue's order then finds
//!   the due one);
//! - and none while the group's rate limit is out of tokens: the group is
//!   *throttled* until its next token, when a take releases it.
//!
//! A change to a group reports which entries stopped or started being
//! eligible ([`Diff`]); the index applies that to the queue's sets. A
//! change of the policy moves at most every grouped PENDING job once, and
//! refills the groups' buckets.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet, HashMap},
    time::SystemTime,
};

use super::At;
use crate::{
    job::JobId,
    policy::{Bucket, Rate},
};

/// What a queue's policy asks of its groups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Rule {
    /// `group_max_running` (0: none).
    pub(crate) k: u32,
    /// `group_rate`.
    pub(crate) rate: Option<Rate>,
}

impl Rule {
    /// Whether every PENDING job is eligible, whatever its group does.
    fn offers_all(&self) -> bool {
        self.k == 0 && self.rate.is_none()
    }
}

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

    /// The group's eligible entries under `rule` (none while `throttled`).
    fn eligible(&self, rule: Rule, throttled: bool) -> Vec<Entry> {
        if throttled {
            return Vec::new();
        }
        match rule.k {
            0 if rule.rate.is_none() => self
                .pending
                .iter()
                .map(|&(Reverse(p), at, id)| (p, at, id))
                .collect(),
            0 => self.firsts(),
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

    /// Of the group's PENDING jobs due at `now` under `rule`: how many
    /// are due, how many of those are eligible, and how many the limit
    /// holds back (with no limit or one over 1, a group with room holds
    /// back none, though only the first of each priority may be eligible)
    /// or its rate limit does (all, while `throttled`).
    fn due_counts(&self, rule: Rule, throttled: bool, now: At, most: u64) -> DueCounts {
        let due = self.due(now, most);
        let eligible = self
            .eligible(rule, throttled)
            .iter()
            .filter(|&&(_, at, _)| at <= now)
            .count() as u64;
        if throttled {
            return DueCounts {
                due,
                eligible,
                held_rate: due,
                ..DueCounts::default()
            };
        }
        let held = match rule.k {
            0 => 0,
            1 if self.running == 0 => due - eligible.min(due),
            k if self.running < u64::from(k) && k > 1 => 0,
            _ => due,
        };
        DueCounts {
            due,
            eligible,
            held,
            held_rate: 0,
        }
    }
}

/// Due PENDING grouped jobs, as [`Group::due_counts`] counts them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DueCounts {
    pub(crate) due: u64,
    pub(crate) eligible: u64,
    /// Held by `group_max_running`.
    pub(crate) held: u64,
    /// Held by `group_rate`.
    pub(crate) held_rate: u64,
}

/// The groups of one queue. Empty groups are dropped; their rate buckets
/// stay until the policy changes (a group that empties and gets a job
/// again must not find its bucket full).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Groups {
    by_name: HashMap<Box<str>, Group>,
    /// The groups' rate buckets (none: full), with when each is full
    /// again.
    buckets: HashMap<Box<str>, (Bucket, At)>,
    /// The same, by when they are full again: dropped then.
    fulls: BTreeSet<(At, Box<str>)>,
    /// Groups out of tokens, and until when.
    throttled: HashMap<Box<str>, At>,
    /// The same, by time.
    releases: BTreeSet<(At, Box<str>)>,
}

/// What a job contributes to its group: PENDING with its entry, or
/// RUNNING.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum State {
    Pending(Entry),
    Running,
}

impl Groups {
    pub(crate) fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Whether a group's rate bucket is short of full (it must outlive
    /// the group's jobs).
    pub(crate) fn has_buckets(&self) -> bool {
        !self.buckets.is_empty()
    }

    fn eligible_of(&self, name: &str, g: &Group, rule: Rule) -> Vec<Entry> {
        g.eligible(rule, self.throttled.contains_key(name))
    }

    /// Adds (`add`) or removes a job's state in `group` under `rule`.
    pub(crate) fn change(&mut self, group: &str, state: State, add: bool, rule: Rule) -> Diff {
        if !add && !self.by_name.contains_key(group) {
            return Diff::default();
        }
        let throttled = self.throttled.contains_key(group);
        let g = self.by_name.entry(group.into()).or_default();
        let before = if rule.offers_all() {
            Vec::new()
        } else {
            g.eligible(rule, throttled)
        };
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
        let diff = if rule.offers_all() {
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
            Diff::between(before, g.eligible(rule, throttled))
        };
        if g.is_empty() {
            self.by_name.remove(group);
        }
        diff
    }

    /// The change of the eligible set when the rule goes from `old` to
    /// `new`; the groups' buckets start full again.
    pub(crate) fn relimit(&mut self, old: Rule, new: Rule) -> Diff {
        let mut diff = Diff::default();
        for (name, g) in &self.by_name {
            diff.out.extend(self.eligible_of(name, g, old));
        }
        self.buckets.clear();
        self.fulls.clear();
        self.throttled.clear();
        self.releases.clear();
        for g in self.by_name.values() {
            diff.into.extend(g.eligible(new, false));
        }
        diff
    }

    /// A take of a job of `group` at `now` spends a token of its rate
    /// limit; a group left without one is throttled until its next.
    pub(crate) fn took(&mut self, group: &str, rule: Rule, now: SystemTime) -> Diff {
        let Some(rate) = rule.rate else {
            return Diff::default();
        };
        let (bucket, full_at) = self
            .buckets
            .entry(group.into())
            .or_insert_with(|| (Bucket::full(&rate, now), At::of(now)));
        bucket.spend(&rate, 1.0, now);
        let tokens = bucket.tokens(&rate, now);
        let full = now
            + std::time::Duration::from_secs_f64(
                ((rate.capacity() - tokens) / rate.per_second()).max(0.0),
            );
        self.fulls.remove(&(*full_at, group.into()));
        *full_at = At::of(full);
        self.fulls.insert((At::of(full), group.into()));
        if tokens >= 1.0 {
            return Diff::default();
        }
        let until = At::of(bucket.next_token(&rate, now));
        let out = match self.by_name.get(group) {
            Some(g) => self.eligible_of(group, g, rule),
            None => Vec::new(),
        };
        if let Some(was) = self.throttled.insert(group.into(), until) {
            self.releases.remove(&(was, group.into()));
        }
        self.releases.insert((until, group.into()));
        Diff {
            out,
            into: Vec::new(),
        }
    }

    /// Releases the groups whose next token has come by `now`, and drops
    /// the buckets that are full again.
    pub(crate) fn release(&mut self, rule: Rule, now: SystemTime) -> Diff {
        let now = At::of(now);
        while let Some((at, name)) = self.fulls.first().cloned() {
            if at > now {
                break;
            }
            self.fulls.pop_first();
            if self.buckets.get(&name).is_some_and(|&(_, full)| full == at) {
                self.buckets.remove(&name);
            }
        }
        let mut diff = Diff::default();
        while let Some((at, name)) = self.releases.first().cloned() {
            if at > now {
                break;
            }
            self.releases.pop_first();
            self.throttled.remove(&name);
            if let Some(g) = self.by_name.get(&name) {
                diff.into.extend(g.eligible(rule, false));
            }
        }
        diff
    }

    /// When the next throttled group gets a token.
    pub(crate) fn next_release(&self) -> Option<At> {
        self.releases.first().map(|(at, _)| *at)
    }

    /// Every entry eligible under `rule`.
    pub(crate) fn eligible(&self, rule: Rule) -> Vec<Entry> {
        self.by_name
            .iter()
            .flat_map(|(name, g)| self.eligible_of(name, g, rule))
            .collect()
    }

    /// The ids of every grouped PENDING job.
    pub(crate) fn pending_ids(&self) -> std::collections::HashSet<JobId> {
        self.by_name
            .values()
            .flat_map(|g| g.by_id.keys().copied())
            .collect()
    }

    /// The due PENDING grouped jobs at `now` under `rule`, summed over
    /// the groups, counting about `most` due jobs at most.
    pub(crate) fn due_counts(&self, rule: Rule, now: SystemTime, most: u64) -> DueCounts {
        let now = At::of(now);
        let mut sum = DueCounts::default();
        for (name, g) in &self.by_name {
            let throttled = self.throttled.contains_key(name);
            let c = g.due_counts(rule, throttled, now, most.saturating_sub(sum.due));
            sum.due += c.due;
            sum.eligible += c.eligible;
            sum.held += c.held;
            sum.held_rate += c.held_rate;
            if sum.due >= most {
                break;
            }
        }
        sum
    }

    /// The earliest `run_at` of every grouped PENDING job, held or not:
    /// a look per group and priority.
    pub(crate) fn earliest(&self) -> Option<At> {
        self.by_name
            .values()
            .flat_map(|g| g.firsts())
            .map(|(_, at, _)| at)
            .min()
    }

    /// Adds the groups of `other` (other jobs).
    pub(crate) fn merge(&mut self, other: Groups) {
        for (name, theirs) in other.by_name {
            let mine = self.by_name.entry(name).or_default();
            mine.pending.extend(theirs.pending);
            mine.by_id.extend(theirs.by_id);
            mine.running += theirs.running;
        }
    }

    /// The groups as saved: name, RUNNING count, PENDING entries.
    pub(crate) fn saved(&self) -> Vec<(&str, u64, Vec<Entry>)> {
        self.by_name
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
            let g = groups.by_name.entry(name.into()).or_default();
            g.running += running;
            for (p, at, id) in entries {
                g.pending.insert((Reverse(p), at, id));
                g.by_id.insert(id, (p, at));
            }
        }
        groups.by_name.retain(|_, g| !g.is_empty());
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: u32) -> Rule {
        Rule { k: n, rate: None }
    }

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
            groups.change("a", State::Pending(e(0, 50, 1)), true, k(1)),
        );
        apply(
            &mut eligible,
            groups.change("a", State::Pending(e(5, 10, 2)), true, k(1)),
        );
        assert_eq!(eligible, vec![e(0, 50, 1)], "nothing overtakes the oldest");
        assert_eq!(
            groups
                .due_counts(k(1), SystemTime::UNIX_EPOCH, u64::MAX)
                .held,
            0
        );
        // Taken: the group runs one, and offers nothing.
        apply(
            &mut eligible,
            groups.change("a", State::Pending(e(0, 50, 1)), false, k(1)),
        );
        apply(
            &mut eligible,
            groups.change("a", State::Running, true, k(1)),
        );
        assert_eq!(eligible, vec![]);
        // Done: the next one is offered.
        apply(
            &mut eligible,
            groups.change("a", State::Running, false, k(1)),
        );
        assert_eq!(eligible, vec![e(5, 10, 2)]);
        // Removing the limit offers every job; back to 1, the oldest.
        apply(
            &mut eligible,
            groups.change("a", State::Pending(e(0, 60, 3)), true, k(1)),
        );
        apply(&mut eligible, groups.relimit(k(1), k(0)));
        assert_eq!(eligible, vec![e(5, 10, 2), e(0, 60, 3)]);
        apply(&mut eligible, groups.relimit(k(0), k(1)));
        assert_eq!(eligible, vec![e(5, 10, 2)]);
    }

    #[test]
    fn a_group_limit_offers_the_first_job_of_each_priority_while_it_has_room() {
        let mut groups = Groups::default();
        let mut eligible = Vec::new();
        for entry in [e(1, 10, 1), e(1, 5, 2), e(0, 1, 3), e(0, 2, 4)] {
            apply(
                &mut eligible,
                groups.change("a", State::Pending(entry), true, k(2)),
            );
        }
        apply(
            &mut eligible,
            groups.change("b", State::Pending(e(0, 3, 5)), true, k(2)),
        );
        assert_eq!(eligible, vec![e(1, 5, 2), e(0, 1, 3), e(0, 3, 5)]);
        apply(
            &mut eligible,
            groups.change("a", State::Running, true, k(2)),
        );
        apply(
            &mut eligible,
            groups.change("a", State::Running, true, k(2)),
        );
        assert_eq!(eligible, vec![e(0, 3, 5)], "a runs 2: full");
        let at = |t: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(t);
        let counts = groups.due_counts(k(2), at(4), u64::MAX);
        assert_eq!(counts.held, 2, "ids 3 and 4 are due and held");
        assert_eq!(counts.due, 3, "and b's 5");
        assert_eq!(groups.due_counts(k(2), at(100), u64::MAX).held, 4);
        apply(
            &mut eligible,
            groups.change("a", State::Running, false, k(2)),
        );
        assert_eq!(eligible, vec![e(1, 5, 2), e(0, 1, 3), e(0, 3, 5)]);
        assert_eq!(
            groups.due_counts(k(2), at(100), u64::MAX).held,
            0,
            "a has room"
        );
        assert_eq!(groups.earliest(), Some(At(1)));
    }

    #[test]
    fn empty_groups_are_dropped_and_saved_groups_read_back() {
        let mut groups = Groups::default();
        groups.change("a", State::Pending(e(0, 1, 1)), true, k(0));
        groups.change("b", State::Running, true, k(0));
        let saved: Vec<(String, u64, Vec<Entry>)> = groups
            .saved()
            .into_iter()
            .map(|(n, r, es)| (n.to_owned(), r, es))
            .collect();
        assert_eq!(Groups::from_saved(saved), groups);
        groups.change("a", State::Pending(e(0, 1, 1)), false, k(0));
        groups.change("b", State::Running, false, k(0));
        assert!(groups.is_empty());
    }
}

#[cfg(test)]
mod rate_tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_group_out_of_tokens_offers_nothing_until_its_next_token() {
        let rule = Rule {
            k: 0,
            rate: Some(Rate {
                limit: 10,
                per: Duration::from_secs(1),
                burst: 1,
            }),
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let entry = |id: u64| (0, At::of(t0), JobId(id));
        let mut groups = Groups::default();
        let mut offered = Vec::new();
        for id in 1..=3 {
            let d = groups.change("a", State::Pending(entry(id)), true, rule);
            offered.retain(|x| !d.out.contains(x));
            offered.extend(d.into);
        }
        assert_eq!(offered, vec![entry(1)], "a group rate offers the first job");
        // Take job 1: the burst of 1 is spent.
        for d in [
            groups.change("a", State::Pending(entry(1)), false, rule),
            groups.change("a", State::Running, true, rule),
            groups.took("a", rule, t0),
        ] {
            offered.retain(|x| !d.out.contains(x));
            offered.extend(d.into);
        }
        assert_eq!(offered, vec![], "throttled");
        assert_eq!(groups.due_counts(rule, t0, u64::MAX).held_rate, 2);
        let next = t0 + Duration::from_millis(100);
        assert_eq!(groups.next_release(), Some(At::of(next)));
        assert_eq!(
            groups.release(rule, next - Duration::from_millis(1)),
            Diff::default()
        );
        let d = groups.release(rule, next);
        assert_eq!(d.into, vec![entry(2)], "its next token releases it");
        // Emptied and refilled, a group keeps its bucket.
        groups.change("a", State::Running, false, rule);
        groups.change("a", State::Pending(entry(2)), false, rule);
        groups.change("a", State::Pending(entry(3)), false, rule);
        assert!(groups.is_empty());
        groups.took("a", rule, next);
        assert!(groups.has_buckets(), "the group's bucket outlives its jobs");
        let d = groups.change("a", State::Pending(entry(4)), true, rule);
        assert_eq!(d.into, vec![], "the bucket is still empty");
        // Full again (1 token, 100 ms later), it is dropped.
        let later = next + Duration::from_millis(100);
        assert_eq!(groups.release(rule, later).into, vec![entry(4)]);
        assert!(!groups.has_buckets());
        // A new policy refills every bucket.
        groups.took("a", rule, later);
        assert!(groups.release(rule, later).into.is_empty());
        let d = groups.relimit(rule, rule);
        assert_eq!(d.into, vec![entry(4)]);
    }
}
