//! [`Client`]: one typed method per `JobQueue` RPC.

use std::sync::Arc;
use std::time::Duration;

use jobq::pb::{self, job_queue_client::JobQueueClient};
use serde::Serialize;
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use jobq::STREAM_TOKEN_HEADER;

use crate::{
    connect::{Connect, Credentials},
    trace, EnqueueOptions, Error, FailOptions, Result,
};

/// The generated client under [`Client`], with the token interceptor.
pub type RawClient = JobQueueClient<InterceptedService<Channel, Credentials>>;

/// The longest timeout a call carries (about eleven years; `grpc-timeout`
/// cannot say much more, and tonic panics on what it cannot say).
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(99_999 * 3600);

/// A cheap-to-clone handle on a jobq server.
///
/// Every method is one RPC; errors the server reports keep their gRPC code
/// ([`Error::code`]). Cloning shares the underlying HTTP/2 connection, which
/// tonic re-establishes on its own after the server restarts.
#[derive(Debug, Clone)]
pub struct Client {
    inner: RawClient,
    /// The server's URL, for errors (`None` for a channel made elsewhere).
    url: Option<Arc<str>>,
    /// Most time a unary call may take ([`Connect::timeout`]).
    timeout: Option<Duration>,
}

impl Client {
    /// Connection options (token, TLS) for the server at `url`:
    /// `Client::builder("https://jobq:50051").token(t).ca_cert(pem).connect()`.
    pub fn builder(url: impl Into<String>) -> Connect {
        Connect::new(url.into())
    }

    /// Connects to the server at `url` (e.g. `http://127.0.0.1:50051`).
    ///
    /// # Errors
    /// [`Error::Connect`], naming the URL and the cause, when the URL is
    /// malformed or nothing answers.
    pub async fn connect(url: impl Into<String>) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Like [`connect`](Self::connect), but connects on first use, so it
    /// succeeds while the server is still down; calls made before it is up
    /// fail with `UNAVAILABLE`.
    ///
    /// # Errors
    /// [`Error::Connect`] when the URL is malformed.
    pub fn connect_lazy(url: impl Into<String>) -> Result<Self> {
        Self::builder(url).connect_lazy()
    }

    /// Wraps an existing channel (custom TLS, timeouts, in-process tests).
    pub fn from_channel(channel: Channel) -> Self {
        Self::with_credentials(channel, Credentials::none())
    }

    /// Wraps an existing channel, sending `credentials` with every call.
    pub fn with_credentials(channel: Channel, credentials: Credentials) -> Self {
        Self {
            // A page of big jobs, or one job with a long history, is
            // bigger than tonic's 4 MiB default.
            inner: JobQueueClient::with_interceptor(channel, credentials)
                .max_decoding_message_size(jobq::MAX_DECODE_BYTES),
            url: None,
            timeout: None,
        }
    }

    /// This client, naming `url` in the errors of calls that got no reply.
    pub(crate) fn with_url(mut self, url: &str) -> Self {
        self.url = Some(Arc::from(url));
        self
    }

    /// A failed call's error: [`Error::NoReply`], naming the server, when
    /// the call got no answer; else the server's [`Error::Status`].
    pub(crate) fn error(&self, status: tonic::Status) -> Error {
        Error::from_call(status, self.url.as_deref())
    }

