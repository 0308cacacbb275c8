//! [`JobContext`]: what a handler knows about the job it runs.

use std::sync::Arc;
use std::time::SystemTime;

use jobq::pb;
use serde::de::DeserializeOwned;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::inflight::{Deadline, Unsent};
use crate::HandlerError;

/// The job a handler runs, under which lease, and a signal for when to stop.
///
/// Cheap to clone; clones share the cancellation signal and the lease
/// deadline (which moves forward with each successful heartbeat).
#[derive(Debug, Clone)]
pub struct JobContext {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    job: pb::Job,
    lease_id: String,
    worker_id: Arc<str>,
    deadline: Deadline,
    progress: Unsent,
    cancel: CancellationToken,
    draining: CancellationToken,
    /// What the handler set as the job's result, sent with its ack.
    result: std::sync::Mutex<Option<Vec<u8>>>,
}

impl JobContext {
    pub(crate) fn new(
        job: pb::Job,
        lease_id: String,
        worker_id: Arc<str>,
        (deadline, progress): (Deadline, Unsent),
        cancel: CancellationToken,
        draining: CancellationToken,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                job,
                lease_id,
                worker_id,
                deadline,
                progress,
                cancel,
                draining,
                result: std::sync::Mutex::new(None),
            }),
        }
    }

    /// The job's id.
    pub fn id(&self) -> &str {
        &self.inner.job.id
    }

    /// The job's kind (which handler runs it).
    pub fn kind(&self) -> &str {
        &self.inner.job.kind
    }

    /// The queue the job came from.
    pub fn queue(&self) -> &str {
        &self.inner.job.queue
    }

    /// The job's domain key (e.g. `order-4711`), if it was enqueued with one.
    /// Handlers should be idempotent on this, not on [`id`](Self::id).
    pub fn key(&self) -> Option<&str> {
        Some(self.inner.job.key.as_str()).filter(|k| !k.is_empty())
    }

    /// Which run this is, 1-based: 1 on first delivery, 2 after one failed
    /// or lost attempt, and so on. A value above 1 means an earlier run may
    /// have had side effects.
    pub fn attempt(&self) -> u32 {
        self.inner.job.attempts.saturating_add(1)
    }

    /// Attempts the job is allowed in total.
    pub fn max_attempts(&self) -> u32 {
        self.inner.job.max_attempts
    }

    /// The raw payload.
    pub fn payload(&self) -> &[u8] {
        &self.inner.job.payload
    }

    /// The payload decoded from JSON.
    ///
    /// # Errors
    /// A *fatal* [`HandlerError`] when the payload is not a `T`: no retry
    /// decodes it better, so `ctx.json()?` dead-letters such a job at once
    /// instead of burning its attempts. A handler that expects a fix in the
    /// handler itself (a rolling deploy of a new payload shape) can decode
    /// [`payload`](Self::payload) with `serde_json` and retry instead.
    pub fn json<T: DeserializeOwned>(&self) -> std::result::Result<T, HandlerError> {
        serde_json::from_slice(&self.inner.job.payload).map_err(|err| {
            HandlerError::fatal(format!(
                "payload is not a valid {}: {err}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// Sets the job's result: stored with the job by its ack (if the
    /// handler returns `Ok`), and read back by
    /// [`Client::job`](crate::Client::job) as
    /// [`Job::result`](crate::Job::result). The last call wins. A result
    /// over the server's `--max-result-bytes` is refused, and the job is
    /// failed instead, for good, with the server's reason.
    pub fn set_result(&self, result: impl Into<Vec<u8>>) {
        *self.inner.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(result.into());
    }

    /// Reports how far the job has come: `percent` (over 100 counts as
    /// 100) and a short message (cut to [`jobq::PROGRESS_MESSAGE_BYTES`]
    /// bytes). The worker's next heartbeat (every lease/3) carries the
    /// latest report, which the server keeps with the job: [`Client::job`]
    /// and [`Client::watch`] show it as [`Job::progress`](crate::Job::progress).
    /// Reports made between two heartbeats cost nothing but the last one.
    ///
    /// [`Client::job`]: crate::Client::job
    /// [`Client::watch`]: crate::Client::watch
    pub fn progress(&self, percent: u32, message: impl Into<String>) {
        let mut message = message.into();
        if message.len() > jobq::PROGRESS_MESSAGE_BYTES {
            let mut cut = jobq::PROGRESS_MESSAGE_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        *self
            .inner
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(pb::Progress {
            percent: percent.min(100),
            message,
            reported_at: None,
        });
    }

    /// [`set_result`](Self::set_result) with `value` as JSON.
    ///
    /// # Errors
    /// A fatal [`HandlerError`] when `value` cannot be serialized.
    pub fn set_result_json<T: serde::Serialize + ?Sized>(
        &self,
        value: &T,
    ) -> std::result::Result<(), HandlerError> {
        let bytes = serde_json::to_vec(value)
            .map_err(|err| HandlerError::fatal(format!("result is not serializable: {err}")))?;
        self.set_result(bytes);
        Ok(())
    }

    /// The result the handler set, if any.
    pub(crate) fn result(&self) -> Vec<u8> {
        self.inner
            .result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default()
    }

    /// What the producer attached at enqueue (trace context, request ids).
    pub fn metadata(&self) -> &std::collections::HashMap<String, String> {
        &self.inner.job.metadata
    }

    /// When the job was enqueued.
    pub fn enqueued_at(&self) -> Option<SystemTime> {
        self.inner
            .job
            .enqueued_at
            .and_then(|ts| SystemTime::try_from(ts).ok())
    }

    /// The job as the client's [`Job`](crate::Job) (a copy, payload
    /// included).
    pub fn to_job(&self) -> crate::Job {
        self.inner.job.clone().into()
    }

    /// The whole job as the server leased it, in its wire form.
    pub fn job(&self) -> &pb::Job {
        &self.inner.job
    }

    /// The lease's fencing token.
    pub fn lease_id(&self) -> &str {
        &self.inner.lease_id
    }

    /// When the lease ends unless the next heartbeat extends it. Work that
    /// cannot finish by then risks being done twice.
    pub fn lease_expires_at(&self) -> SystemTime {
        *self
            .inner
            .deadline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The id of the worker running the job.
    pub fn worker_id(&self) -> &str {
        &self.inner.worker_id
    }

    /// Resolves when the handler should stop: the job was cancelled or its
    /// lease lost (a heartbeat reported it, the server revoked it, or its
    /// deadline passed without a successful heartbeat), or the worker's
    /// drain deadline passed. The handler's future keeps running for the
    /// worker's [`cancel_grace`](crate::WorkerBuilder::cancel_grace), so a
    /// handler that `select!`s on this can stop cleanly (roll back, log,
    /// release what it holds); then it is dropped. A cancelled job is
    /// neither acked nor failed, whatever the handler returns: its lease
    /// is gone.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.inner.cancel.cancelled()
    }

    /// Resolves when the worker starts draining (shutdown was asked for):
    /// it takes no new jobs, and running handlers have until the drain
    /// timeout to finish. A long handler can use it to checkpoint and
    /// finish early, or to return a retryable error that hands the rest of
    /// the work to another worker.
    pub fn draining(&self) -> WaitForCancellationFuture<'_> {
        self.inner.draining.cancelled()
    }

    /// Whether [`draining`](Self::draining) has fired.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.is_cancelled()
    }

    /// Whether [`cancelled`](Self::cancelled) has fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// A clone of the cancellation token, to hand to spawned tasks.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.cancel.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn ctx(job: pb::Job) -> JobContext {
        let deadline = Arc::new(Mutex::new(SystemTime::UNIX_EPOCH));
        JobContext::new(
            job,
            "l1".into(),
            "w1".into(),
            (deadline, Arc::new(Mutex::new(None))),
            CancellationToken::new(),
            CancellationToken::new(),
        )
    }

    #[test]
    fn exposes_the_job() {
        let c = ctx(pb::Job {
            id: "j1".into(),
            kind: "send-email".into(),
            key: "order-4711".into(),
            attempts: 2,
            payload: br#"{"to":"ada@example.com"}"#.to_vec(),
            ..Default::default()
        });
        assert_eq!(
            (c.id(), c.kind(), c.key(), c.attempt()),
            ("j1", "send-email", Some("order-4711"), 3)
        );
        let v: serde_json::Value = c.json().unwrap();
        assert_eq!(v["to"], "ada@example.com");
        assert_eq!((c.lease_id(), c.worker_id()), ("l1", "w1"));
        assert_eq!(c.enqueued_at(), None);
        let typed = c.to_job();
        assert_eq!(typed.key.as_deref(), Some("order-4711"));
        assert_eq!(typed.attempts, 2);
    }

    #[test]
    fn empty_key_is_none_and_bad_json_is_an_error() {
        let c = ctx(pb::Job {
            payload: b"nope".to_vec(),
            ..Default::default()
        });
        assert_eq!(c.key(), None);
        assert_eq!(c.attempt(), 1);
        let err = c.json::<serde_json::Value>().unwrap_err();
        assert!(err.is_fatal(), "{err:?}");
        assert!(
            err.message()
                .starts_with("payload is not a valid serde_json::value::Value: "),
            "{}",
            err.message()
        );
    }
}
