//! The gRPC glue: validate the request, ask [`auth::authorize`] whether the
//! caller may, call the store (or the lease hub), convert the reply. No
//! business logic lives here.

use std::{sync::Arc, time::SystemTime};

use jobq::pb::{self, job_queue_server::JobQueue};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::{
    auth::{self, Access, Auth},
    config::Config,
    convert,
    error::{Error, Result},
    job::{JobId, LeaseId},
    leases::{LeaseEvents, LeaseHub},
    limits::StreamQuota,
    store::Store,
    validate, waiter,
    watch::{WatchEvents, Watches},
};

/// The `jobq.v1.JobQueue` service over a store.
pub struct JobQueueService<S> {
    store: Arc<S>,
    hub: Arc<LeaseHub<S>>,
    config: Arc<Config>,
    shutdown: CancellationToken,
    /// Bounds long-polling Dequeues and Lease streams (`--max-waiters`).
    waiters: Arc<Semaphore>,
    /// Who may call what; off unless [`JobQueueService::with_auth`].
    auth: Auth,
    /// Lease streams per token (`--max-streams-per-token`).
    quota: StreamQuota,
    /// WatchJob streams, and their places per token
    /// (`--max-streams-per-token`, counted apart from Lease streams).
    watches: Arc<Watches>,
    watch_quota: StreamQuota,
}

impl<S: Store> JobQueueService<S> {
    /// A service over `store`, pushing through `hub`; `shutdown` ends
    /// long polls and streams.
    pub fn new(
        store: Arc<S>,
        hub: Arc<LeaseHub<S>>,
        config: Arc<Config>,
        shutdown: CancellationToken,
    ) -> Self {
        let waiters = Arc::new(Semaphore::new(config.max_waiters));
        let quota_max = config.max_streams_per_token;
        let watches = Watches::new(&*store, config.max_watchers);
        JobQueueService {
            store,
            hub,
            config,
            shutdown,
            waiters,
            auth: Auth::off(),
            quota: StreamQuota::new(quota_max),
            watches,
            watch_quota: StreamQuota::new(quota_max),
        }
    }

    /// Checks every call against `auth` (the same table the interceptor
    /// in front of this service authenticates with).
    pub fn with_auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    fn waiter_permit(&self) -> Result<OwnedSemaphorePermit> {
        Arc::clone(&self.waiters).try_acquire_owned().map_err(|_| {
            Error::ResourceExhausted(format!(
                "too many waiting Dequeue calls and Lease streams (limit {}, --max-waiters)",
                self.config.max_waiters
            ))
        })
    }

    fn live(&self) -> Result<()> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }
}

impl<S: Store> JobQueueService<S> {
    /// The store's clock (see [`Store::now`]): a schedule's creation time
    /// and a purge's default cutoff are the database's on PostgreSQL.
    fn now(&self) -> SystemTime {
        self.store.now()
    }
}

