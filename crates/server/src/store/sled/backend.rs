//! [`Backend`] for [`Sled`]: the store's operations, each a call of the
//! write path or a read of the indexes, made durable by the flusher.

use std::{collections::HashSet, future::Future, time::SystemTime};

use super::{record::Payload, record_key, schedules, write::Unread, Sled, SledError};
use crate::{
    error::Result,
    job::{Job, JobId, LeaseId, NewJob, Status},
    machine::{self, Event},
    policy::QueuePolicy,
    schedule::Schedule,
    store::{
        rules::Retention, Alone, Backend, Change, Enqueued, ListFilter, Page, QueueStats, Remote,
    },
};

impl Backend for Sled {
    type Cluster = Alone;

    fn insert_waits(&self, batch: &[NewJob]) -> bool {
        batch.iter().any(|new| self.files.wants(new.payload.len()))
    }

    async fn insert(&self, mut batch: Vec<NewJob>, now: SystemTime) -> Result<Vec<Enqueued>> {
        let files = self.write_files(&mut batch).await?;
        let enqueued = self.insert_locked(batch, &files, now)?;
        // A file whose job was not created (its key was taken meanwhile)
        // has no record: remove it now. (After an error the files stay:
        // orphans, removed by the next start.)
        if files.iter().any(Option::is_some) {
            let created: HashSet<JobId> = enqueued
                .iter()
                .filter(|e| e.created)
                .map(|e| e.job.id)
                .collect();
            self.files.remove(
                files
                    .into_iter()
                    .flatten()
                    .filter(|id| !created.contains(id)),
            );
        }
        Ok(enqueued)
    }

    async fn take(
        &self,
        queues: &[String],
        take: Event,
        _streamed: bool,
        now: SystemTime,
    ) -> Result<Option<Change>> {
        match self.take_locked(queues, take, now)? {
            Some((mut change, Some(Unread { file, len }))) => {
                let stored = self.read_file(change.new.id, file).await?;
                self.place(&mut change.new, stored, len)?;
                Ok(Some(change))
            }
            Some((change, None)) => Ok(Some(change)),
            None => Ok(None),
        }
    }

    async fn apply(
        &self,
        events: Vec<(JobId, Event)>,
        now: SystemTime,
    ) -> Result<Vec<Result<Change>>> {
        let mut index = self.lock();
        self.apply_locked(&mut index, events, now)
    }

    async fn set_paused(&self, queue: &str, paused: bool, most: usize) -> Result<()> {
        let mut index = self.lock();
        if paused {
            crate::validate::pause_room(index.paused_len(), index.is_paused(queue), most)?;
            self.paused_tree
                .insert(queue.as_bytes(), &[])
                .map_err(SledError::from)?;
        } else {
            self.paused_tree
                .remove(queue.as_bytes())
                .map_err(SledError::from)?;
        }
        index.set_paused(queue, paused);
        Ok(())
    }

    async fn paused(&self) -> Result<Vec<String>> {
        Ok(self.lock().paused())
    }

    async fn set_policy(&self, queue: &str, policy: QueuePolicy, most: usize) -> Result<()> {
        let mut index = self.lock();
        if policy.is_empty() {
            self.policies_tree
                .remove(queue.as_bytes())
                .map_err(SledError::from)?;
        } else {
            let had = !index.policy(queue).is_empty();
            crate::validate::policy_room(index.policies_len(), had, most)?;
            let value = postcard::to_allocvec(&policy)
                .map_err(|e| crate::Error::Corrupt(format!("cannot encode a policy: {e}")))?;
            self.policies_tree
                .insert(queue.as_bytes(), value)
                .map_err(SledError::from)?;
        }
        index.set_policy(queue, policy);
        Ok(())
    }

    async fn policies(&self) -> Result<Vec<(String, QueuePolicy)>> {
        Ok(self.lock().policies())
    }

    fn limited(&self, queue: &str) -> bool {
        self.lock().may_hold(queue)
    }

    async fn expiring(&self, at: SystemTime) -> Result<Vec<(JobId, LeaseId)>> {
        self.expiring_locked(at)
    }

    async fn last_pending(&self, queue: &str) -> Result<Option<JobId>> {
        Ok(self.lock().last_in_queue(queue, Status::Pending))
    }

    async fn purge_chunk(
        &self,
        after: Option<JobId>,
        retention: Retention,
    ) -> Result<(u64, Option<JobId>)> {
        let (purged, next, files) = self.purge_chunk_locked(after, retention)?;
        self.remove_files_when_durable(files);
        Ok((purged, next))
    }

    async fn delete(&self, id: JobId) -> Result<()> {
        let payload = {
            let mut index = self.lock();
            let (job, payload) = self.load_record(id)?;
            machine::deletable(&job)?;
            self.remove_progress([id])?;
            self.write(vec![(record_key(id), None)])?;
            // Whatever the record said: a replace a crash cut short may
            // have left a payload in the tree (removing none is a look-up).
            self.remove_payloads([id])?;
            self.remove_results([id])?;
            index.remove(&job);
            payload
        };
        if let Payload::File(_) = payload {
            self.remove_files_when_durable(vec![id]);
        }
        Ok(())
    }

    async fn put_schedule(&self, schedule: &Schedule) -> Result<()> {
        let _state = self.lock();
        schedules::put(
            &self.schedules_tree,
            &self.schedule_payloads,
            schedule,
            || self.next_id(),
        )
    }

    async fn delete_schedule(&self, name: &str) -> Result<Option<Schedule>> {
        let _state = self.lock();
        schedules::delete(&self.schedules_tree, &self.schedule_payloads, name)
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        schedules::all(&self.schedules_tree, &self.schedule_payloads)
    }

    async fn schedule(&self, name: &str) -> Result<Option<Schedule>> {
        schedules::get(&self.schedules_tree, &self.schedule_payloads, name)
    }

    async fn schedule_ticked(
        &self,
        name: &str,
        created_at: SystemTime,
        tick: SystemTime,
    ) -> Result<()> {
        let _state = self.lock();
        schedules::ticked(
            &self.schedules_tree,
            name,
            created_at,
            tick,
            SystemTime::now(),
        )
    }

    async fn get(&self, id: JobId) -> Result<Job> {
        let mut job = self.load_full(id).await?;
        self.fill_result(&mut job)?;
        self.fill_progress(&mut job)?;
        Ok(job)
    }

    async fn peek(&self, id: JobId) -> Result<Job> {
        let mut job = self.load(id)?;
        self.fill_progress(&mut job)?;
        Ok(job)
    }

    async fn list(&self, filter: ListFilter) -> Result<Page> {
        self.list_scan(&filter)
    }

    async fn stats(&self, queue: Option<&str>, now: SystemTime) -> Result<Vec<QueueStats>> {
        Ok(self.lock().stats(queue, now))
    }

    async fn next_run_at(&self, queues: &[String]) -> Result<Option<SystemTime>> {
        Ok(self.lock().next_run_at(queues, SystemTime::now()))
    }

    async fn next_lease_expiry(&self) -> Result<Option<SystemTime>> {
        Ok(self.lock().next_lease_expiry())
    }

    fn durable(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        self.flusher.durable()
    }

    fn attach(&self, remote: Remote) {
        let _ = self.remote.set(remote);
    }

    async fn close(&self) -> Result<()> {
        self.seal();
        // Indexes saved past a write that did not reach the disk would show
        // a job the records do not have.
        self.flusher.durable().await?;
        self.save();
        self.flusher.durable().await
    }
}
