//! The jobq server.
//!
//! Layout:
//! - [`auth`]: bearer tokens (`--auth-tokens`), the interceptor that names
//!   the caller, and the one per-RPC check of role, queue and lease owner.
//! - [`job`]: the domain types (job, status, attempt, lease, ids).
//! - [`machine`]: the pure state machine `apply(job, event, now)` that every
//!   store calls; backoff.
//! - [`error`]: the error enum and its one mapping to gRPC status codes.
//! - [`store`]: the `Store` trait (the storage seam) and its sled
//!   implementation with group-commit flushing.
//! - [`config`]: every flag of `jobq serve`, with defaults and limits.
//! - [`validate`]: turns wire requests into validated domain commands.
//! - [`convert`]: domain types to and from `jobq::pb`.
//! - [`schedule`]: schedules (cron in a time zone) and the pure rules of
//!   which tick to enqueue; [`scheduler`]: the task that enqueues them.
//! - [`reaper`]: reclaims expired leases, woken by the nearest deadline;
//!   purges old DONE/FAILED jobs.
//! - [`waiter`]: long-poll waiting for a due job, without polling.
//! - [`limits`]: Lease streams per token, and the in-flight request bytes
//!   budget (a tower layer).
//! - [`leases`]: the Lease streams: push delivery, capacity, stream-drop
//!   reclaim and revocation.
//! - [`service`]: the gRPC glue (`JobQueue` trait impl); no business logic.
//! - [`tls`]: the listener's TLS and mTLS settings (rustls, ring).
//! - [`server`]: `run`: builds the tonic server with reflection and health,
//!   and shuts it down on a `CancellationToken`.
//! - [`connections`]: the accept loop and each connection's limits
//!   (`--max-connections`, handshake and idle timeouts, EMFILE backoff,
//!   closing at shutdown).
//! - [`fds`]: the fd limit raised at start, and the descriptors kept for
//!   the store out of both listeners' reach.
//! - [`metrics`]: the Prometheus registry, counted from the store's facts;
//!   [`rpc_timing`]: the tower layer that times every RPC.
//! - [`web`]: the HTTP listener: `/metrics` and the dashboard.
#![warn(missing_docs)]

pub mod auth;
pub mod clock;
pub mod config;
pub mod connections;
pub mod convert;
pub mod error;
pub mod fds;
pub mod job;
pub mod leases;
pub mod limits;
pub mod liveness;
pub mod machine;
pub mod metrics;
pub mod policy;
pub mod reaper;
pub mod rpc_timing;
pub mod schedule;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod store;
pub mod tls;
pub mod validate;
pub mod waiter;
pub mod watch;
pub mod web;

pub use config::Config;
pub use error::{Error, Result};
pub use server::{run, serve};
