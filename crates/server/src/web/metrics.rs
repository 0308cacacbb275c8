//! `/metrics`: the Prometheus text exposition format.

use std::{sync::Arc, time::SystemTime};

use axum::{extract::State, http::header, response::IntoResponse};

use super::{Web, WebError};
use crate::store::Store;

/// The scrape.
pub async fn scrape<S: Store>(
    State(web): State<Arc<Web<S>>>,
) -> Result<impl IntoResponse, WebError> {
    let stats = web.store.stats(None, SystemTime::now()).await?;
    let text = web.metrics.render(&stats, (web.streams)())?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    ))
}
