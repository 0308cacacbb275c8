//! The rules every store follows that do not depend on the storage engine:
//! pure functions, so a second backend does not copy them.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::QueueStats;
use crate::{
    error::{Error, Result},
    job::{Job, JobId, KeyScope, LeaseId, NewJob, Status, Uniqueness},
    policy::QueuePolicy,
};

/// Checks that `now + d` is representable, so no store ever panics in
/// `SystemTime + Duration`; the error names the request field.
///
/// # Errors
/// [`Error::InvalidArgument`] when it overflows.
pub fn later(now: SystemTime, d: Duration, what: &str) -> Result<SystemTime> {
    now.checked_add(d)
        .ok_or_else(|| Error::InvalidArgument(format!("{what} of {d:?} is out of range")))
}

/// A fresh lease id: 64 bits from the OS-seeded thread RNG, never 0.
/// Knowing a job id (or any other lease id) does not help guess it.
pub fn fresh_lease_id() -> LeaseId {
    loop {
        let id = rand::random::<u64>();
        if id != 0 {
            return LeaseId(id);
        }
    }
}

/// The backoff jitter, uniform in `[0, 1]`: drawn here so the state
/// machine stays pure.
pub fn jitter() -> f64 {
    rand::random::<f64>()
}

/// Why a purge of RUNNING jobs is refused (by the store and by the RPC's
/// validation alike).
pub const RUNNING_PURGE: &str = "status RUNNING cannot be purged: a worker holds each RUNNING job; cancel it (CancelJob), or purge PENDING, DONE or FAILED jobs";

/// Which jobs a purge deletes: the retention reaper's (finished jobs of
/// every queue) or an operator's PurgeJobs (one queue: its finished jobs
/// of one or both statuses, or its PENDING jobs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// DONE jobs finished before this are purged.
    pub done_before: SystemTime,
    /// FAILED jobs finished before this are purged.
    pub failed_before: SystemTime,
    /// Only jobs of this queue; `None`: every queue.
    pub queue: Option<String>,
    /// PENDING jobs (due or delayed) with an id up to this one are purged
    /// too: the queue's PENDING jobs when the purge began, none enqueued
    /// after it. `None`: no PENDING job. Never a RUNNING job.
    pub pending_through: Option<JobId>,
}

/// How far past the later cutoff a purge's walk in id order goes before
/// it stops (see [`Retention::past_every_cutoff`]).
const ENQUEUE_ORDER_SLACK: Duration = Duration::from_secs(60);

impl Retention {
    /// Whether a walk of finished jobs in id order may stop at `job`: it
    /// was enqueued well after both cutoffs, so it finished after them (a
    /// job finishes after its enqueue), and so did every job after it, as
    /// ids are handed out in enqueue order. The slack covers enqueues whose
    /// clock read and id came in a different order, and small clock steps
    /// back; a job it misses waits for the next pass (after a clock that
    /// ran ahead by more, the jobs enqueued then hold the walk back, and
    /// purging waits as long as the clock was ahead). A pass then reads the
    /// purgeable jobs, not every retained one.
    /// A walk of PENDING jobs stops past the last id it may purge.
    pub fn past_every_cutoff(&self, job: &Job) -> bool {
        match self.pending_through {
            Some(last) => job.id > last,
            None => self.enqueued_past_every_cutoff(job.enqueued_at),
        }
    }

    /// [`Retention::past_every_cutoff`] for a job enqueued at `enqueued_at`.
    pub fn enqueued_past_every_cutoff(&self, enqueued_at: SystemTime) -> bool {
        let cutoff = self.done_before.max(self.failed_before);
        cutoff
            .checked_add(ENQUEUE_ORDER_SLACK)
            .is_some_and(|late| enqueued_at > late)
    }

    /// Whether a job is to be purged: finished long enough ago, or PENDING
    /// (one queue's, not enqueued after the purge began) when the purge
    /// names PENDING jobs. Never a RUNNING job.
    pub fn purgeable(&self, job: &Job) -> bool {
        if self.queue.as_ref().is_some_and(|q| *q != job.queue) {
            return false;
        }
        match (job.status, job.finished_at) {
            (Status::Done, Some(at)) => at < self.done_before,
            (Status::Failed, Some(at)) => at < self.failed_before,
            (Status::Pending, _) => self.pending_through.is_some_and(|last| job.id <= last),
            _ => false,
        }
    }
}

