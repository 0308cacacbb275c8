//! The typed calls on [`Client`]: enqueue ([`NewJob`], [`Enqueued`]), get,
//! retry and cancel a [`Job`], list jobs a page at a time ([`JobFilter`],
//! [`JobPage`]) or as one stream over every page, and [`QueueStats`].
//!
//! Each has a twin in `client.rs`/`operator.rs` that speaks `pb` (the wire
//! types) for code that wants them.

use futures::stream::{self, BoxStream, StreamExt};
use serde::Serialize;

use jobq::pb;

use crate::model::{EnqueueOutcome, Enqueued, Job, QueueStats, Rejected, Status};
use crate::{Client, EnqueueOptions, Result};

/// One job to enqueue, for [`Client::submit_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    queue: String,
    kind: String,
    payload: Vec<u8>,
    opts: EnqueueOptions,
}

impl NewJob {
    /// A job of `kind` in `queue` with raw `payload` and default options.
    pub fn new(
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            queue: queue.into(),
            kind: kind.into(),
            payload: payload.into(),
            opts: EnqueueOptions::new(),
        }
    }

    /// A job whose payload is `payload` as JSON.
    ///
    /// # Errors
    /// [`Error::Json`](crate::Error::Json) when `payload` cannot be
    /// serialized.
    pub fn json<T: Serialize + ?Sized>(
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: &T,
    ) -> Result<Self> {
        Ok(Self::new(queue, kind, serde_json::to_vec(payload)?))
    }

    /// Sets the options (key, attempts, delay, metadata).
    pub fn options(mut self, opts: EnqueueOptions) -> Self {
        self.opts = opts;
        self
    }

    fn into_request(self) -> pb::EnqueueRequest {
        self.opts.into_request(self.queue, self.kind, self.payload)
    }
}

/// Which jobs [`Client::list_page`] and [`Client::list_all`] return.
///
/// ```
/// use jobq_client::{JobFilter, Status};
///
/// let dead_letters = JobFilter::new().queue("emails").status(Status::Failed);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    queue: Option<String>,
    status: Option<Status>,
    key: Option<String>,
    page_size: u32,
    omit_payload: bool,
}

impl JobFilter {
    /// Every job of every queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only jobs in `queue`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Only jobs with `status`.
    pub fn status(mut self, status: Status) -> Self {
        self.status = Some(status);
        self
    }

    /// Only the job with this domain key (set the queue too: keys are
    /// unique per queue).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Most jobs per page (the server's default is 100, its cap 1000).
    pub fn page_size(mut self, n: u32) -> Self {
        self.page_size = n;
        self
    }

    /// Leaves payloads out of the replies (a listing that does not show
    /// them moves much less data).
    pub fn omit_payload(mut self, omit: bool) -> Self {
        self.omit_payload = omit;
        self
    }

