//! Typed client and worker runtime for jobq.
//!
//! # Layout
//! - [`client`]: [`Client`], one typed method per `JobQueue` RPC, plus
//!   JSON helpers.
//! - [`options`]: [`EnqueueOptions`] (key, attempts, delay) and
//!   [`FailOptions`] (retry delay, fatal).
//! - [`error`]: [`enum@Error`], the crate's one error type, and [`Result`].
//!
//! # Producing jobs
//!
//! ```no_run
//! use jobq_client::{Client, EnqueueOptions};
//!
//! # async fn demo() -> jobq_client::Result<()> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let email = serde_json::json!({ "order": "order-4711", "to": "ada@example.com" });
//! let (job, created) = client
//!     .enqueue_json("emails", "send-email", &email, EnqueueOptions::new().key("order-4711"))
//!     .await?;
//! println!("{} created={created}", job.id);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod client;
pub mod error;
pub mod options;

pub use client::Client;
pub use error::{Error, Result};
pub use jobq::pb;
pub use options::{EnqueueOptions, FailOptions};