/// Sets [`QueueStats::policy`] from the policies (in any order), and lists
/// a queue with a policy and no jobs too (when it matches `only`). `stats`
/// ends sorted by queue.
pub fn mark_policies(
    stats: &mut Vec<QueueStats>,
    policies: &[(String, QueuePolicy)],
    only: Option<&str>,
) {
    for (queue, policy) in policies {
        if only.is_some_and(|q| q != queue) {
            continue;
        }
        match stats.iter_mut().find(|s| &s.queue == queue) {
            Some(s) => s.policy = *policy,
            None => stats.push(QueueStats {
                queue: queue.clone(),
                policy: *policy,
                ..QueueStats::default()
            }),
        }
    }
    stats.sort_by(|a, b| a.queue.cmp(&b.queue));
}

/// Sets [`QueueStats::paused`] from the paused queues (in any order), and
/// lists a paused queue that has no jobs too (when it matches `only`), so
/// an operator sees every pause. `stats` ends sorted by queue.
pub fn mark_paused(stats: &mut Vec<QueueStats>, paused: &[String], only: Option<&str>) {
    for s in stats.iter_mut() {
        s.paused = paused.contains(&s.queue);
    }
    for queue in paused {
        if only.is_some_and(|q| q != queue) || stats.iter().any(|s| &s.queue == queue) {
            continue;
        }
        stats.push(QueueStats {
            queue: queue.clone(),
            paused: true,
            ..QueueStats::default()
        });
    }
    stats.sort_by(|a, b| a.queue.cmp(&b.queue));
}

/// What an enqueue whose key a job holds already does with that job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyConflict {
    /// The job keeps the key and is returned unchanged.
    Keep,
    /// The job is PENDING and takes the enqueue's payload, metadata and due
    /// time ([`crate::machine::Event::Replace`]).
    Replace,
    /// The job no longer holds the key under the enqueue's rules: it loses
    /// it ([`crate::machine::Event::FreeKey`]) to the enqueue's new job.
    TakeOver,
}

impl KeyConflict {
    /// The change it makes to the holder ([`KeyConflict::Keep`]: none), a
    /// replace giving it the enqueue's `payload`, `metadata` and `delay`.
    pub fn event(
        self,
        payload: &[u8],
        metadata: &crate::job::Metadata,
        delay: Duration,
    ) -> Option<crate::machine::Event> {
        match self {
            KeyConflict::Keep => None,
            KeyConflict::Replace => Some(crate::machine::Event::Replace {
                payload: payload.to_vec(),
                metadata: metadata.clone(),
                delay,
            }),
            KeyConflict::TakeOver => Some(crate::machine::Event::FreeKey),
        }
    }
}

/// Judges the job that has an enqueue's key by that enqueue's rules
/// (docs/src/shaping.md, "Uniqueness"): it holds the key while retained
/// (or, with [`KeyScope::Active`], while PENDING or RUNNING) and, with
/// `unique_for`, until that long after its enqueue. A holder is replaced
/// only when PENDING; a RUNNING one's worker has its payload already, so a
/// replacing enqueue makes a successor, which takes the key over (the
/// running job goes on without it).
pub fn key_conflict(unique: &Uniqueness, holder: &Job, now: SystemTime) -> KeyConflict {
    let active = matches!(holder.status, Status::Pending | Status::Running);
    let in_scope = unique.scope == KeyScope::Retained || active;
    let in_window = unique.unique_for.is_none_or(|d| {
        holder
            .enqueued_at
            .checked_add(d)
            .is_none_or(|end| now < end)
    });
    if !(in_scope && in_window) {
        return KeyConflict::TakeOver;
    }
    match (unique.replace, holder.status) {
        (true, Status::Pending) => KeyConflict::Replace,
        (true, Status::Running) => KeyConflict::TakeOver,
        _ => KeyConflict::Keep,
    }
}

