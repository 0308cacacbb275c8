//! The sled store's in-memory indexes: what must be answered without
//! reading records (which job is due next, which lease runs out next, who
//! holds a key, how many jobs each queue has, which jobs have a status).
//!
//! They are derived from the records alone, rebuilt at startup by scanning
//! them, and changed only together with a record under the store's mutex.
//! Per job they keep ids and times, never payloads: a PENDING job costs one
//! `(run_at, id)` set entry in its priority's set (plus its key, if it has
//! one), and every job about a bit in its status's id bitmap and another
//! in its queue's bitmap of that status (ListJobs by status, by queue, or
//! both, reads only the records they name).
//!
//! Delivery order (docs/src/design.md §1 rule 5) is priority, then `run_at`, then
//! id, among *due* jobs. A queue keeps one `(run_at, id)` set per priority
//! in use, highest first: the first due job is the first entry of the
//! first set whose first entry is due. That is one O(log n) look per
//! priority in use (at most 201, in practice a handful), and the earliest
//! `run_at` of the queue is the least of the sets' first entries.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, SystemTime},
};

use roaring::RoaringTreemap;
use serde::{Deserialize, Serialize};

use crate::{
    job::{Job, JobId, Status},
    policy::{Bucket, QueuePolicy},
    store::QueueStats,
};

mod groups;
mod packed;
mod saved;

use groups::{Diff, Entry, Groups, Rule, State};

use packed::{get_varint, put_varint, Delta, PackedSet};

/// A time in an index entry: nanoseconds since the Unix epoch. 8 bytes
/// where a `SystemTime` takes 16, so an entry `(At, JobId)` is 16 bytes,
/// not 24 (and a B-tree node of 11 entries fits a 192-byte allocation, not
/// a 320-byte one). Saturates before 1970 and after 2554, which no job's
/// time reaches (delays are bounded by `--max-delay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct At(u64);

impl At {
    fn of(time: SystemTime) -> At {
        At(time
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }

    fn time(self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_nanos(self.0)
    }
}

/// A pending set's entry as the differences from the one before it: its
/// time's (not negative: the set is sorted by time first), then its id's,
/// zigzagged (an older id can follow at a later time). Jobs enqueued in
/// order take ~4 bytes: microseconds apart, ids a few apart.
impl Delta for (At, JobId) {
    fn put_after(self, prev: Self, out: &mut Vec<u8>) {
        put_varint(self.0 .0.wrapping_sub(prev.0 .0), out);
        let id = self.1 .0.wrapping_sub(prev.1 .0);
        put_varint((id << 1) ^ (id >> 63).wrapping_neg(), out);
    }

    fn get_after(prev: Self, bytes: &mut &[u8]) -> Self {
        let at = prev.0 .0.wrapping_add(get_varint(bytes));
        let zigzag = get_varint(bytes);
        let id = (zigzag >> 1) ^ (zigzag & 1).wrapping_neg();
        (At(at), JobId(prev.1 .0.wrapping_add(id)))
    }
}

/// One queue's indexes.
#[derive(Debug, Default, PartialEq)]
struct QueueIndex {
    name: Box<str>,
    /// PENDING jobs by priority (highest first), each priority's in the
    /// order its jobs became due. No empty sets.
    pending: BTreeMap<Reverse<i32>, PackedSet<(At, JobId)>>,
    /// Retained jobs by key: at most one per (queue, key).
    keys: HashMap<Box<str>, JobId>,
    /// Ids of the queue's jobs per status, indexed like [`Status::ALL`]:
    /// ListJobs by queue, and the queue's counts (a bitmap's length).
    by_status: [RoaringTreemap; 4],
    /// The PENDING and RUNNING jobs that have a group; `pending` holds
    /// only the grouped jobs the policy lets a take lease ([`groups`]).
    groups: Groups,
}

impl QueueIndex {
    /// Applies a change of the eligible grouped entries to `pending`.
    fn apply(&mut self, diff: Diff) {
        for (p, at, id) in diff.out {
            pending_remove(&mut self.pending, p, (at, id));
        }
        for (p, at, id) in diff.into {
            self.pending.entry(Reverse(p)).or_default().insert((at, id));
        }
    }