#[tonic::async_trait]
impl<S: Store> JobQueue for JobQueueService<S> {
    #[instrument(skip_all, fields(queue = %req.get_ref().queue, kind = %req.get_ref().kind, job.id), err(level = "debug"))]
    async fn enqueue(
        &self,
        req: Request<pb::EnqueueRequest>,
    ) -> Result<Response<pb::EnqueueResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let new = validate::new_job(req.into_inner(), &self.config)?;
        auth::authorize(&*self.store, &who, Access::Produce(vec![&new.queue])).await?;
        let enqueued = self.store.enqueue(new, self.now()).await?;
        tracing::Span::current().record("job.id", tracing::field::display(enqueued.job.id));
        let outcome = convert::enqueue_outcome(&enqueued) as i32;
        Ok(Response::new(pb::EnqueueResponse {
            job: Some(convert::enqueue_receipt(enqueued.job)),
            created: enqueued.created,
            outcome,
        }))
    }

    #[instrument(skip_all, fields(jobs = req.get_ref().jobs.len()), err(level = "debug"))]
    async fn enqueue_batch(
        &self,
        req: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let checked = validate::batch(req.into_inner().jobs, &self.config)?;
        let valid: Vec<_> = checked
            .iter()
            .filter_map(|r| r.as_ref().ok().cloned())
            .collect();
        let queues = valid.iter().map(|j| j.queue.as_str()).collect();
        auth::authorize(&*self.store, &who, Access::Produce(queues)).await?;
        let mut stored = self
            .store
            .enqueue_batch(valid, self.now())
            .await?
            .into_iter();
        let results = checked
            .into_iter()
            .map(|entry| match entry {
                Ok(_) => match stored.next() {
                    Some(e) => pb::EnqueueResult {
                        outcome: convert::enqueue_outcome(&e) as i32,
                        job: Some(convert::enqueue_receipt(e.job)),
                        created: e.created,
                        ..Default::default()
                    },
                    None => rejected(&Error::Corrupt("batch result missing".into())),
                },
                Err(err) => rejected(&err),
            })
            .collect();
        Ok(Response::new(pb::EnqueueBatchResponse { results }))
    }

    #[instrument(skip_all, fields(worker.id = %req.get_ref().worker_id, job.id), err(level = "debug"))]
    async fn dequeue(
        &self,
        req: Request<pb::DequeueRequest>,
    ) -> Result<Response<pb::DequeueResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let (mut spec, wait) = validate::dequeue(req.into_inner(), &self.config)?;
        auth::authorize(&*self.store, &who, Access::Take(&spec.queues)).await?;
        spec.owner = who.owner();
        let _permit = if wait.is_zero() {
            None
        } else {
            Some(self.waiter_permit()?)
        };
        let leased = waiter::take_waiting(&*self.store, &spec, wait, &self.shutdown).await?;
        if let Some(l) = &leased {
            tracing::Span::current().record("job.id", tracing::field::display(l.job.id));
        }
        Ok(Response::new(pb::DequeueResponse {
            leased: leased.map(Into::into),
        }))
    }

    #[instrument(skip_all, fields(job.id = %req.get_ref().job_id), err(level = "debug"))]
    async fn ack(&self, req: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        let who = self.auth.who(&req)?;
        let (id, lease, result) = validate::ack(req.into_inner(), &self.config)?;
        self.hub.reported(lease, who.caller());
        auth::authorize(&*self.store, &who, Access::Leases(&[(id, lease)])).await?;
        // The stream's slot is freed by the store's lease-ended event, not
        // here: this future is dropped if the client cancels the call.
        let job = self.store.ack_with(id, lease, result, self.now()).await?;
        Ok(Response::new(pb::AckResponse {
            job: Some(convert::receipt(job)),
        }))
    }

    #[instrument(skip_all, fields(job.id = %req.get_ref().job_id), err(level = "debug"))]
    async fn fail(
        &self,
        req: Request<pb::FailRequest>,
    ) -> Result<Response<pb::FailResponse>, Status> {
        let who = self.auth.who(&req)?;
        let (id, report) = validate::fail(req.into_inner(), &self.config)?;
        self.hub.reported(report.lease_id, who.caller());
        let access = Access::Leases(&[(id, report.lease_id)]);
        auth::authorize(&*self.store, &who, access).await?;
        let job = self.store.fail(id, report, self.now()).await?;
        Ok(Response::new(pb::FailResponse {
            job: Some(convert::receipt(job)),
        }))
    }

    #[instrument(skip_all, fields(job.id = %req.get_ref().job_id), err(level = "debug"))]
    async fn retry(
        &self,
        req: Request<pb::RetryRequest>,
    ) -> Result<Response<pb::RetryResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let id = validate::job_id("job_id", &req.into_inner().job_id)?;
        auth::authorize(&*self.store, &who, Access::Administer(id)).await?;
        let job = self.store.retry(id, self.now()).await?;
        Ok(Response::new(pb::RetryResponse {
            job: Some(convert::receipt(job)),
        }))
    }

    #[instrument(skip_all, fields(job.id = %req.get_ref().id), err(level = "debug"))]
    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let (id, reason) = validate::cancel(req.into_inner(), &self.config)?;
        auth::authorize(&*self.store, &who, Access::Administer(id)).await?;
        // The holder's stream is told by the store's lease-ended event.
        let job = self.store.cancel(id, reason, self.now()).await?;
        Ok(Response::new(pb::CancelJobResponse {
            job: Some(convert::receipt(job)),
        }))
    }

    #[instrument(skip_all, fields(queue = %req.get_ref().queue), err(level = "debug"))]
    async fn pause_queue(
        &self,
        req: Request<pb::PauseQueueRequest>,
    ) -> Result<Response<pb::PauseQueueResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let queue = validate::queue(req.into_inner().queue)?;
        auth::authorize(&*self.store, &who, Access::AdministerQueue(&queue)).await?;
        self.store.set_paused(&queue, true).await?;
        Ok(Response::new(pb::PauseQueueResponse {}))
    }

    #[instrument(skip_all, fields(queue = %req.get_ref().queue), err(level = "debug"))]
    async fn resume_queue(
        &self,
        req: Request<pb::ResumeQueueRequest>,
    ) -> Result<Response<pb::ResumeQueueResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let queue = validate::queue(req.into_inner().queue)?;
        auth::authorize(&*self.store, &who, Access::AdministerQueue(&queue)).await?;
        self.store.set_paused(&queue, false).await?;
        Ok(Response::new(pb::ResumeQueueResponse {}))
    }

    #[instrument(skip_all, fields(queue = %req.get_ref().queue), err(level = "debug"))]
    async fn set_queue_policy(
        &self,
        req: Request<pb::SetQueuePolicyRequest>,
    ) -> Result<Response<pb::SetQueuePolicyResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let (queue, policy) = validate::set_policy(req.into_inner())?;
        auth::authorize(&*self.store, &who, Access::AdministerQueue(&queue)).await?;
        self.store.set_policy(&queue, policy).await?;
        Ok(Response::new(pb::SetQueuePolicyResponse {}))
    }

    #[instrument(skip_all, fields(queue = %req.get_ref().queue), err(level = "debug"))]
    async fn get_queue_policy(
        &self,
        req: Request<pb::GetQueuePolicyRequest>,
    ) -> Result<Response<pb::GetQueuePolicyResponse>, Status> {
        let who = self.auth.who(&req)?;
        let queue = validate::queue(req.into_inner().queue)?;
        auth::authorize(&*self.store, &who, Access::ReadQueue(Some(&queue))).await?;
        let policy = self.store.policy(&queue).await?;
        Ok(Response::new(pb::GetQueuePolicyResponse {
            policy: Some(policy.into()),
        }))
    }

    #[instrument(skip_all, fields(job.id = %req.get_ref().id), err(level = "debug"))]
    async fn delete_job(
        &self,
        req: Request<pb::DeleteJobRequest>,
    ) -> Result<Response<pb::DeleteJobResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let id = validate::delete(req.into_inner())?;
        auth::authorize(&*self.store, &who, Access::Administer(id)).await?;
        self.store.delete(id).await?;
        // Not a change the store publishes: its watchers learn it here.
        self.watches.changed(id);
        Ok(Response::new(pb::DeleteJobResponse {}))
    }

    #[instrument(skip_all, fields(queue = %req.get_ref().queue, deleted), err(level = "debug"))]
    async fn purge_jobs(
        &self,
        req: Request<pb::PurgeJobsRequest>,
    ) -> Result<Response<pb::PurgeJobsResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let purge = validate::purge(req.into_inner(), self.now())?;
        auth::authorize(&*self.store, &who, Access::AdministerQueue(&purge.queue)).await?;
        let deleted = self
            .store
            .purge_jobs(&purge.queue, purge.status, purge.finished_before)
            .await?;
        tracing::Span::current().record("deleted", deleted);
        if deleted > 0 {
            self.watches.recheck_all();
        }
        Ok(Response::new(pb::PurgeJobsResponse { deleted }))
    }

    #[instrument(skip_all, fields(schedule = %req.get_ref().name, queue = %req.get_ref().queue), err(level = "debug"))]
    async fn create_schedule(
        &self,
        req: Request<pb::CreateScheduleRequest>,
    ) -> Result<Response<pb::CreateScheduleResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let now = self.now();
        let (schedule, _) = validate::create_schedule(req.into_inner(), &self.config, now)?;
        auth::authorize(&*self.store, &who, Access::AdministerQueue(&schedule.queue)).await?;
        // Creating replaces a schedule of the same name: the caller must
        // also administer the queue that one feeds.
        auth::authorize(&*self.store, &who, Access::ReplaceSchedule(&schedule.name)).await?;
        let config = &self.config;
        self.store
            .put_schedule(schedule.clone(), |existing| {
                validate::schedule_room(existing, &schedule, config)
            })
            .await?;
        Ok(Response::new(pb::CreateScheduleResponse {
            schedule: Some(convert::schedule(schedule, now)),
        }))
    }

    #[instrument(skip_all, fields(schedule = %req.get_ref().name), err(level = "debug"))]
    async fn delete_schedule(
        &self,
        req: Request<pb::DeleteScheduleRequest>,
    ) -> Result<Response<pb::DeleteScheduleResponse>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let name = req.into_inner().name;
        validate::schedule_name(&name)?;
        auth::authorize(&*self.store, &who, Access::AdministerSchedule(&name)).await?;
        match self.store.delete_schedule(&name).await? {
            Some(_) => Ok(Response::new(pb::DeleteScheduleResponse {})),
            None => Err(Error::ScheduleNotFound(name).into()),
        }
    }

    #[instrument(skip_all, err(level = "debug"))]
    async fn list_schedules(
        &self,
        req: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        let who = self.auth.who(&req)?;
        auth::authorize(&*self.store, &who, Access::ReadQueue(None)).await?;
        let now = self.now();
        let schedules = self.store.schedules().await?;
        Ok(Response::new(pb::ListSchedulesResponse {
            schedules: schedules
                .into_iter()
                .filter(|s| who.sees(&s.queue))
                .map(|s| convert::schedule(s, now))
                .collect(),
        }))
    }

    type LeaseStream = LeaseEvents;

    #[instrument(skip_all, fields(worker.id = %req.get_ref().worker_id), err(level = "debug"))]
    async fn lease(
        &self,
        req: Request<pb::LeaseRequest>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let mut spec = validate::lease_stream(req.into_inner(), &self.config)?;
        auth::authorize(&*self.store, &who, Access::Take(&spec.take.queues)).await?;
        // A declared lease of a job the token may not see is dropped, as
        // one of a job that does not exist is.
        let hidden = auth::hidden_leases(&*self.store, &who, &spec.held).await?;
        spec.held.retain(|lease| !hidden.contains(lease));
        spec.take.owner = who.owner();
        spec.caller = who.caller().cloned();
        let queues = spec.take.queues.clone();
        let slot = self.quota.acquire(&who)?;
        let permit = self.waiter_permit()?;
        // A tokens reload since the checks above (they awaited the store)
        // swept the streams before this one existed: the hub asks again,
        // against the tokens in force, as it registers the stream.
        let (events, token) = self.hub.open(spec, (permit, slot), || {
            who.caller()
                .and_then(|caller| self.auth.stream_refused(caller, &queues))
        })?;
        let mut response = Response::new(events);
        if let Ok(value) = token.parse() {
            response
                .metadata_mut()
                .insert(crate::leases::STREAM_TOKEN_HEADER, value);
        }
        Ok(response)
    }

    #[instrument(skip_all, fields(worker.id = %req.get_ref().worker_id, leases = req.get_ref().leases.len()), err(level = "debug"))]
    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let who = self.auth.who(&req)?;
        let req = req.into_inner();
        let (worker_id, draining) = (req.worker_id.clone(), req.draining);
        let token = validate::stream_token(&req.stream_token)?.to_owned();
        let (leases, progress, extend_by) = validate::heartbeat(req, &self.config)?;
        // A lease of a job the token may not see is reported lost, in its
        // place in the request, as one of a job that does not exist is; it
        // is neither extended nor touched here.
        let hidden = auth::hidden_leases(&*self.store, &who, &leases).await?;
        let (visible, progress): (Vec<(JobId, LeaseId)>, Vec<_>) = leases
            .iter()
            .zip(progress)
            .filter(|(lease, _)| !hidden.contains(lease))
            .map(|(lease, report)| (*lease, report))
            .unzip();
        let mut results = self
            .store
            .extend(&visible, &progress, extend_by, self.now())
            .await?
            .into_iter();
        let lost: Vec<(JobId, LeaseId)> = leases
            .iter()
            .filter(|lease| hidden.contains(lease) || results.next().is_some_and(|r| r.is_err()))
            .copied()
            .collect();
        self.hub
            .heartbeat(&worker_id, &visible, draining, &token, who.caller());
        let ended: Vec<(JobId, LeaseId)> = lost
            .iter()
            .filter(|lease| !hidden.contains(lease))
            .copied()
            .collect();
        if !ended.is_empty() {
            // A lost lease that a stream here still counts: its lease-ended
            // event was missed; free the slot now.
            self.hub.reconcile(Some(&ended)).await;
        }
        let lost = lost
            .into_iter()
            .map(|(job, lease)| pb::LeaseRef {
                job_id: job.to_string(),
                lease_id: lease.to_string(),
                progress: None,
            })
            .collect();
        Ok(Response::new(pb::HeartbeatResponse { lost }))
    }

    #[instrument(skip_all, fields(job.id = %req.get_ref().id), err(level = "debug"))]
    async fn get_job(&self, req: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        let who = self.auth.who(&req)?;
        let id = validate::job_id("id", &req.into_inner().id)?;
        auth::authorize(&*self.store, &who, Access::ReadJob(id)).await?;
        Ok(Response::new(self.store.get(id).await?.into()))
    }

    type WatchJobStream = WatchEvents;

    #[instrument(skip_all, err(level = "debug"))]
    async fn watch_job(
        &self,
        req: Request<pb::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        self.live()?;
        let who = self.auth.who(&req)?;
        let ids = validate::watch(req.into_inner(), &self.config)?;
        for id in &ids {
            auth::authorize(&*self.store, &who, Access::ReadJob(*id)).await?;
        }
        let slot = self.watch_quota.acquire(&who)?;
        let place = self.watches.place()?;
        let poll = (self.store.shared() && !self.config.watch_poll.is_zero())
            .then_some(self.config.watch_poll);
        Ok(Response::new(self.watches.watch(
            Arc::clone(&self.store),
            ids,
            poll,
            (place, slot),
            self.shutdown.clone(),
        )))
    }

    #[instrument(skip_all, err(level = "debug"))]
    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let who = self.auth.who(&req)?;
        let filter = validate::list(req.into_inner(), &self.config)?;
        let access = Access::ListJobs(filter.queue.as_deref());
        auth::authorize(&*self.store, &who, access).await?;
        let page = self.store.list(filter).await?;
        Ok(Response::new(pb::ListJobsResponse {
            jobs: page.jobs.into_iter().map(Into::into).collect(),
            next_page_token: page.next.map(|id| id.to_string()).unwrap_or_default(),
        }))
    }

    #[instrument(skip_all, err(level = "debug"))]
    async fn stats(
        &self,
        req: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let who = self.auth.who(&req)?;
        let queue = validate::optional_name("queue", req.into_inner().queue)?;
        auth::authorize(&*self.store, &who, Access::ReadQueue(queue.as_deref())).await?;
        let mut stats = self.store.stats(queue.as_deref(), self.now()).await?;
        stats.retain(|s| who.sees(&s.queue));
        Ok(Response::new(pb::StatsResponse {
            queues: stats.into_iter().map(Into::into).collect(),
        }))
    }
}

/// One rejected entry of a batch; the others go ahead.
fn rejected(err: &Error) -> pb::EnqueueResult {
    pb::EnqueueResult {
        job: None,
        created: false,
        error_code: err.code() as i32,
        error_message: err.to_string(),
        outcome: pb::EnqueueOutcome::Unspecified as i32,
    }
}
