//! The embedded store: job records in sled, indexes in memory, durability
//! by group commit.
//!
//! Records live in the `jobs` tree, keyed by the job id as a big-endian
//! `u64` (so a range scan is id order, which is enqueue order), valued by
//! the `Job` in postcard. Job ids and lease ids both come from sled's
//! persistent id generator, which never repeats across restarts; 0 is never
//! issued.
//!
//! Every change follows one pattern: lock the state, load the record, call
//! [`machine::apply`], write the record, update the indexes, unlock — then
//! wait for the [`Flusher`]'s next round, then reply. The mutex is a std
//! one because it is never held across an `.await`, and what runs under it
//! is short: sled writes go to its in-memory log buffers (a full buffer may
//! be written out inline, and the id generator persists its counter once
//! per million ids). The fsync happens outside it, shared by every writer
//! of the round, so the mutex orders changes without serializing disk
//! waits.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, SystemTime},
};

use tokio::sync::watch;

use super::{
    flusher::Flusher, index::Index, Enqueued, Extended, FailReport, ListFilter, Page, QueueStats,
    Store,
};
use crate::{
    config::Config,
    error::{Error, Result},
    job::{Job, JobId, LeaseId, Leased, NewJob, Outcome, Status},
    machine::{self, Backoff, Event},
};

/// Records scanned per purge step, between which the mutex is free.
const PURGE_CHUNK: usize = 1024;

/// The sled store. See the module docs.
pub struct SledStore {
    // Field order matters on drop: the flusher finishes its last round
    // before the database handle goes.
    flusher: Flusher,
    db: sled::Db,
    jobs: sled::Tree,
    state: Mutex<Index>,
    backoff: Backoff,
    changes: watch::Sender<u64>,
    lease_changes: watch::Sender<u64>,
}

fn record_key(id: JobId) -> [u8; 8] {
    id.0.to_be_bytes()
}

fn encode(job: &Job) -> Result<Vec<u8>> {
    postcard::to_allocvec(job)
        .map_err(|e| Error::Corrupt(format!("cannot encode job {}: {e}", job.id)))
}

fn decode(key: &[u8], value: &[u8]) -> Result<Job> {
    let job: Job = postcard::from_bytes(value)
        .map_err(|e| Error::Corrupt(format!("undecodable record {key:?}: {e}")))?;
    if key != record_key(job.id) {
        return Err(Error::Corrupt(format!(
            "record {key:?} holds job {}",
            job.id
        )));
    }
    Ok(job)
}

/// `now + d`, or an error instead of the panic of `SystemTime + Duration`.
fn later(now: SystemTime, d: Duration, what: &str) -> Result<()> {
    match now.checked_add(d) {
        Some(_) => Ok(()),
        None => Err(Error::InvalidArgument(format!(
            "{what} of {d:?} is out of range"
        ))),
    }
}

impl SledStore {
    /// Opens (or creates) the store in `config.data` and rebuilds the
    /// in-memory indexes from the records.
    ///
    /// # Errors
    /// [`Error::Storage`] if sled cannot open the folder, [`Error::Corrupt`]
    /// if a record does not decode or the flusher cannot start.
    pub fn open(config: &Config) -> Result<SledStore> {
        std::fs::create_dir_all(&config.data)
            .map_err(|e| Error::Corrupt(format!("cannot create {}: {e}", config.data.display())))?;
        let db = sled::Config::new()
            .path(&config.data)
            .cache_capacity(config.cache_bytes)
            // Our flusher makes every acknowledged write durable; sled's own
            // periodic fsync would only compete with it.
            .flush_every_ms(None)
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let jobs = db.open_tree("jobs")?;
        let mut index = Index::default();
        for record in jobs.iter() {
            let (key, value) = record?;
            index.insert(&decode(&key, &value)?);
        }
        let flusher = Flusher::start(db.clone(), &config.data)?;
        Ok(SledStore {
            flusher,
            db,
            jobs,
            state: Mutex::new(index),
            backoff: config.backoff(),
            changes: watch::Sender::new(0),
            lease_changes: watch::Sender::new(0),
        })
    }

