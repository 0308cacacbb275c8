//! `/metrics`: OpenMetrics for Prometheus (which asks for it), the classic
//! Prometheus text format for everyone else.

use std::sync::Arc;

use axum::{
    extract::State,
    http::{header, HeaderMap},
    response::IntoResponse,
};

use super::{Web, WebError};
use crate::{metrics::Format, store::Store};

/// The scrape.
pub async fn scrape<S: Store>(
    State(web): State<Arc<Web<S>>>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, WebError> {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let stats = web.stats.get(&*web.store).await?;
    if let Some(usage) = web.store.notification_queue_usage().await? {
        web.metrics.notification_queue_usage(usage);
    }
    let text = web.metrics.render(&stats, (web.streams)(), format)?;
    Ok(([(header::CONTENT_TYPE, format.content_type())], text))
}
