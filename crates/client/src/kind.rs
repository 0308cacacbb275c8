//! Typed job kinds: a payload type that names its queue and kind once, so
//! producers and workers cannot disagree on either string.
//!
//! ```no_run
//! use std::sync::Arc;
//! use jobq_client::{Client, EnqueueOptions, HandlerError, JobContext, JobKind, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendConfirmation {
//!     order: String,
//!     to: String,
//! }
//!
//! impl JobKind for SendConfirmation {
//!     const QUEUE: &'static str = "emails";
//!     const KIND: &'static str = "send-email";
//! }
//!
//! struct Mailer; // the application's shared state: a pool, a client, ...
//!
//! # async fn demo() -> jobq_client::Result<()> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let email = SendConfirmation { order: "order-4711".into(), to: "ada@example.com".into() };
//! client
//!     .submit_kind(&email, EnqueueOptions::new().key("order-4711"))
//!     .await?;
//!
//! let worker = Worker::builder(client)
//!     .job_with_state(Arc::new(Mailer), |email: SendConfirmation, _ctx: JobContext, _mailer: Arc<Mailer>| async move {
//!         // Check whether this order's email went out already, then send it.
//!         let _ = email.order;
//!         Ok::<(), HandlerError>(())
//!     })
//!     .build();
//! worker.run().await
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::builder::WorkerBuilder;
use crate::handler::HandlerResult;
use crate::{Client, EnqueueOptions, Enqueued, JobContext, Result};

/// A job's payload type, with the queue and kind it travels under. The
/// payload is JSON on the wire, so other clients (Python, TypeScript,
/// `jobq enqueue`) can produce and consume the same jobs.
pub trait JobKind: Serialize + DeserializeOwned + Send + 'static {
    /// The queue its jobs go to.
    const QUEUE: &'static str;
    /// The kind its jobs carry, which picks the handler.
    const KIND: &'static str;
}

impl Client {
    /// Enqueues `payload` as a job of its [`JobKind`], in its queue.
    ///
    /// # Errors
    /// [`Error::Json`](crate::Error::Json) when `payload` cannot be
    /// serialized; the server's refusals as for
    /// [`submit`](Self::submit).
    pub async fn submit_kind<K: JobKind>(
        &self,
        payload: &K,
        opts: EnqueueOptions,
    ) -> Result<Enqueued> {
        self.submit_json(K::QUEUE, K::KIND, payload, opts).await
    }
}

impl WorkerBuilder {
    /// Runs `handler` for jobs of kind `K`, with the payload decoded, and
    /// takes jobs from `K`'s queue (added to [`queues`](Self::queues); it
    /// replaces the default queue if none were set). A payload that does
    /// not decode as `K` is fatal: the job is dead-lettered at once, as
    /// with [`JobContext::json`].
    pub fn job<K, F, Fut>(self, handler: F) -> Self
    where
        K: JobKind,
        F: Fn(K, JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let handler = Arc::new(handler);
        self.take_queue(K::QUEUE)
            .handler(K::KIND, move |ctx: JobContext| {
                let handler = Arc::clone(&handler);
                async move {
                    let payload: K = ctx.json()?;
                    handler(payload, ctx).await
                }
            })
    }

    /// [`job`](Self::job), with `state` (a pool, a client, configuration)
    /// handed to every run: one `Arc` shared by all of them, so the
    /// handler need not capture and clone it by hand.
    pub fn job_with_state<K, S, F, Fut>(self, state: Arc<S>, handler: F) -> Self
    where
        K: JobKind,
        S: Send + Sync + 'static,
        F: Fn(K, JobContext, Arc<S>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.job(move |payload: K, ctx| handler(payload, ctx, Arc::clone(&state)))
    }
}