    /// How many group-commit rounds (flush + fsync) have run; for tests and
    /// benchmarks.
    pub fn flush_rounds(&self) -> u64 {
        self.flusher.rounds()
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        // Every update of the index happens after its record is written and
        // cannot panic halfway, so a poisoned lock still guards a usable
        // index.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A fresh id: never 0, never reused, increasing.
    fn next_id(&self) -> Result<u64> {
        loop {
            let id = self.db.generate_id()?;
            if id != 0 {
                return Ok(id);
            }
        }
    }

    fn load(&self, id: JobId) -> Result<Job> {
        let key = record_key(id);
        match self.jobs.get(key)? {
            Some(value) => decode(&key, &value),
            None => Err(Error::NotFound(id)),
        }
    }

    /// Loads a job the index says exists.
    fn load_indexed(&self, id: JobId) -> Result<Job> {
        self.load(id).map_err(|e| match e {
            Error::NotFound(id) => Error::Corrupt(format!("job {id} is indexed but has no record")),
            e => e,
        })
    }

    fn bump_changes(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Tells the reaper when the earliest lease expiry moved earlier.
    fn bump_leases_if_earlier(&self, before: Option<SystemTime>, after: Option<SystemTime>) {
        if let Some(after) = after {
            if before.is_none_or(|before| after < before) {
                self.lease_changes.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Loads, applies and writes one job; the indexes follow.
    fn transition(&self, id: JobId, event: Event, now: SystemTime) -> Result<Job> {
        let mut index = self.lock();
        let old = self.load(id)?;
        let new = machine::apply(old.clone(), event, now)?;
        self.jobs.insert(record_key(id), encode(&new)?)?;
        index.update(&old, &new);
        Ok(new)
    }

    fn enqueue_locked(&self, new: NewJob, now: SystemTime) -> Result<Enqueued> {
        later(now, new.delay, "delay")?;
        let mut index = self.lock();
        if let Some(existing) = new
            .key
            .as_deref()
            .and_then(|key| index.key(&new.queue, key))
        {
            return Ok(Enqueued {
                job: self.load_indexed(existing)?,
                created: false,
            });
        }
        let job = machine::create(JobId(self.next_id()?), new, now);
        self.jobs.insert(record_key(job.id), encode(&job)?)?;
        index.insert(&job);
        Ok(Enqueued { job, created: true })
    }

    fn enqueue_batch_locked(&self, batch: Vec<NewJob>, now: SystemTime) -> Result<Vec<Enqueued>> {
        for new in &batch {
            later(now, new.delay, "delay")?;
        }
        let mut index = self.lock();
        let mut out: Vec<Enqueued> = Vec::with_capacity(batch.len());
        // (queue, key) -> position in `out` of the batch's first job with it.
        let mut seen: HashMap<(String, String), usize> = HashMap::new();
        let mut writes = sled::Batch::default();
        for new in batch {
            if let Some(key) = &new.key {
                if let Some(&at) = seen.get(&(new.queue.clone(), key.clone())) {
                    out.push(Enqueued {
                        job: out[at].job.clone(),
                        created: false,
                    });
                    continue;
                }
                if let Some(existing) = index.key(&new.queue, key) {
                    out.push(Enqueued {
                        job: self.load_indexed(existing)?,
                        created: false,
                    });
                    continue;
                }
                seen.insert((new.queue.clone(), key.clone()), out.len());
            }
            let job = machine::create(JobId(self.next_id()?), new, now);
            writes.insert(&record_key(job.id), encode(&job)?);
            out.push(Enqueued { job, created: true });
        }
        self.jobs.apply_batch(writes)?;
        for enqueued in out.iter().filter(|e| e.created) {
            index.insert(&enqueued.job);
        }
        Ok(out)
    }

    fn take_locked(
        &self,
        queues: &[String],
        worker_id: &str,
        lease: Duration,
        now: SystemTime,
    ) -> Result<Option<Leased>> {
        later(now, lease, "lease")?;
        let mut index = self.lock();
        let Some(id) = queues.iter().find_map(|q| index.first_due(q, now)) else {
            return Ok(None);
        };
        let before = index.next_lease_expiry();
        let old = self.load_indexed(id)?;
        let event = Event::Take {
            lease_id: LeaseId(self.next_id()?),
            worker_id: worker_id.to_owned(),
            lease,
        };
        let new = machine::apply(old.clone(), event, now)?;
        self.jobs.insert(record_key(id), encode(&new)?)?;
        index.update(&old, &new);
        let after = index.next_lease_expiry();
        drop(index);
        self.bump_leases_if_earlier(before, after);
        Leased::of(new)
            .map(Some)
            .ok_or_else(|| Error::Corrupt(format!("job {id} was taken without a lease")))
    }

    fn extend_locked(
        &self,
        leases: &[(JobId, LeaseId)],
        extend_by: Option<Duration>,
        now: SystemTime,
    ) -> Result<Vec<Extended>> {
        if let Some(d) = extend_by {
            later(now, d, "extension")?;
        }
        let mut index = self.lock();
        let before = index.next_lease_expiry();
        // Jobs changed by this call so far: a job named twice sees its first
        // extension. (old record, new record).
        let mut changed: HashMap<JobId, (Job, Job)> = HashMap::new();
        let mut out = Vec::with_capacity(leases.len());
        for &(id, lease_id) in leases {
            let current = match changed.get(&id) {
                Some((_, new)) => new.clone(),
                None => match self.load(id) {
                    Ok(job) => job,
                    Err(Error::NotFound(id)) => {
                        out.push(Err(Error::NotFound(id)));
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            if let Some(d) = current
                .lease
                .as_ref()
                .filter(|_| extend_by.is_none())
                .map(|l| l.duration)
            {
                later(now, d, "extension")?;
            }
            match machine::apply(
                current.clone(),
                Event::Extend {
                    lease_id,
                    extend_by,
                },
                now,
            ) {
                Ok(new) => {
                    changed
                        .entry(id)
                        .or_insert_with(|| (current, new.clone()))
                        .1 = new.clone();
                    out.push(Ok(new));
                }
                Err(e) => out.push(Err(e.into())),
            }
        }
        if changed.is_empty() {
            return Ok(out);
        }
        let mut writes = sled::Batch::default();
        for (id, (_, new)) in &changed {
            writes.insert(&record_key(*id), encode(new)?);
        }
        self.jobs.apply_batch(writes)?;
        for (old, new) in changed.values() {
            index.update(old, new);
        }
        let after = index.next_lease_expiry();
        drop(index);
        self.bump_leases_if_earlier(before, after);
        Ok(out)
    }

    fn reclaim_expired_locked(&self, now: SystemTime) -> Result<Vec<(Job, LeaseId)>> {
        let mut index = self.lock();
        let mut changed = Vec::new();
        let mut writes = sled::Batch::default();
        for id in index.expired(now) {
            let old = self.load_indexed(id)?;
            let Some(lease_id) = old.lease_id() else {
                return Err(Error::Corrupt(format!(
                    "job {id} is indexed as leased but holds no lease"
                )));
            };
            let new = machine::apply(
                old.clone(),
                Event::Reclaim {
                    lease_id,
                    outcome: Outcome::LeaseExpired,
                },
                now,
            )?;
            writes.insert(&record_key(id), encode(&new)?);
            changed.push((old, new, lease_id));
        }
        if changed.is_empty() {
            return Ok(Vec::new());
        }
        self.jobs.apply_batch(writes)?;
        Ok(changed
            .into_iter()
            .map(|(old, new, lease_id)| {
                index.update(&old, &new);
                (new, lease_id)
            })
            .collect())
    }

    /// Whether a DONE or FAILED job is old enough to purge.
    fn purgeable(job: &Job, done_before: SystemTime, failed_before: SystemTime) -> bool {
        match (job.status, job.finished_at) {
            (Status::Done, Some(at)) => at < done_before,
            (Status::Failed, Some(at)) => at < failed_before,
            _ => false,
        }
    }

    /// One purge step: scans up to [`PURGE_CHUNK`] records after `after`
    /// without the lock, then deletes the purgeable ones under it,
    /// re-checking each (it may have been retried meanwhile). Returns the
    /// number deleted and where the next step starts.
    fn purge_chunk(
        &self,
        after: Option<JobId>,
        done_before: SystemTime,
        failed_before: SystemTime,
    ) -> Result<(u64, Option<JobId>)> {
        let start = after.map_or(Some(0), |id| id.0.checked_add(1));
        let Some(start) = start else {
            return Ok((0, None));
        };
        let mut candidates = Vec::new();
        let mut last = None;
        for record in self.jobs.range(start.to_be_bytes()..).take(PURGE_CHUNK) {
            let (key, value) = record?;
            let job = decode(&key, &value)?;
            last = Some(job.id);
            if Self::purgeable(&job, done_before, failed_before) {
                candidates.push(job.id);
            }
        }
        if candidates.is_empty() {
            return Ok((0, last));
        }
        let mut index = self.lock();
        let mut writes = sled::Batch::default();
        let mut gone = Vec::new();
        for id in candidates {
            match self.load(id) {
                Ok(job) if Self::purgeable(&job, done_before, failed_before) => {
                    writes.remove(&record_key(id));
                    gone.push(job);
                }
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.jobs.apply_batch(writes)?;
        for job in &gone {
            index.remove(job);
        }
        Ok((gone.len() as u64, last))
    }

    fn list_scan(&self, filter: &ListFilter) -> Result<Page> {
        let limit = filter.limit.max(1);
        let Some(start) = filter.after.map_or(Some(0), |id| id.0.checked_add(1)) else {
            return Ok(Page::default());
        };
        let matches = |job: &Job| {
            filter.queue.as_ref().is_none_or(|q| *q == job.queue)
                && filter.status.is_none_or(|s| s == job.status)
                && filter
                    .key
                    .as_ref()
                    .is_none_or(|k| job.key.as_ref() == Some(k))
        };
        // With queue and key given, at most one retained job matches.
        if let (Some(queue), Some(key)) = (&filter.queue, &filter.key) {
            let id = self.lock().key(queue, key);
            let jobs = match id.filter(|id| id.0 >= start) {
                Some(id) => match self.load(id) {
                    Ok(job) if matches(&job) => vec![job],
                    Ok(_) | Err(Error::NotFound(_)) => vec![],
                    Err(e) => return Err(e),
                },
                None => vec![],
            };
            return Ok(Page { jobs, next: None });
        }
        let mut jobs = Vec::new();
        let mut records = self.jobs.range(start.to_be_bytes()..);
        for record in records.by_ref() {
            let (key, value) = record?;
            let job = decode(&key, &value)?;
            if matches(&job) {
                jobs.push(job);
                if jobs.len() == limit {
                    break;
                }
            }
        }
        // A full page may have a successor; an exhausted scan has none.
        let next = match jobs.last() {
            Some(last) if jobs.len() == limit && records.next().is_some() => Some(last.id),
            _ => None,
        };
        Ok(Page { jobs, next })
    }
}

impl Store for SledStore {
    async fn enqueue(&self, new: NewJob, now: SystemTime) -> Result<Enqueued> {
        let enqueued = self.enqueue_locked(new, now)?;
        // Also for an existing job: its own enqueue may still be in flight.
        self.flusher.durable().await?;
        // Waiters wake once the job is durable: workers are pushed jobs
        // whose enqueue was acknowledged (or is being, in this instant).
        if enqueued.created {
            self.bump_changes();
        }
        Ok(enqueued)
    }

    async fn enqueue_batch(&self, batch: Vec<NewJob>, now: SystemTime) -> Result<Vec<Enqueued>> {
        let out = self.enqueue_batch_locked(batch, now)?;
        self.flusher.durable().await?;
        if out.iter().any(|e| e.created) {
            self.bump_changes();
        }
        Ok(out)
    }

    async fn take(
        &self,
        queues: &[String],
        worker_id: &str,
        lease: Duration,
        now: SystemTime,
    ) -> Result<Option<Leased>> {
        let leased = self.take_locked(queues, worker_id, lease, now)?;
        if leased.is_some() {
            // The lease reaches the disk with the round asked for here
            // (about one fsync later), but the job is handed out without
            // waiting for it. A crash in that window only loses the take:
            // the job is PENDING again after the restart and is delivered
            // again, which at-least-once allows, and the first holder's ack
            // is refused as stale. Every ack waits for a round that covers
            // its take (sled's log is sequential), so a DONE job never
            // comes back. Not waiting halves the cost of every delivery.
            self.flusher.request();
        }
        Ok(leased)
    }

    async fn ack(&self, id: JobId, lease_id: LeaseId, now: SystemTime) -> Result<Job> {
        let job = self.transition(id, Event::Ack { lease_id }, now)?;
        self.flusher.durable().await?;
        Ok(job)
    }

    async fn fail(&self, id: JobId, report: FailReport, now: SystemTime) -> Result<Job> {
        if let Some(d) = report.retry_delay {
            later(now, d, "retry delay")?;
        }
        let event = Event::Fail {
            lease_id: report.lease_id,
            error: report.error,
            retry_delay: report.retry_delay,
            fatal: report.fatal,
            backoff: self.backoff,
            jitter: rand::random::<f64>(),
        };
        let job = self.transition(id, event, now)?;
        self.bump_changes();
        self.flusher.durable().await?;
        Ok(job)
    }

    async fn retry(&self, id: JobId, now: SystemTime) -> Result<Job> {
        let job = self.transition(id, Event::Retry, now)?;
        self.bump_changes();
        self.flusher.durable().await?;
        Ok(job)
    }

    async fn extend(
        &self,
        leases: &[(JobId, LeaseId)],
        extend_by: Option<Duration>,
        now: SystemTime,
    ) -> Result<Vec<Extended>> {
        let out = self.extend_locked(leases, extend_by, now)?;
        if out.iter().any(Result::is_ok) {
            self.flusher.durable().await?;
        }
        Ok(out)
    }

    async fn reclaim(
        &self,
        id: JobId,
        lease_id: LeaseId,
        outcome: Outcome,
        now: SystemTime,
    ) -> Result<Job> {
        let job = self.transition(id, Event::Reclaim { lease_id, outcome }, now)?;
        self.bump_changes();
        self.flusher.durable().await?;
        Ok(job)
    }

    async fn reclaim_expired(&self, now: SystemTime) -> Result<Vec<(Job, LeaseId)>> {
        let reclaimed = self.reclaim_expired_locked(now)?;
        if reclaimed.is_empty() {
            return Ok(reclaimed);
        }
        self.bump_changes();
        self.flusher.durable().await?;
        Ok(reclaimed)
    }

    async fn purge(&self, done_before: SystemTime, failed_before: SystemTime) -> Result<u64> {
        let mut purged = 0;
        let mut after = None;
        loop {
            let (n, last) = self.purge_chunk(after, done_before, failed_before)?;
            purged += n;
            match last {
                Some(last) => after = Some(last),
                None => break,
            }
            // Let other tasks run between chunks of a long scan.
            tokio::task::yield_now().await;
        }
        if purged > 0 {
            self.flusher.durable().await?;
        }
        Ok(purged)
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        self.load(id)
    }

    async fn list(&self, filter: ListFilter) -> Result<Page> {
        self.list_scan(&filter)
    }

    async fn stats(&self, queue: Option<&str>, now: SystemTime) -> Result<Vec<QueueStats>> {
        Ok(self.lock().stats(queue, now))
    }

    fn next_run_at(&self, queues: &[String]) -> Option<SystemTime> {
        self.lock().next_run_at(queues)
    }

    fn next_lease_expiry(&self) -> Option<SystemTime> {
        self.lock().next_lease_expiry()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn lease_changes(&self) -> watch::Receiver<u64> {
        self.lease_changes.subscribe()
    }

    async fn flush(&self) -> Result<()> {
        self.flusher.durable().await
    }
}
