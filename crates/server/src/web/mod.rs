//! The HTTP side of `jobq serve` (`--http-listen`): Prometheus `/metrics`
//! and the dashboard, server-rendered HTML (maud) from the same store calls
//! the gRPC service makes. No JavaScript is needed to view or act; the
//! queues page refreshes itself every few seconds.
//!
//! One file per page: [`queues`] (`/`), [`jobs`] (`/jobs`, and retrying
//! every dead letter that matches a filter), [`job`] (`/jobs/{id}` and its
//! Retry), [`metrics`] (`/metrics`); [`layout`] is the page shell.

mod job;
mod jobs;
mod layout;
mod metrics;
mod queues;

use std::sync::Arc;

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
    Router,
};
use tokio_util::sync::CancellationToken;

use crate::{
    error::{Error, Result},
    metrics::{Metrics, Rates},
    store::Store,
};

/// What the pages read from.
pub struct Web<S> {
    /// The store, as the gRPC service sees it.
    pub store: Arc<S>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Enqueue and ack rates.
    pub rates: Arc<Rates>,
    /// How many Lease streams are open.
    pub streams: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// The routes.
pub fn router<S: Store>(web: Arc<Web<S>>) -> Router {
    Router::new()
        .route("/", get(queues::page::<S>))
        .route("/jobs", get(jobs::page::<S>))
        .route("/retry", post(jobs::retry_matching::<S>))
        .route("/jobs/{id}", get(job::page::<S>))
        .route("/jobs/{id}/retry", post(job::retry::<S>))
        .route("/metrics", get(metrics::scrape::<S>))
        .with_state(web)
}

/// Serves `router` on `listener` until `shutdown` fires.
///
/// # Errors
/// When the listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(|e| Error::Io(format!("http listener: {e}")))
}

/// A store error as an HTTP answer: the gRPC code decides the status.
struct WebError(Error);

impl From<Error> for WebError {
    fn from(err: Error) -> Self {
        WebError(err)
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = match self.0.code() {
            tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
            tonic::Code::NotFound => StatusCode::NOT_FOUND,
            tonic::Code::FailedPrecondition | tonic::Code::Aborted => StatusCode::CONFLICT,
            tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(cause = %self.0, "dashboard request failed");
            "internal error; see the server log".to_owned()
        } else {
            self.0.to_string()
        };
        (
            status,
            layout::page("Error", maud::html! { p.error { (message) } }),
        )
            .into_response()
    }
}