    /// The earliest `run_at` of the queue's PENDING jobs, any priority.
    fn earliest(&self) -> Option<SystemTime> {
        self.pending
            .values()
            .filter_map(|set| set.first().map(|(run_at, _)| run_at.time()))
            .min()
    }
}

/// Indexes over all records.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Index {
    /// Queues by number; queue names are interned so that per-job entries
    /// do not repeat them.
    queues: Vec<QueueIndex>,
    by_name: HashMap<Box<str>, usize>,
    /// RUNNING jobs by lease expiry.
    leases: BTreeSet<(At, JobId)>,
    /// Ids of jobs per status, indexed like [`Status::ALL`]: ListJobs by
    /// status walks its set instead of every record. Compressed bitmaps:
    /// ids are handed out in sequence, so a set costs about a bit per id in
    /// its range (1M pending: ~3 MiB), not a tree node entry per job.
    by_status: [RoaringTreemap; 4],
    /// Paused queues (persisted in the `paused` tree).
    paused: BTreeSet<String>,
    /// Queue policies (persisted in the `policies` tree).
    policies: HashMap<String, QueuePolicy>,
    /// The rate limits' buckets, by queue: made at a queue's first take
    /// under its rate (absent: full), dropped when its policy changes.
    /// Not persisted: a restart starts them full.
    buckets: HashMap<String, Bucket>,
}

/// Removes `entry` from a queue's pending sets, and its set if empty.
fn pending_remove(
    pending: &mut BTreeMap<Reverse<i32>, PackedSet<(At, JobId)>>,
    priority: i32,
    entry: (At, JobId),
) {
    if let Some(set) = pending.get_mut(&Reverse(priority)) {
        set.remove(&entry);
        if set.is_empty() {
            pending.remove(&Reverse(priority));
        }
    }
}

/// What a job adds to its group's counts: PENDING or RUNNING.
fn grouped_state(job: &Job) -> Option<State> {
    match job.status {
        Status::Pending => Some(State::Pending((job.priority, At::of(job.run_at), job.id))),
        Status::Running => Some(State::Running),
        Status::Done | Status::Failed => None,
    }
}

/// Up to `n` ids of `set` from `from` on, in order.
///
/// Block by block (each 2^32 ids is one bitmap): `range` seeks within the
/// block of `from`, and later blocks are read from their start. Not the
/// treemap's `Iter::advance_to`: in roaring 0.10 that skips ids of the next
/// block whose low half is below `from`'s when `from`'s own block has
/// nothing left. Nor `rank` and `select` per id: each walks every
/// container of the bitmap, so a page cost O(n × ids / 65536), and a
/// retention pass over tens of millions of finished jobs seconds of CPU
/// under the store's lock.
fn first_from(set: &RoaringTreemap, from: JobId, n: usize) -> Vec<JobId> {
    let (from_high, from_low) = ((from.0 >> 32) as u32, from.0 as u32);
    let mut out = Vec::with_capacity(n.min(1024));
    for (high, bitmap) in set.bitmaps() {
        if out.len() >= n {
            break;
        }
        let lows = match high.cmp(&from_high) {
            std::cmp::Ordering::Less => continue,
            std::cmp::Ordering::Equal => bitmap.range(from_low..),
            std::cmp::Ordering::Greater => bitmap.iter(),
        };
        out.extend(
            lows.take(n - out.len())
                .map(|low| JobId(u64::from(high) << 32 | u64::from(low))),
        );
    }
    out
}

fn slot(status: Status) -> usize {
    match status {
        Status::Pending => 0,
        Status::Running => 1,
        Status::Done => 2,
        Status::Failed => 3,
    }
}

impl Index {
    fn queue(&self, name: &str) -> Option<&QueueIndex> {
        self.by_name.get(name).and_then(|&q| self.queues.get(q))
    }

    fn queue_mut(&mut self, name: &str) -> &mut QueueIndex {
        let q = match self.by_name.get(name) {
            Some(&q) => q,
            None => {
                let q = self.queues.len();
                self.queues.push(QueueIndex {
                    name: name.into(),
                    ..QueueIndex::default()
                });
                self.by_name.insert(name.into(), q);
                q
            }
        };
        &mut self.queues[q]
    }

    /// How many jobs are indexed.
    pub(crate) fn len(&self) -> u64 {
        self.by_status.iter().map(RoaringTreemap::len).sum()
    }

    /// Whether a job with this id is indexed.
    pub(crate) fn contains(&self, id: JobId) -> bool {
        self.by_status.iter().any(|ids| ids.contains(id.0))
    }

    /// Rebuilds the ordered sets packed (after a startup scan): a B-tree
    /// grown by inserts in order keeps its nodes about half full, one built
    /// from sorted entries fills them; a [`PackedSet`] stays packed when
    /// it grows in order, but not when it grows out of order.
    pub(crate) fn compact(&mut self) {
        let entries: Vec<_> = std::mem::take(&mut self.leases).into_iter().collect();
        self.leases = entries.into_iter().collect();
        for queue in &mut self.queues {
            queue.pending.values_mut().for_each(PackedSet::repack);
        }
    }