/// A batch with its keys de-duplicated: the jobs to hand to the backend,
/// and for each entry of the original batch, which of them it maps to and
/// whether it is that job's first occurrence.
#[derive(Debug)]
pub struct Deduped {
    /// The distinct jobs, in batch order of their first occurrence.
    pub unique: Vec<NewJob>,
    /// Per original entry: the index into `unique` and what it was.
    pub slots: Vec<(usize, Occurrence)>,
}

/// What an entry of a batch was to the job it maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Occurrence {
    /// Its first entry: the job's own result.
    First,
    /// A later entry of the same (queue, key): the same job, not created.
    Again,
    /// A later entry with `on_conflict = REPLACE`: its payload, metadata
    /// and delay replaced the earlier entry's.
    Replaced,
}

/// De-duplicates a batch by (queue, key): a later entry with a key seen
/// earlier in the batch gets the earlier one's job (`created = false`);
/// one with `on_conflict = REPLACE` gives that job its payload, metadata
/// and delay (and replaces a PENDING job that holds the key in the
/// store). Entries of one key agree on its scope and window
/// (`crate::validate::batch`), so this is what enqueueing them one after
/// the other would do, but for the outcome: every entry of the key reports
/// the one enqueue they make.
pub fn dedupe(batch: Vec<NewJob>) -> Deduped {
    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    let mut unique: Vec<NewJob> = Vec::with_capacity(batch.len());
    let mut slots = Vec::with_capacity(batch.len());
    for new in batch {
        if let Some(key) = &new.key {
            let id = (new.queue.clone(), key.clone());
            if let Some(&at) = seen.get(&id) {
                let first = &mut unique[at];
                if new.unique.replace {
                    first.payload = new.payload;
                    first.metadata = new.metadata;
                    first.delay = new.delay;
                    first.unique.replace = true;
                    slots.push((at, Occurrence::Replaced));
                } else {
                    slots.push((at, Occurrence::Again));
                }
                continue;
            }
            seen.insert(id, unique.len());
        }
        slots.push((unique.len(), Occurrence::First));
        unique.push(new);
    }
    Deduped { unique, slots }
}