    /// The wire request for the page after `page_token`.
    pub fn to_request(&self, page_token: Option<&str>) -> pb::ListJobsRequest {
        pb::ListJobsRequest {
            queue: self.queue.clone().unwrap_or_default(),
            status: self.status.map_or(0, Status::to_proto),
            key: self.key.clone().unwrap_or_default(),
            page_size: self.page_size,
            page_token: page_token.unwrap_or_default().to_owned(),
            omit_payload: self.omit_payload,
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPage {
    /// The jobs on this page, oldest id first.
    pub jobs: Vec<Job>,
    /// Pass to [`Client::list_page`] for the next page; `None` on the last.
    pub next_page_token: Option<String>,
}

impl Client {
    /// Enqueues one job. Replies once the job is durable; `created` is
    /// `false` when `opts`'s key matched a retained job, which is returned
    /// instead.
    ///
    /// ```no_run
    /// # async fn demo(client: jobq_client::Client) -> jobq_client::Result<()> {
    /// use jobq_client::EnqueueOptions;
    /// let added = client
    ///     .submit("emails", "send-email", br#"{"to":"ada@example.com"}"#.to_vec(), EnqueueOptions::new())
    ///     .await?;
    /// println!("{} {:?}", added.job.id, added.job.status);
    /// # Ok(()) }
    /// ```
    pub async fn submit(
        &self,
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: impl Into<Vec<u8>>,
        opts: EnqueueOptions,
    ) -> Result<Enqueued> {
        let resp = self
            .enqueue_reply(opts.into_request(queue, kind, payload))
            .await?;
        let job = resp.job.ok_or(crate::Error::MissingField("job"))?;
        Ok(Enqueued {
            job: job.into(),
            created: resp.created,
            outcome: EnqueueOutcome::of(resp.outcome, resp.created),
        })
    }

    /// [`submit`](Self::submit) with `payload` encoded as JSON.
    ///
    /// # Errors
    /// [`Error::Json`](crate::Error::Json) when `payload` cannot be
    /// serialized.
    pub async fn submit_json<T: Serialize + ?Sized>(
        &self,
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: &T,
        opts: EnqueueOptions,
    ) -> Result<Enqueued> {
        let bytes = serde_json::to_vec(payload)?;
        self.submit(queue, kind, bytes, opts).await
    }

    /// Enqueues many jobs, durable as a unit: one result per job, in order.
    /// A rejected entry (a bad queue name, a payload too big) is a
    /// [`Rejected`] and does not stop the others.
    pub async fn submit_batch(
        &self,
        jobs: impl IntoIterator<Item = NewJob>,
    ) -> Result<Vec<std::result::Result<Enqueued, Rejected>>> {
        let reqs = jobs.into_iter().map(NewJob::into_request).collect();
        let results = self.enqueue_batch(reqs).await?;
        Ok(results.into_iter().map(Enqueued::from_result).collect())
    }

    /// One job with its attempt history.
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown id.
    pub async fn job(&self, id: impl Into<String>) -> Result<Job> {
        Ok(self.get_job(id).await?.into())
    }

    /// The states of jobs `ids` as they change (see
    /// [`watch_job`](Self::watch_job)), typed; the stream ends once each
    /// job is DONE or FAILED.
    ///
    /// # Errors
    /// As [`watch_job`](Self::watch_job).
    pub async fn watch<I, S>(&self, ids: I) -> Result<BoxStream<'static, Result<Job>>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stream = self.watch_job(ids).await?;
        let client = self.clone();
        Ok(stream
            .map(move |item| item.map(Job::from).map_err(|s| client.error(s)))
            .boxed())
    }

    /// Waits until job `id` is DONE and returns it, with its
    /// [`result`](Job::result) (decode it with [`Job::result_json`]). Follows
    /// the job over WatchJob, so it returns as soon as the ack is durable;
    /// a stream cut by a server restart is opened again.
    ///
    /// # Errors
    /// [`Error::JobFailed`](crate::Error::JobFailed) when the job ends
    /// FAILED (a cancelled job too: its `last_error` is
    /// `cancelled: <reason>`), [`Error::WaitTimedOut`](crate::Error::WaitTimedOut)
    /// when `timeout` passes first, and the call's error for anything else
    /// (`NOT_FOUND` for an unknown or deleted job).
    pub async fn wait(&self, id: impl Into<String>, timeout: std::time::Duration) -> Result<Job> {
        let id = id.into();
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out = || crate::Error::WaitTimedOut {
            id: id.clone(),
            after: timeout,
        };
        let mut backoff = crate::backoff::Backoff::default();
        loop {
            let followed = async {
                let mut states = self.watch([id.clone()]).await?;
                while let Some(job) = states.next().await {
                    let job = job?;
                    match job.status {
                        Status::Done => return Ok(Some(job)),
                        Status::Failed => return Err(crate::Error::JobFailed(Box::new(job))),
                        _ => {}
                    }
                }
                Ok(None)
            };
            match tokio::time::timeout_at(deadline, followed).await {
                Err(_) => return Err(timed_out()),
                Ok(Ok(Some(job))) => return Ok(job),
                Ok(Err(err)) if !err.is_transient() => return Err(err),
                // Cut (a server restart) or ended without a final state:
                // follow it again, after a pause.
                Ok(Ok(None) | Err(_)) => {
                    let pause = backoff.next_delay();
                    if tokio::time::Instant::now() + pause >= deadline {
                        return Err(timed_out());
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Brings a FAILED job back to PENDING with its attempts reset.
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` when the job is not FAILED.
    pub async fn retry_job(&self, id: impl Into<String>) -> Result<Job> {
        Ok(self.retry(id).await?.into())
    }

    /// Cancels a PENDING or RUNNING job (see
    /// [`cancel_job`](Self::cancel_job)).
    pub async fn cancel(&self, id: impl Into<String>, reason: impl Into<String>) -> Result<Job> {
        Ok(self.cancel_job(id, reason).await?.into())
    }

    /// Counts per status for `queue`, or for every queue (sorted by name)
    /// when `None`.
    pub async fn queue_stats(&self, queue: Option<&str>) -> Result<Vec<QueueStats>> {
        let stats = self.stats(queue).await?;
        Ok(stats.into_iter().map(Into::into).collect())
    }

    /// One page of the jobs `filter` selects, starting after `page_token`
    /// (`None`: the first page).
    pub async fn list_page(&self, filter: &JobFilter, page_token: Option<&str>) -> Result<JobPage> {
        let page = self.list_jobs(filter.to_request(page_token)).await?;
        Ok(JobPage {
            jobs: page.jobs.into_iter().map(Into::into).collect(),
            next_page_token: Some(page.next_page_token).filter(|t| !t.is_empty()),
        })
    }

    /// Every job `filter` selects, fetching page after page as the stream is
    /// read (boxed, so `try_next` works on it as is). Ends after the first
    /// error.
    ///
    /// ```no_run
    /// # async fn demo(client: jobq_client::Client) -> jobq_client::Result<()> {
    /// use futures::TryStreamExt;
    /// use jobq_client::{JobFilter, Status};
    /// let dead: Vec<_> = client
    ///     .list_all(JobFilter::new().queue("emails").status(Status::Failed))
    ///     .try_collect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn list_all(&self, filter: JobFilter) -> BoxStream<'static, Result<Job>> {
        enum Next {
            Page(Option<String>),
            Done,
        }
        let client = self.clone();
        let pages = stream::try_unfold(Next::Page(None), move |next| {
            let client = client.clone();
            let filter = filter.clone();
            async move {
                let token = match next {
                    Next::Done => return Ok::<_, crate::Error>(None),
                    Next::Page(token) => token,
                };
                let page = client.list_page(&filter, token.as_deref()).await?;
                let next = match page.next_page_token {
                    Some(t) => Next::Page(Some(t)),
                    None => Next::Done,
                };
                Ok(Some((stream::iter(page.jobs.into_iter().map(Ok)), next)))
            }
        });
        futures::TryStreamExt::try_flatten(pages).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_becomes_its_request() {
        let req = JobFilter::new()
            .queue("emails")
            .status(Status::Failed)
            .key("order-1")
            .page_size(10)
            .omit_payload(true)
            .to_request(Some("t1"));
        assert_eq!(req.queue, "emails");
        assert_eq!(req.status, pb::JobStatus::Failed as i32);
        assert_eq!((req.key.as_str(), req.page_size), ("order-1", 10));
        assert_eq!(req.page_token, "t1");
        assert!(req.omit_payload);
        let all = JobFilter::new().to_request(None);
        assert_eq!((all.status, all.page_token.as_str()), (0, ""));
    }

    #[test]
    fn a_new_job_carries_its_options() {
        let req = NewJob::json("q", "k", &serde_json::json!({"a": 1}))
            .unwrap()
            .options(EnqueueOptions::new().key("x"))
            .into_request();
        assert_eq!((req.queue.as_str(), req.kind.as_str()), ("q", "k"));
        assert_eq!(req.payload, br#"{"a":1}"#);
        assert_eq!(req.key, "x");
    }
}