    /// Adds the jobs of `other`, which indexes jobs this one does not
    /// (another part of the records).
    pub(crate) fn merge(&mut self, other: Index) {
        let Index {
            queues,
            by_name: _,
            leases: mut other_leases,
            by_status,
            paused,
            policies,
            buckets,
        } = other;
        self.policies.extend(policies);
        self.buckets.extend(buckets);
        self.leases.append(&mut other_leases);
        for (mine, theirs) in self.by_status.iter_mut().zip(by_status) {
            *mine |= theirs;
        }
        self.paused.extend(paused);
        for q in queues {
            let queue = self.queue_mut(&q.name);
            for (priority, mut set) in q.pending {
                queue.pending.entry(priority).or_default().append(&mut set);
            }
            queue.keys.extend(q.keys);
            for (mine, theirs) in queue.by_status.iter_mut().zip(q.by_status) {
                *mine |= theirs;
            }
            // Both parts were indexed with no group limit: every grouped
            // PENDING job is in their pending sets already.
            queue.groups.merge(q.groups);
        }
    }

    /// Adds a job that was not indexed before (a new or loaded record).
    pub(crate) fn insert(&mut self, job: &Job) {
        if let Some(key) = &job.key {
            self.queue_mut(&job.queue)
                .keys
                .insert(key.as_str().into(), job.id);
        }
        self.add_state(job);
    }

    /// Removes a job whose record is deleted (purge): also frees its key,
    /// and forgets its queue when that was the queue's last job (queue
    /// names clients make up per tenant or per request would otherwise
    /// pile up here, and in the saved indexes, for good).
    pub(crate) fn remove(&mut self, job: &Job) {
        self.remove_state(job);
        if let Some(key) = &job.key {
            let queue = self.queue_mut(&job.queue);
            if queue.keys.get(key.as_str()) == Some(&job.id) {
                queue.keys.remove(key.as_str());
            }
        }
        self.forget_if_empty(&job.queue);
    }

    fn forget_if_empty(&mut self, name: &str) {
        let Some(&q) = self.by_name.get(name) else {
            return;
        };
        let queue = &self.queues[q];
        let empty = queue.pending.is_empty()
            && queue.groups.is_empty()
            && !queue.groups.has_buckets()
            && queue.keys.is_empty()
            && queue.by_status.iter().all(RoaringTreemap::is_empty);
        if !empty {
            return;
        }
        self.by_name.remove(name);
        self.queues.swap_remove(q);
        // The queue that was last now has number `q`.
        if let Some(moved) = self.queues.get(q) {
            self.by_name.insert(moved.name.clone(), q);
        }
    }

    /// Moves a job from its old record to its new one (same id, queue and
    /// key; status, times and lease may differ).
    pub(crate) fn update(&mut self, old: &Job, new: &Job) {
        self.remove_state(old);
        self.add_state(new);
    }

    fn add_state(&mut self, job: &Job) {
        if let Some(expires_at) = job
            .lease_expires_at()
            .filter(|_| job.status == Status::Running)
        {
            self.leases.insert((At::of(expires_at), job.id));
        }
        self.by_status[slot(job.status)].insert(job.id.0);
        let rule = self.group_rule(&job.queue);
        let queue = self.queue_mut(&job.queue);
        queue.by_status[slot(job.status)].insert(job.id.0);
        match (job.group.as_deref(), grouped_state(job)) {
            (Some(group), Some(state)) => {
                let diff = queue.groups.change(group, state, true, rule);
                queue.apply(diff);
            }
            _ if job.status == Status::Pending => {
                queue
                    .pending
                    .entry(Reverse(job.priority))
                    .or_default()
                    .insert((At::of(job.run_at), job.id));
            }
            _ => {}
        }
    }

    fn remove_state(&mut self, job: &Job) {
        if let Some(expires_at) = job
            .lease_expires_at()
            .filter(|_| job.status == Status::Running)
        {
            self.leases.remove(&(At::of(expires_at), job.id));
        }
        self.by_status[slot(job.status)].remove(job.id.0);
        let rule = self.group_rule(&job.queue);
        let queue = self.queue_mut(&job.queue);
        queue.by_status[slot(job.status)].remove(job.id.0);
        match (job.group.as_deref(), grouped_state(job)) {
            (Some(group), Some(state)) => {
                let diff = queue.groups.change(group, state, false, rule);
                queue.apply(diff);
            }
            _ if job.status == Status::Pending => {
                pending_remove(
                    &mut queue.pending,
                    job.priority,
                    (At::of(job.run_at), job.id),
                );
            }
            _ => {}
        }
    }

    /// What the queue's policy asks of its groups.
    fn group_rule(&self, queue: &str) -> Rule {
        self.policies.get(queue).map_or(Rule::default(), |p| Rule {
            k: p.group_max_running,
            rate: p.group_rate,
        })
    }

    /// Sets (or, empty, clears) a queue's policy, and re-sorts its grouped
    /// jobs into held and eligible.
    pub(crate) fn set_policy(&mut self, queue: &str, policy: QueuePolicy) {
        let old = self.group_rule(queue);
        self.buckets.remove(queue);
        if policy.is_empty() {
            self.policies.remove(queue);
        } else {
            self.policies.insert(queue.to_owned(), policy);
        }
        if let Some(&q) = self.by_name.get(queue) {
            let index = &mut self.queues[q];
            let new = Rule {
                k: policy.group_max_running,
                rate: policy.group_rate,
            };
            let diff = index.groups.relimit(old, new);
            index.apply(diff);
        }
    }