    /// This client with every unary call bounded by `timeout` (`None`:
    /// unbounded); see [`Connect::timeout`].
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout.map(|t| t.min(MAX_TIMEOUT));
        self
    }

    /// A unary call's request: the caller's trace context, and the
    /// timeout, which tonic enforces on this side too (its channel's
    /// `grpc-timeout` layer) and sends to the server.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = trace::request(message);
        if let Some(timeout) = self.timeout {
            request.set_timeout(timeout);
        }
        request
    }

    /// The raw generated client, for calls this wrapper does not cover.
    pub fn inner(&self) -> RawClient {
        self.inner.clone()
    }

    /// Enqueues one job; returns it and whether it was created (`false` when
    /// `opts.key` matched a retained job, which is then returned instead).
    /// Replies only after the job is durable.
    pub async fn enqueue(
        &self,
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: impl Into<Vec<u8>>,
        opts: EnqueueOptions,
    ) -> Result<(pb::Job, bool)> {
        let resp = self
            .enqueue_reply(opts.into_request(queue, kind, payload))
            .await?;
        Ok((resp.job.ok_or(Error::MissingField("job"))?, resp.created))
    }

    /// One Enqueue call, its whole reply.
    pub(crate) async fn enqueue_reply(
        &self,
        req: pb::EnqueueRequest,
    ) -> Result<pb::EnqueueResponse> {
        Ok(self
            .inner
            .clone()
            .enqueue(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner())
    }

    /// [`enqueue`](Self::enqueue) with `payload` encoded as JSON.
    ///
    /// # Errors
    /// [`Error::Json`] when `payload` cannot be serialized.
    pub async fn enqueue_json<T: Serialize + ?Sized>(
        &self,
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: &T,
        opts: EnqueueOptions,
    ) -> Result<(pb::Job, bool)> {
        let bytes = serde_json::to_vec(payload)?;
        self.enqueue(queue, kind, bytes, opts).await
    }

    /// Enqueues many jobs, durable as a unit. One result per request, in
    /// order; a rejected entry carries `error_code`/`error_message` and does
    /// not stop the others. Build entries with
    /// [`EnqueueOptions::into_request`].
    pub async fn enqueue_batch(
        &self,
        jobs: Vec<pb::EnqueueRequest>,
    ) -> Result<Vec<pb::EnqueueResult>> {
        let req = pb::EnqueueBatchRequest { jobs };
        Ok(self
            .inner
            .clone()
            .enqueue_batch(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner()
            .results)
    }

    /// Takes the next due job from `queues` (in priority order). `None` when
    /// nothing became due within `wait` (no wait when `None`). `lease` unset
    /// means the server's default lease.
    pub async fn dequeue<I, S>(
        &self,
        queues: I,
        worker_id: impl Into<String>,
        lease: Option<Duration>,
        wait: Option<Duration>,
    ) -> Result<Option<pb::LeasedJob>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let req = pb::DequeueRequest {
            queues: queues.into_iter().map(Into::into).collect(),
            worker_id: worker_id.into(),
            lease_duration: lease.map(pb_duration),
            wait: wait.map(pb_duration),
        };
        let mut request = self.request(req);
        if let (Some(timeout), Some(wait)) = (self.timeout, wait) {
            // The wait is the server's to spend: a long-poll that finds
            // nothing must answer None, not DEADLINE_EXCEEDED.
            request.set_timeout(timeout.saturating_add(wait).min(MAX_TIMEOUT));
        }
        Ok(self
            .inner
            .clone()
            .dequeue(request)
            .await
            .map_err(|s| self.error(s))?
            .into_inner()
            .leased)
    }

    /// Completes a RUNNING job held under `lease_id`.
    ///
    /// # Errors
    /// `ABORTED` when the lease is stale (the job was reclaimed or handed to
    /// someone else), `FAILED_PRECONDITION` when the job is not RUNNING.
    pub async fn ack(
        &self,
        job_id: impl Into<String>,
        lease_id: impl Into<String>,
    ) -> Result<pb::Job> {
        self.ack_with_result(job_id, lease_id, Vec::new()).await
    }

    /// [`ack`](Self::ack) that stores `result` with the job (empty: none),
    /// read back as [`Job::result`](crate::Job::result).
    ///
    /// # Errors
    /// As [`ack`](Self::ack); `INVALID_ARGUMENT` (and no ack) when the
    /// result is over the server's `--max-result-bytes`.
    pub async fn ack_with_result(
        &self,
        job_id: impl Into<String>,
        lease_id: impl Into<String>,
        result: impl Into<Vec<u8>>,
    ) -> Result<pb::Job> {
        let req = pb::AckRequest {
            job_id: job_id.into(),
            lease_id: lease_id.into(),
            result: result.into(),
        };
        let resp = self
            .inner
            .clone()
            .ack(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        resp.job.ok_or(Error::MissingField("job"))
    }

    /// Ends the attempt held under `lease_id` badly, with `error` kept as the
    /// job's `last_error`. The job goes back to PENDING (after `opts`'s delay
    /// or the server's backoff) or to FAILED when attempts are used up or
    /// `opts.fatal` is set.
    ///
    /// # Errors
    /// `ABORTED` when the lease is stale.
    pub async fn fail(
        &self,
        job_id: impl Into<String>,
        lease_id: impl Into<String>,
        error: impl Into<String>,
        opts: FailOptions,
    ) -> Result<pb::Job> {
        let req = pb::FailRequest {
            job_id: job_id.into(),
            lease_id: lease_id.into(),
            error: error.into(),
            retry_delay: opts.retry_delay.map(pb_duration),
            fatal: opts.fatal,
            snooze: opts.snooze.map(pb_duration),
        };
        let resp = self
            .inner
            .clone()
            .fail(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        resp.job.ok_or(Error::MissingField("job"))
    }

    /// Brings a FAILED job back to PENDING with its attempts reset.
    pub async fn retry(&self, job_id: impl Into<String>) -> Result<pb::Job> {
        let req = pb::RetryRequest {
            job_id: job_id.into(),
        };
        let resp = self
            .inner
            .clone()
            .retry(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner();
        resp.job.ok_or(Error::MissingField("job"))
    }

    /// Extends `leases` by `extend_by` (unset: each lease's own duration) and
    /// returns the ones the worker no longer holds.
    pub async fn heartbeat(
        &self,
        worker_id: impl Into<String>,
        leases: Vec<pb::LeaseRef>,
        extend_by: Option<Duration>,
    ) -> Result<Vec<pb::LeaseRef>> {
        self.heartbeat_with(worker_id.into(), leases, extend_by, false, String::new())
            .await
    }

    /// [`heartbeat`](Self::heartbeat) that also tells the server the worker
    /// is shutting down gracefully: the Lease stream named by `stream_token`
    /// (from [`lease_with_token`](Self::lease_with_token)) pushes no more
    /// jobs, so the worker can finish and ack what it holds and then close
    /// it without anything being reclaimed.
    pub async fn heartbeat_draining(
        &self,
        worker_id: impl Into<String>,
        leases: Vec<pb::LeaseRef>,
        extend_by: Option<Duration>,
        stream_token: impl Into<String>,
    ) -> Result<Vec<pb::LeaseRef>> {
        self.heartbeat_with(
            worker_id.into(),
            leases,
            extend_by,
            true,
            stream_token.into(),
        )
        .await
    }

    pub(crate) async fn heartbeat_with(
        &self,
        worker_id: String,
        leases: Vec<pb::LeaseRef>,
        extend_by: Option<Duration>,
        draining: bool,
        stream_token: String,
    ) -> Result<Vec<pb::LeaseRef>> {
        // One call per jobq::MAX_HEARTBEAT_LEASES leases, the server's
        // per-call limit (and one call for none: it still says the worker
        // is alive, and draining).
        let mut chunks: Vec<Vec<pb::LeaseRef>> = leases
            .chunks(jobq::MAX_HEARTBEAT_LEASES)
            .map(<[pb::LeaseRef]>::to_vec)
            .collect();
        if chunks.is_empty() {
            chunks.push(Vec::new());
        }
        let mut lost = Vec::new();
        for leases in chunks {
            let req = pb::HeartbeatRequest {
                worker_id: worker_id.clone(),
                leases,
                extend_by: extend_by.map(pb_duration),
                draining,
                stream_token: stream_token.clone(),
            };
            lost.extend(
                self.inner
                    .clone()
                    .heartbeat(self.request(req))
                    .await
                    .map_err(|s| self.error(s))?
                    .into_inner()
                    .lost,
            );
        }
        Ok(lost)
    }

    /// Opens a Lease stream: the server pushes leased jobs while the stream
    /// holds fewer than `capacity` unfinished ones, and `revoked` events for
    /// leases it took back. Dropping the stream gives its unfinished jobs
    /// back to the server. Most users want [`Worker`](crate::Worker), which
    /// drives this stream.
    pub async fn lease<I, S>(
        &self,
        queues: I,
        worker_id: impl Into<String>,
        capacity: u32,
        lease: Option<Duration>,
    ) -> Result<tonic::Streaming<pb::LeaseEvent>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let (stream, _) = self
            .lease_with_token(queues, worker_id, capacity, lease, Vec::new())
            .await?;
        Ok(stream)
    }

    /// [`lease`](Self::lease) that also declares the leases the worker still
    /// holds from an earlier stream (they count against `capacity` and move
    /// to this stream), and returns the stream's token, which heartbeats
    /// present so that `draining` applies to this stream alone.
    pub async fn lease_with_token<I, S>(
        &self,
        queues: I,
        worker_id: impl Into<String>,
        capacity: u32,
        lease: Option<Duration>,
        held: Vec<pb::LeaseRef>,
    ) -> Result<(tonic::Streaming<pb::LeaseEvent>, String)>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let req = pb::LeaseRequest {
            queues: queues.into_iter().map(Into::into).collect(),
            worker_id: worker_id.into(),
            capacity,
            lease_duration: lease.map(pb_duration),
            held,
        };
        let response = self
            .inner
            .clone()
            .lease(req)
            .await
            .map_err(|s| self.error(s))?;
        let token = response
            .metadata()
            .get(STREAM_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Ok((response.into_inner(), token))
    }

    /// Fetches one job with its attempt history.
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown id.
    pub async fn get_job(&self, id: impl Into<String>) -> Result<pb::Job> {
        let req = pb::GetJobRequest { id: id.into() };
        Ok(self
            .inner
            .clone()
            .get_job(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner())
    }

    /// Streams the states of jobs `ids` (see the `WatchJob` RPC): each
    /// one's current state, then every change, until each is DONE or
    /// FAILED.
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown id, `INVALID_ARGUMENT` for none or too
    /// many, `RESOURCE_EXHAUSTED` when the server has `--max-watchers`
    /// streams open.
    pub async fn watch_job<I, S>(&self, ids: I) -> Result<tonic::Streaming<pb::Job>>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let req = pb::WatchJobRequest {
            ids: ids.into_iter().map(Into::into).collect(),
        };
        Ok(self
            .inner
            .clone()
            .watch_job(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner())
    }

    /// Lists one page of jobs matching `req`'s filters; pass the returned
    /// `next_page_token` back for the next page.
    pub async fn list_jobs(&self, req: pb::ListJobsRequest) -> Result<pb::ListJobsResponse> {
        Ok(self
            .inner
            .clone()
            .list_jobs(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner())
    }

    /// Counts jobs per status for `queue`, or for every queue when `None`.
    pub async fn stats(&self, queue: Option<&str>) -> Result<Vec<pb::QueueStats>> {
        let req = pb::StatsRequest {
            queue: queue.unwrap_or_default().to_owned(),
        };
        Ok(self
            .inner
            .clone()
            .stats(self.request(req))
            .await
            .map_err(|s| self.error(s))?
            .into_inner()
            .queues)
    }
}

/// std → protobuf duration, saturating at protobuf's range (about 10,000
/// years) rather than failing: no caller means a longer delay than that.
pub(crate) fn pb_duration(d: Duration) -> prost_types::Duration {
    const MAX_SECONDS: u64 = 315_576_000_000;
    if d.as_secs() > MAX_SECONDS {
        return prost_types::Duration {
            seconds: MAX_SECONDS as i64,
            nanos: 0,
        };
    }
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_convert_and_saturate() {
        assert_eq!(
            pb_duration(Duration::from_millis(250)),
            prost_types::Duration {
                seconds: 0,
                nanos: 250_000_000
            }
        );
        assert_eq!(pb_duration(Duration::MAX).seconds, 315_576_000_000);
        assert_eq!(pb_duration(Duration::MAX).nanos, 0);
    }

    #[tokio::test]
    async fn malformed_url_is_a_connect_error_naming_it() {
        let err = Client::connect_lazy("http://not a url").unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("cannot connect to http://not a url: "),
            "{err}"
        );
        assert!(!err.is_transient());
    }

    #[tokio::test]
    async fn a_url_without_a_scheme_says_so() {
        let err = Client::connect("127.0.0.1:50051").await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot connect to 127.0.0.1:50051: the URL has no scheme; \
             did you mean http://127.0.0.1:50051?"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_url_and_the_cause() {
        // A port that was just free: nothing listens on it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let err = Client::connect(url.clone()).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("cannot connect to {url}: ")),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
        assert!(err.is_transient());
    }
}