/// Milliseconds since the epoch, saturating (for the reaper's timer).
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(queue: &str, key: Option<&str>) -> NewJob {
        NewJob {
            queue: queue.into(),
            kind: "k".into(),
            payload: vec![],
            key: key.map(Into::into),
            max_attempts: 3,
            delay: Duration::ZERO,
            priority: 0,
            metadata: Default::default(),
            group: None,
            max_snoozes: crate::job::DEFAULT_MAX_SNOOZES,
            unique: Default::default(),
        }
    }

    #[test]
    fn a_purge_walk_stops_only_past_both_cutoffs_and_the_slack() {
        let t = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let retention = Retention {
            done_before: t(10_000),
            failed_before: t(5_000),
            queue: None,
            pending_through: None,
        };
        let enqueued = |at| crate::machine::create(crate::job::JobId(1), new("q", None), t(at));
        // The later cutoff counts (a DONE job enqueued at 9,000 may be
        // purgeable), and the slack past it.
        assert!(!retention.past_every_cutoff(&enqueued(9_000)));
        assert!(!retention.past_every_cutoff(&enqueued(10_000)));
        assert!(!retention.past_every_cutoff(&enqueued(10_060)));
        assert!(retention.past_every_cutoff(&enqueued(10_061)));
        // An operator's purge of everything finished so far never stops
        // early.
        let all = Retention {
            done_before: SystemTime::now(),
            failed_before: UNIX_EPOCH,
            queue: Some("q".into()),
            pending_through: None,
        };
        assert!(!all.past_every_cutoff(&enqueued(10_061)));
        // A purge of PENDING jobs walks up to the last id it may purge,
        // whenever they were enqueued.
        let pending = Retention {
            done_before: UNIX_EPOCH,
            failed_before: UNIX_EPOCH,
            queue: Some("q".into()),
            pending_through: Some(crate::job::JobId(5)),
        };
        let job = |id| crate::machine::create(crate::job::JobId(id), new("q", None), t(1));
        assert!(!pending.past_every_cutoff(&job(5)));
        assert!(pending.past_every_cutoff(&job(6)));
        assert!(pending.purgeable(&job(5)));
        assert!(
            !pending.purgeable(&job(6)),
            "enqueued after the purge began"
        );
        assert!(
            !all.purgeable(&job(1)),
            "a purge of finished jobs keeps PENDING ones"
        );
    }

    #[test]
    fn dedupe_maps_repeated_keys_to_their_first_entry_per_queue() {
        let d = dedupe(vec![
            new("a", Some("k1")),
            new("a", None),
            new("a", Some("k1")),
            new("b", Some("k1")),
            new("a", None),
        ]);
        assert_eq!(d.unique.len(), 4);
        use Occurrence::{Again, First};
        assert_eq!(
            d.slots,
            vec![(0, First), (1, First), (0, Again), (2, First), (3, First)]
        );
        // A later REPLACE entry gives the first its payload.
        let replacing = NewJob {
            payload: b"v2".to_vec(),
            unique: Uniqueness {
                replace: true,
                ..Uniqueness::default()
            },
            ..new("a", Some("k1"))
        };
        let d = dedupe(vec![new("a", Some("k1")), replacing]);
        assert_eq!(d.slots, vec![(0, First), (0, Occurrence::Replaced)]);
        assert_eq!(d.unique[0].payload, b"v2");
        assert!(d.unique[0].unique.replace);
    }

    #[test]
    fn a_key_is_held_by_the_enqueues_rules() {
        let t = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let holder = |status| {
            let mut job = crate::machine::create(JobId(1), new("a", Some("k")), t(100));
            job.status = status;
            job
        };
        let rules = |scope, replace, unique_for: Option<u64>| Uniqueness {
            scope,
            replace,
            unique_for: unique_for.map(Duration::from_secs),
        };
        use KeyConflict::{Keep, Replace, TakeOver};
        use Status::{Done, Failed, Pending, Running};
        for (unique, status, now, expected) in [
            // Retained (the default): held by any retained job.
            (rules(KeyScope::Retained, false, None), Done, 999, Keep),
            (rules(KeyScope::Retained, false, None), Pending, 999, Keep),
            // Active: a finished job frees it.
            (rules(KeyScope::Active, false, None), Running, 999, Keep),
            (rules(KeyScope::Active, false, None), Done, 999, TakeOver),
            (rules(KeyScope::Active, false, None), Failed, 999, TakeOver),
            // unique_for: held that long after the enqueue, whatever the state.
            (
                rules(KeyScope::Retained, false, Some(60)),
                Pending,
                159,
                Keep,
            ),
            (
                rules(KeyScope::Retained, false, Some(60)),
                Pending,
                160,
                TakeOver,
            ),
            (
                rules(KeyScope::Active, false, Some(60)),
                Done,
                110,
                TakeOver,
            ),
            // Replace: a PENDING holder; a RUNNING one gets a successor.
            (rules(KeyScope::Retained, true, None), Pending, 999, Replace),
            (
                rules(KeyScope::Retained, true, None),
                Running,
                999,
                TakeOver,
            ),
            (rules(KeyScope::Retained, true, None), Done, 999, Keep),
            (rules(KeyScope::Active, true, None), Done, 999, TakeOver),
            (
                rules(KeyScope::Retained, true, Some(u64::MAX)),
                Pending,
                999,
                Replace,
            ),
        ] {
            assert_eq!(
                key_conflict(&unique, &holder(status), t(now)),
                expected,
                "{unique:?} {status:?} at {now}"
            );
        }
    }

    #[test]
    fn later_refuses_overflow_instead_of_panicking() {
        assert!(later(SystemTime::now(), Duration::MAX, "delay").is_err());
        assert!(later(SystemTime::now(), Duration::from_secs(1), "delay").is_ok());
    }

    #[test]
    fn lease_ids_are_random_and_never_zero() {
        let a = fresh_lease_id();
        let b = fresh_lease_id();
        assert_ne!(a, b);
        assert_ne!(a.0, 0);
    }
}
