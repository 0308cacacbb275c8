//! `/jobs/{id}`: one job — payload, fields, and its attempts as a
//! timeline — and `POST /jobs/{id}/retry`.

use std::{sync::Arc, time::SystemTime};

use axum::{
    extract::{Path, State},
    response::Redirect,
    Extension,
};
use maud::{html, Markup};

use super::{layout, Web, WebError};
use crate::{
    auth::{self, Access, Who},
    job::{Job, Outcome, Status},
    store::Store,
    validate,
};

/// Most payload bytes the job page shows (`jobq get` shows it whole).
const SHOWN_PAYLOAD: usize = 64 * 1024;

/// The payload as people read it: pretty JSON when it parses, text when it
/// is UTF-8, hex otherwise; at most [`SHOWN_PAYLOAD`] bytes of it, and
/// pretty only while that stays small. Pretty-printing indents every
/// element: 1 MiB of deeply nested JSON became a 130 MB page.
fn payload(job: &Job) -> String {
    readable(&job.payload, job)
}

/// [`payload`]'s rules for any bytes of the job (its payload, its result).
fn readable(all: &[u8], job: &Job) -> String {
    if all.len() <= SHOWN_PAYLOAD {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(all) {
            if let Ok(pretty) = serde_json::to_string_pretty(&value) {
                if pretty.len() <= 4 * SHOWN_PAYLOAD {
                    return pretty;
                }
            }
        }
    }
    let shown = &all[..all.len().min(SHOWN_PAYLOAD)];
    let mut text = match std::str::from_utf8(shown) {
        Ok(text) => text.to_owned(),
        // Text cut in the middle of a character.
        Err(e) if e.error_len().is_none() => {
            String::from_utf8_lossy(&shown[..e.valid_up_to()]).into_owned()
        }
        Err(_) => shown.iter().map(|b| format!("{b:02x}")).collect(),
    };
    if all.len() > shown.len() {
        text.push_str(&format!(
            "\n… {} more bytes not shown (`jobq get {}` shows them)",
            all.len() - shown.len(),
            job.id
        ));
    }
    text
}

fn outcome(o: Option<Outcome>) -> &'static str {
    match o {
        None => "RUNNING",
        Some(Outcome::Acked) => "ACKED",
        Some(Outcome::Failed) => "FAILED_ATTEMPT",
        Some(Outcome::LeaseExpired) => "LEASE_EXPIRED",
        Some(Outcome::WorkerDisconnected) => "WORKER_DISCONNECTED",
        Some(Outcome::Revoked) => "REVOKED",
        Some(Outcome::Snoozed) => "SNOOZED",
    }
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
fn trace_id(job: &crate::job::Job) -> Option<&str> {
    let mut parts = job.metadata.get("traceparent")?.split('-');
    let (_version, trace) = (parts.next()?, parts.next()?);
    (trace.len() == 32 && trace.bytes().all(|b| b.is_ascii_hexdigit())).then_some(trace)
}

/// The page.
pub async fn page<S: Store>(
    State(web): State<Arc<Web<S>>>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
) -> Result<Markup, WebError> {
    let id = validate::job_id("id", &id)?;
    auth::authorize(&*web.store, &who, Access::ReadJob(id)).await?;
    let job = web.store.get(id).await?;
    let now = web.store.now();
    let body = html! {
        table #fields {
            tr { th { "status" } td #status class=(job.status) { (job.status) } }
            tr { th { "queue" } td { a href={ "/jobs?queue=" (job.queue) } { (job.queue) } } }
            tr { th { "kind" } td { (job.kind) } }
            tr { th { "key" } td { (job.key.as_deref().unwrap_or("—")) } }
            tr { th { "attempts" } td #attempts { (job.attempts) " of " (job.max_attempts) } }
            tr { th { "snoozes" } td #snoozes { (job.snoozes) " of " (job.max_snoozes) } }
            tr { th { "priority" } td #priority { (job.priority) } }
            @if let Some(group) = &job.group { tr { th { "group" } td #group { (group) } } }
            tr { th { "enqueued" } td { (layout::time(job.enqueued_at)) } }
            tr { th { "run at" } td { (layout::time(job.run_at)) } }
            @if let Some(lease) = &job.lease {
                tr { th { "leased to" } td { (lease.worker_id) " until " (layout::time(lease.expires_at))
                    " (" (layout::span(lease.expires_at.duration_since(now).unwrap_or_default())) " left)" } }
            }
            @if let Some(p) = job.progress_now() {
                tr { th { "progress" } td #progress {
                    progress max="100" value=(p.percent) { (p.percent) "%" } " " (p.percent) "% "
                    (p.message) span.muted { " · " (layout::time(p.reported_at)) }
                } }
            }
            tr { th { "finished" } td { (layout::maybe_time(job.finished_at)) } }
            tr { th { "last error" } td.error { (job.last_error.as_deref().unwrap_or("—")) } }
        }
        @if job.status == Status::Failed {
            form method="post" action={ "/jobs/" (job.id) "/retry" } {
                button #retry type="submit" { "Retry this job" }
            }
        }
        h2 { "Attempts" }
        @if job.history.is_empty() {
            p.muted { "Not run yet." }
        } @else {
            ol.timeline #history {
                @for (n, a) in job.history.iter().enumerate() {
                    li.attempt {
                        strong { "Attempt " (n + 1) } " · "
                        span class=(outcome(a.outcome)) { (outcome(a.outcome)) }
                        " · worker " code { (a.worker_id) }
                        br;
                        span.muted {
                            (layout::time(a.started_at)) " → " (layout::maybe_time(a.ended_at))
                            @if let Some(end) = a.ended_at {
                                " (" (layout::span(end.duration_since(a.started_at).unwrap_or_default())) ")"
                            }
                        }
                        @if let Some(err) = &a.error {
                            br; span.error { (err) }
                        }
                    }
                }
            }
        }
        h2 { "Metadata" }
        @if job.metadata.is_empty() {
            p.muted { "None." }
        } @else {
            table #metadata {
                @if let Some(trace) = trace_id(&job) {
                    tr { th { "trace id" } td { code #trace-id { (trace) } } }
                }
                @for (k, v) in &job.metadata {
                    tr { th { (k) } td { code { (v) } } }
                }
            }
        }
        h2 { "Payload" }
        pre #payload { (payload(&job)) }
        @if let Some(result) = &job.result {
            h2 { "Result" }
            pre #result { (readable(result, &job)) }
        }
    };
    Ok(layout::page(&format!("Job {}", job.id), body))
}

/// Retries one dead letter, then shows it.
pub async fn retry<S: Store>(
    State(web): State<Arc<Web<S>>>,
    Extension(who): Extension<Who>,
    Path(id): Path<String>,
) -> Result<Redirect, WebError> {
    let id = validate::job_id("id", &id)?;
    auth::authorize(&*web.store, &who, Access::Administer(id)).await?;
    web.store.retry(id, SystemTime::now()).await?;
    Ok(Redirect::to(&format!("/jobs/{id}")))
}
