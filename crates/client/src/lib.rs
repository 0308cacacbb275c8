//! Typed client and worker runtime for jobq.
//!
//! # Layout
//! - [`client`]: [`Client`], one method per `JobQueue` RPC speaking the
//!   wire types (`pb`); [`typed`]: the same calls returning the client's
//!   own types ([`Job`], [`Enqueued`], [`QueueStats`]), typed batch
//!   enqueue ([`NewJob`]) and listing ([`JobFilter`], a page at a time or
//!   as one stream); [`connect`]: how it reaches the server ([`Connect`]:
//!   bearer token, TLS and mTLS); `operator` (private): the operator's
//!   calls on [`Client`] (cancel, pause/resume, delete, purge, schedules).
//! - [`model`]: the client's types ([`Job`], [`JobId`], [`Status`],
//!   [`Attempt`], [`Outcome`], [`QueueStats`]) and their conversions from
//!   and to `pb`.
//! - [`options`]: [`EnqueueOptions`] (key, attempts, delay) and
//!   [`FailOptions`] (retry delay, fatal).
//! - [`error`]: [`enum@Error`], the crate's one error type, and [`Result`].
//! - [`worker`]: [`Worker`], which holds a Lease stream, reconnects and
//!   drains; [`builder`]: its options ([`WorkerBuilder`]); `signals`
//!   (private): SIGINT/SIGTERM as a shutdown.
//! - [`handler`]: [`HandlerError`], how a handler asks for a retry delay or
//!   rules retries out; [`context`]: [`JobContext`], what a handler gets.
//! - private: `job` (one job's run: slot, handler, panic, ack/fail),
//!   `heartbeat` (the batched heartbeat task), `inflight` (the book of held
//!   leases), `backoff` (jittered exponential backoff).
//!
//! Nothing is logged unless the application installs a `tracing`
//! subscriber (e.g. `tracing_subscriber::fmt::init()`).
//!
//! # Producing jobs
//!
//! ```no_run
//! use jobq_client::{Client, EnqueueOptions};
//!
//! # async fn demo() -> jobq_client::Result<()> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let email = serde_json::json!({ "order": "order-4711", "to": "ada@example.com" });
//! let added = client
//!     .submit_json("emails", "send-email", &email, EnqueueOptions::new().key("order-4711"))
//!     .await?;
//! println!("{} created={} status={}", added.job.id, added.created, added.job.status);
//! # Ok(()) }
//! ```
//!
//! # Running jobs
//!
//! ```no_run
//! use std::time::Duration;
//! use jobq_client::{CancellationToken, HandlerError, JobContext, Worker};
//!
//! # async fn demo() -> jobq_client::Result<()> {
//! let shutdown = CancellationToken::new();
//! let worker = Worker::builder("http://127.0.0.1:50051")
//!     .queues(["emails"])
//!     .worker_id("w1")
//!     .capacity(4)
//!     .lease(Duration::from_secs(30))
//!     .drain_timeout(Duration::from_secs(10))
//!     // Drains on SIGINT/SIGTERM, and on `shutdown.cancel()`.
//!     .handle_signals(true)
//!     .shutdown(shutdown.clone())
//!     .handler("send-email", |ctx: JobContext| async move {
//!         if ctx.attempt() > 1 {
//!             // An earlier run may have sent it: check by ctx.key() first.
//!         }
//!         // A payload that does not decode dead-letters the job at once.
//!         let _email: serde_json::Value = ctx.json()?;
//!         Err(HandlerError::retry_after("smtp busy", Duration::from_secs(60)))
//!     })
//!     .build();
//! worker.run().await
//! # }
//! ```
//!
//! Delivery is at least once: a job whose worker died mid-run is delivered
//! again, so handlers must be idempotent on the job's domain key.
#![warn(missing_docs)]

mod backoff;
pub mod builder;
pub mod client;
pub mod connect;
pub mod context;
pub mod error;
pub mod handler;
mod heartbeat;
mod inflight;
mod job;
pub mod kind;
mod loopback;
mod metrics;
pub mod model;
mod operator;
pub mod options;
mod shared;
mod signals;
pub mod trace;
pub mod typed;
pub mod worker;

pub use builder::{WorkerBuilder, WorkerTarget};
pub use client::Client;
pub use connect::{Connect, Credentials};
pub use context::JobContext;
pub use error::{Error, Result};
pub use handler::{HandlerError, HandlerResult};
pub use jobq::pb;
pub use kind::JobKind;
pub use model::{
    Attempt, EnqueueOutcome, Enqueued, Job, JobId, KeyScope, Outcome, Progress, QueuePolicy,
    QueueStats, RateLimit, Rejected, Schedule, Status,
};
pub use options::{EnqueueOptions, FailOptions};
/// The shutdown token [`WorkerBuilder::shutdown`] takes, re-exported so the
/// tokio-util version always matches.
pub use tokio_util::sync::CancellationToken;
pub use typed::{JobFilter, JobPage, NewJob};
pub use worker::Worker;