    /// A queue's policy (empty: none).
    pub(crate) fn policy(&self, queue: &str) -> QueuePolicy {
        self.policies.get(queue).copied().unwrap_or_default()
    }

    /// Every policy, sorted by queue.
    pub(crate) fn policies(&self) -> Vec<(String, QueuePolicy)> {
        let mut all: Vec<_> = self.policies.iter().map(|(q, p)| (q.clone(), *p)).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// How many queues have a policy.
    pub(crate) fn policies_len(&self) -> usize {
        self.policies.len()
    }

    /// Whether a take may lease a job of `queue` at `now`: its
    /// `max_running` has room and its rate limit a token.
    pub(crate) fn may_take(&self, queue: &str, now: SystemTime) -> bool {
        let Some(policy) = self.policies.get(queue) else {
            return true;
        };
        self.has_room(queue, policy) && self.next_token(queue, policy, now) <= now
    }

    /// Whether a change of status of one of `queue`'s jobs, just applied,
    /// may have let a held job go: its groups are limited (a slot or a
    /// sequence's head), or it runs one fewer than `max_running`. (A rate
    /// limit frees nothing: its tokens come back with time.)
    pub(crate) fn may_hold(&self, queue: &str) -> bool {
        let Some(policy) = self.policies.get(queue) else {
            return false;
        };
        if policy.group_max_running > 0 || policy.group_rate.is_some() {
            return true;
        }
        let running = self
            .queue(queue)
            .map_or(0, |q| q.by_status[slot(Status::Running)].len());
        policy.max_running > 0 && running + 1 >= u64::from(policy.max_running)
    }

    fn has_room(&self, queue: &str, policy: &QueuePolicy) -> bool {
        let running = self
            .queue(queue)
            .map_or(0, |q| q.by_status[slot(Status::Running)].len());
        policy.room(running)
    }

    /// When `queue`'s rate limit next has a token (`now` if it has one,
    /// or has no rate limit).
    fn next_token(&self, queue: &str, policy: &QueuePolicy, now: SystemTime) -> SystemTime {
        match (&policy.rate, self.buckets.get(queue)) {
            (Some(rate), Some(bucket)) => bucket.next_token(rate, now),
            _ => now,
        }
    }

    /// A take of a job of `queue` (and `group`) was made at `now`: it
    /// spends a token of the queue's rate limit and of its group's, if
    /// they have one.
    pub(crate) fn took(&mut self, queue: &str, group: Option<&str>, now: SystemTime) {
        let Some(policy) = self.policies.get(queue).copied() else {
            return;
        };
        if let Some(rate) = policy.rate {
            self.buckets
                .entry(queue.to_owned())
                .or_insert_with(|| Bucket::full(&rate, now))
                .spend(&rate, 1.0, now);
        }
        if let (Some(group), Some(_)) = (group, policy.group_rate) {
            let rule = self.group_rule(queue);
            let index = self.queue_mut(queue);
            let diff = index.groups.took(group, rule, now);
            index.apply(diff);
        }
    }

    /// Before a take of `queue` at `now`: its groups whose rate limit has
    /// a token again offer their jobs again.
    pub(crate) fn release(&mut self, queue: &str, now: SystemTime) {
        let rule = self.group_rule(queue);
        if rule.rate.is_none() {
            return;
        }
        if let Some(&q) = self.by_name.get(queue) {
            let index = &mut self.queues[q];
            let diff = index.groups.release(rule, now);
            index.apply(diff);
        }
    }

    /// Up to `n` ids of jobs with `status`, from id `from` on, in id order.
    pub(crate) fn with_status(&self, status: Status, from: JobId, n: usize) -> Vec<JobId> {
        first_from(&self.by_status[slot(status)], from, n)
    }

    /// Up to `n` ids of jobs of `queue`, with `status` if given, from id
    /// `from` on, in id order.
    pub(crate) fn in_queue(
        &self,
        queue: &str,
        status: Option<Status>,
        from: JobId,
        n: usize,
    ) -> Vec<JobId> {
        let Some(q) = self.queue(queue) else {
            return Vec::new();
        };
        match status {
            Some(status) => first_from(&q.by_status[slot(status)], from, n),
            // The first `n` of each status hold the first `n` of all.
            None => {
                let mut ids: Vec<JobId> = q
                    .by_status
                    .iter()
                    .flat_map(|set| first_from(set, from, n))
                    .collect();
                ids.sort_unstable();
                ids.truncate(n);
                ids
            }
        }
    }

    /// The highest id among the jobs of `queue` with `status`.
    pub(crate) fn last_in_queue(&self, queue: &str, status: Status) -> Option<JobId> {
        self.queue(queue)?.by_status[slot(status)].max().map(JobId)
    }

    /// The retained jobs holding `key`, in any queue (at most one per
    /// queue), in id order.
    pub(crate) fn keyed(&self, key: &str) -> Vec<JobId> {
        let mut ids: Vec<JobId> = self
            .queues
            .iter()
            .filter_map(|q| q.keys.get(key).copied())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The retained job holding `key` in `queue`.
    pub(crate) fn key(&self, queue: &str, key: &str) -> Option<JobId> {
        self.queue(queue)?.keys.get(key).copied()
    }

    /// The first job of `queue` in delivery order among those due at
    /// `now`: the highest priority that has a due job, its earliest.
    pub(crate) fn first_due(&self, queue: &str, now: SystemTime) -> Option<JobId> {
        self.queue(queue)?
            .pending
            .values()
            .filter_map(PackedSet::first)
            .find(|&(run_at, _)| run_at <= At::of(now))
            .map(|(_, id)| id)
    }

    /// Marks a queue paused or not.
    pub(crate) fn set_paused(&mut self, queue: &str, paused: bool) {
        if paused {
            self.paused.insert(queue.to_owned());
        } else {
            self.paused.remove(queue);
        }
    }

    /// Whether a queue is paused.
    pub(crate) fn is_paused(&self, queue: &str) -> bool {
        self.paused.contains(queue)
    }

    /// How many queues are paused.
    pub(crate) fn paused_len(&self) -> usize {
        self.paused.len()
    }

    /// The paused queues, sorted.
    pub(crate) fn paused(&self) -> Vec<String> {
        self.paused.iter().cloned().collect()
    }

    /// The earliest `run_at` among PENDING jobs of these queues, paused
    /// ones left out.
    /// A queue at its `max_running` is left out too (a job that stops
    /// RUNNING wakes its waiters); one out of rate tokens counts from when
    /// its next token comes.
    pub(crate) fn next_run_at(&self, queues: &[String], now: SystemTime) -> Option<SystemTime> {
        queues
            .iter()
            .filter(|q| !self.is_paused(q))
            .filter_map(|q| {
                let index = self.queue(q)?;
                let earliest = index.earliest();
                let Some(policy) = self.policies.get(q.as_str()) else {
                    return earliest;
                };
                if !self.has_room(q, policy) {
                    return None;
                }
                let earliest = earliest.map(|e| e.max(self.next_token(q, policy, now)));
                // A throttled group offers its jobs again at its next token
                // (all of the queue's jobs may be in throttled groups).
                let released = index.groups.next_release().map(At::time);
                match (earliest, released) {
                    (Some(e), Some(r)) => Some(e.min(r)),
                    (e, r) => e.or(r),
                }
            })
            .min()
    }

    /// The earliest lease expiry of all RUNNING jobs.
    pub(crate) fn next_lease_expiry(&self) -> Option<SystemTime> {
        self.leases
            .first()
            .map(|&(expires_at, _)| expires_at.time())
    }

    /// RUNNING jobs whose lease ran out at or before `now`, earliest first.
    pub(crate) fn expired(&self, now: SystemTime) -> Vec<JobId> {
        self.leases
            .range(..=(At::of(now), JobId(u64::MAX)))
            .map(|&(_, id)| id)
            .collect()
    }

    /// Counts of one queue (zeros if it is unknown), or of every queue that
    /// has jobs, sorted by name.
    pub(crate) fn stats(&self, queue: Option<&str>, now: SystemTime) -> Vec<QueueStats> {
        let one = |q: &QueueIndex| {
            // Held jobs wait too: the grouped ones count, eligible or not.
            let earliest = match (q.earliest(), q.groups.earliest()) {
                (Some(a), Some(b)) => Some(a.min(b.time())),
                (a, b) => a.or(b.map(At::time)),
            };
            let oldest_pending_age = earliest
                .filter(|&run_at| run_at <= now)
                .map(|run_at| now.duration_since(run_at).unwrap_or(Duration::ZERO));
            let policy = self.policy(&q.name);
            let running = q.by_status[1].len();
            let (full, dry) = (
                !policy.room(running),
                self.next_token(&q.name, &policy, now) > now,
            );
            // Counted only for a queue with a policy, and only so far.
            let most = crate::policy::HELD_COUNT_MOST;
            let grouped = if policy.is_empty() {
                Default::default()
            } else {
                let rule = Rule {
                    k: policy.group_max_running,
                    rate: policy.group_rate,
                };
                q.groups.due_counts(rule, now, most)
            };
            let held_by_queue = if !full && !dry {
                0
            } else {
                // Every due job the group limit does not hold: those in
                // the pending sets, and the grouped ones that are not.
                let due = At::of(now);
                let mut in_sets = 0u64;
                for set in q.pending.values() {
                    let left = usize::try_from(most.saturating_sub(in_sets)).unwrap_or(usize::MAX);
                    in_sets += set
                        .iter()
                        .take_while(|&(at, _)| at <= due)
                        .take(left)
                        .count() as u64;
                }
                (in_sets + grouped.due)
                    .saturating_sub(grouped.eligible)
                    .saturating_sub(grouped.held)
                    .saturating_sub(grouped.held_rate)
            };
            QueueStats {
                queue: q.name.to_string(),
                pending: q.by_status[0].len(),
                running,
                done: q.by_status[2].len(),
                failed: q.by_status[3].len(),
                oldest_pending_age,
                paused: false,
                policy: QueuePolicy::default(),
                held_max_running: if full { held_by_queue } else { 0 },
                held_group_max_running: grouped.held,
                held_rate: if full { 0 } else { held_by_queue },
                held_group_rate: grouped.held_rate,
            }
        };
        match queue {
            Some(name) => {
                vec![self.queue(name).map(one).unwrap_or_else(|| QueueStats {
                    queue: name.to_owned(),
                    ..QueueStats::default()
                })]
            }
            None => {
                let mut all: Vec<QueueStats> = self
                    .queues
                    .iter()
                    .filter(|q| q.by_status.iter().any(|ids| !ids.is_empty()))
                    .map(one)
                    .collect();
                all.sort_by(|a, b| a.queue.cmp(&b.queue));
                all
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{job::NewJob, machine};

    proptest! {
        /// Pending entries round-trip through their differences at any
        /// time and id, including older ids after newer ones and the ends
        /// of the range.
        #[test]
        fn pending_entries_read_back_as_written(
            entries in proptest::collection::vec(
                (prop_oneof![any::<u64>(), 0..1000u64, Just(u64::MAX)],
                 prop_oneof![any::<u64>(), 0..1000u64, Just(u64::MAX)]),
                0..400,
            ),
            removed in proptest::collection::vec(any::<prop::sample::Index>(), 0..100),
        ) {
            let entries: Vec<(At, JobId)> =
                entries.into_iter().map(|(at, id)| (At(at), JobId(id))).collect();
            let mut model: BTreeSet<(At, JobId)> = entries.iter().copied().collect();
            let mut set: PackedSet<(At, JobId)> = PackedSet::default();
            for &entry in &entries {
                set.insert(entry);
            }
            prop_assert!(set.iter().eq(model.iter().copied()));
            for index in removed {
                if entries.is_empty() {
                    break;
                }
                let entry = *index.get(&entries);
                prop_assert_eq!(set.remove(&entry), model.remove(&entry));
                prop_assert_eq!(set.first(), model.first().copied());
            }
            prop_assert!(set.iter().eq(model.iter().copied()));
        }
    }

    /// 100,000 jobs enqueued in order, 45 µs apart (22,000 a second), take
    /// under 5 bytes each in their chunks, where the entry is 16 (with the
    /// chunks' own ~2 bytes an entry, ~6 against ~17).
    #[test]
    fn jobs_enqueued_in_order_cost_a_few_bytes_each() {
        let start = At::of(SystemTime::now()).0;
        let mut set: PackedSet<(At, JobId)> = PackedSet::default();
        for i in 0..100_000u64 {
            set.insert((At(start + i * 45_000), JobId(1000 + i)));
        }
        let (bytes, chunks) = set.footprint();
        assert!(bytes < 5 * 100_000, "{bytes} bytes");
        assert_eq!(chunks, 100_000usize.div_ceil(64));
        assert_eq!(set.first(), Some((At(start), JobId(1000))));
    }

    fn job(id: u64, queue: &str, key: Option<&str>, at: u64) -> Job {
        prioritized(id, queue, key, at, 0)
    }

    fn prioritized(id: u64, queue: &str, key: Option<&str>, at: u64, priority: i32) -> Job {
        let new = NewJob {
            queue: queue.into(),
            kind: "k".into(),
            payload: vec![],
            key: key.map(Into::into),
            max_attempts: 3,
            delay: Duration::ZERO,
            priority,
            metadata: Default::default(),
            group: None,
            max_snoozes: crate::job::DEFAULT_MAX_SNOOZES,
            unique: Default::default(),
        };
        machine::create(
            JobId(id),
            new,
            SystemTime::UNIX_EPOCH + Duration::from_secs(at),
        )
    }

    #[test]
    fn due_order_and_keys() {
        let mut index = Index::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        index.insert(&job(2, "a", Some("x"), 10));
        index.insert(&job(1, "a", None, 20));
        index.insert(&job(3, "b", None, 200));
        assert_eq!(index.first_due("a", now), Some(JobId(2)));
        assert_eq!(index.first_due("b", now), None);
        assert_eq!(index.first_due("c", now), None);
        assert_eq!(index.key("a", "x"), Some(JobId(2)));
        assert_eq!(index.key("b", "x"), None);
        assert_eq!(
            index.next_run_at(&["b".into(), "a".into()], now),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(10))
        );
        let stats = index.stats(None, now);
        assert_eq!(stats.len(), 2);
        assert_eq!(stats[0].pending, 2);
        assert_eq!(stats[0].oldest_pending_age, Some(Duration::from_secs(90)));
        assert_eq!(stats[1].oldest_pending_age, None);
        index.remove(&job(2, "a", Some("x"), 10));
        assert_eq!(index.key("a", "x"), None);
        assert_eq!(index.first_due("a", now), Some(JobId(1)));
    }

    #[test]
    fn due_jobs_go_by_priority_then_run_at_then_id() {
        let mut index = Index::default();
        let s = |secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        // (id, due at, priority)
        let jobs = [
            prioritized(1, "a", None, 10, 0),
            prioritized(2, "a", None, 50, 5), // high, but due late
            prioritized(3, "a", None, 20, -3),
            prioritized(4, "a", None, 10, 0),
            prioritized(5, "a", None, 30, 5),
            prioritized(6, "a", None, 5, -3),
        ];
        for j in &jobs {
            index.insert(j);
        }
        // Packing the sets changes nothing but their layout.
        let mut packed = Index::default();
        for j in &jobs {
            packed.insert(j);
        }
        packed.compact();
        assert_eq!(packed, index);
        let mut index = packed;
        let mut order = Vec::new();
        while let Some(id) = index.first_due("a", s(40)) {
            order.push(id.0);
            index.remove(&jobs[id.0 as usize - 1]);
        }
        assert_eq!(order, vec![5, 1, 4, 6, 3], "job 2 is not due at 40");
        assert_eq!(index.next_run_at(&["a".into()], s(40)), Some(s(50)));
        assert_eq!(index.first_due("a", s(50)), Some(JobId(2)));
        let stats = index.stats(Some("a"), s(60));
        assert_eq!(stats[0].oldest_pending_age, Some(Duration::from_secs(10)));
        index.remove(&jobs[1]);
        // No empty sets, and with its last job gone, no queue.
        assert!(index.queue("a").is_none());
    }

    /// The index half of "a take stays O(log n)": with a sequence per
    /// group, a queue's pending sets hold one entry per group, whatever
    /// the groups hold, so a take's look at their first entries (and the
    /// take's own change) touches a few B-tree nodes. 50,000 jobs in
    /// 1,000 groups here; `limits_hold` in the end-to-end tests checks
    /// the behaviour through a real server.
    #[test]
    fn held_jobs_stay_out_of_the_pending_sets_a_take_looks_at() {
        let mut index = Index::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        let (groups, per_group) = (1_000u64, 50u64);
        for id in 1..=groups * per_group {
            let mut j = job(id, "q", None, 0);
            j.group = Some(format!("tenant-{}", id % groups));
            index.insert(&j);
        }
        let in_sets = |index: &Index| -> usize {
            let q = index.queue("q").unwrap();
            q.pending.values().map(|s| s.iter().count()).sum()
        };
        assert_eq!(
            in_sets(&index),
            (groups * per_group) as usize,
            "no policy: all"
        );
        index.set_policy(
            "q",
            QueuePolicy {
                group_max_running: 1,
                ..QueuePolicy::default()
            },
        );
        assert_eq!(in_sets(&index), groups as usize, "a sequence: its head");
        // Take the first due job: its group has nothing left to offer.
        let first = index.first_due("q", now).unwrap();
        let pending = index.queue("q").unwrap().by_status[0].contains(first.0);
        assert!(pending);
        let mut taken = job(first.0, "q", None, 0);
        taken.group = Some(format!("tenant-{}", first.0 % groups));
        let mut running = taken.clone();
        running.status = Status::Running;
        index.update(&taken, &running);
        assert_eq!(in_sets(&index), groups as usize - 1);
        let stats = &index.stats(Some("q"), now)[0];
        assert_eq!(stats.held_group_max_running, groups * per_group - groups);
        // Done: its group's next job is offered.
        let mut done = running.clone();
        done.status = Status::Done;
        index.update(&running, &done);
        assert_eq!(in_sets(&index), groups as usize);
        assert_ne!(index.first_due("q", now), Some(first));
    }

    /// A queue whose only pending jobs are in a group out of tokens still
    /// has a next time: when the group gets its next token.
    #[test]
    fn a_throttled_groups_next_token_is_the_queues_next_run() {
        let mut index = Index::default();
        index.set_policy(
            "q",
            QueuePolicy {
                group_rate: Some(crate::policy::Rate {
                    limit: 1,
                    per: Duration::from_secs(10),
                    burst: 1,
                }),
                ..QueuePolicy::default()
            },
        );
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let jobs: Vec<Job> = (1..=2)
            .map(|id| {
                let mut j = job(id, "q", None, 0);
                j.group = Some("a".into());
                j
            })
            .collect();
        jobs.iter().for_each(|j| index.insert(j));
        let first = index.first_due("q", now).expect("due");
        let mut running = jobs[0].clone();
        running.status = Status::Running;
        index.update(&jobs[0], &running);
        index.took("q", Some("a"), now);
        assert_eq!(first, JobId(1));
        assert_eq!(index.first_due("q", now), None, "throttled");
        let next = now + Duration::from_secs(10);
        assert_eq!(index.next_run_at(&["q".into()], now), Some(next));
        index.release("q", next);
        assert_eq!(index.first_due("q", next), Some(JobId(2)));
    }

    #[test]
    fn a_queue_whose_last_job_is_removed_is_forgotten() {
        let mut index = Index::default();
        let (a, b, c) = (
            job(1, "a", Some("k"), 1),
            job(2, "b", None, 1),
            job(3, "c", None, 1),
        );
        for j in [&a, &b, &c] {
            index.insert(j);
        }
        index.remove(&a);
        assert!(index.queue("a").is_none());
        // The last queue took the forgotten one's number.
        assert_eq!(index.queue("c").map(|q| &*q.name), Some("c"));
        assert_eq!(index.stats(Some("c"), SystemTime::UNIX_EPOCH).len(), 1);
        index.insert(&job(4, "a", Some("k"), 1));
        assert_eq!(index.key("a", "k"), Some(JobId(4)));
        index.remove(&b);
        index.remove(&c);
        assert_eq!(index.queues.len(), 1);
        assert!(index.queue("c").is_none());
    }

    #[test]
    fn ids_by_status_page_across_2_pow_32() {
        let mut index = Index::default();
        for id in [5, 7, (1 << 32) + 3, (1 << 32) + 9, u64::MAX] {
            index.insert(&job(id, "q", None, 1));
        }
        let ids = |from: u64, n| -> Vec<u64> {
            index
                .with_status(Status::Pending, JobId(from), n)
                .into_iter()
                .map(|id| id.0)
                .collect()
        };
        assert_eq!(
            ids(0, 10),
            vec![5, 7, (1 << 32) + 3, (1 << 32) + 9, u64::MAX]
        );
        assert_eq!(ids(6, 2), vec![7, (1 << 32) + 3]);
        // `from`'s block has nothing left: the next block's ids all count.
        assert_eq!(ids(8, 10), vec![(1 << 32) + 3, (1 << 32) + 9, u64::MAX]);
        assert_eq!(ids((1 << 32) + 4, 1), vec![(1 << 32) + 9]);
        assert_eq!(ids(u64::MAX, 10), vec![u64::MAX]);
        assert!(index.with_status(Status::Done, JobId(0), 10).is_empty());
    }

    #[test]
    fn ids_by_queue_and_key_follow_their_jobs() {
        let mut index = Index::default();
        for id in 1..=30u64 {
            let queue = ["a", "b", "c"][id as usize % 3];
            index.insert(&job(id, queue, Some(&format!("k{}", id % 10)), 1));
        }
        let ids = |index: &Index, queue, status, from: u64, n| -> Vec<u64> {
            index
                .in_queue(queue, status, JobId(from), n)
                .into_iter()
                .map(|id| id.0)
                .collect()
        };
        assert_eq!(ids(&index, "a", None, 0, 4), [3, 6, 9, 12]);
        assert_eq!(ids(&index, "a", Some(Status::Pending), 10, 3), [12, 15, 18]);
        assert!(ids(&index, "a", Some(Status::Done), 0, 10).is_empty());
        assert!(ids(&index, "nosuch", None, 0, 10).is_empty());
        // A job that moves on is listed under its new status only, and
        // in id order among the queue's others.
        let old = job(6, "a", Some("k6"), 1);
        let mut done = old.clone();
        done.status = Status::Done;
        index.update(&old, &done);
        assert_eq!(ids(&index, "a", Some(Status::Done), 0, 10), [6]);
        assert_eq!(ids(&index, "a", Some(Status::Pending), 0, 3), [3, 9, 12]);
        assert_eq!(ids(&index, "a", None, 0, 3), [3, 6, 9]);
        assert_eq!(ids(&index, "a", None, 7, 2), [9, 12]);
        // Keys: one per queue, so k1 names 11 (queue c), 21 (a) and 1 (b).
        let keyed: Vec<u64> = index.keyed("k1").into_iter().map(|id| id.0).collect();
        assert_eq!(keyed, [1, 11, 21]);
        index.remove(&done);
        assert!(ids(&index, "a", Some(Status::Done), 0, 10).is_empty());
        // Removing job 6 frees its key in queue a alone.
        assert_eq!(index.keyed("k6"), [JobId(16), JobId(26)]);
    }
}
