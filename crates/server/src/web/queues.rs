//! `/`: every queue with its counts, the oldest due job, and the rates.

use std::{sync::Arc, time::Duration};

use axum::{extract::State, Extension};
use maud::{html, Markup, PreEscaped};

use super::{layout, Web, WebError};
use crate::{auth::Who, policy::QueuePolicy, store::Store};

/// A policy in a cell: `max 10 · per group 1`, or `—`.
fn policy_text(p: &QueuePolicy) -> String {
    let mut parts = Vec::new();
    if p.max_running > 0 {
        parts.push(format!("max {}", p.max_running));
    }
    if p.group_max_running > 0 {
        parts.push(format!("per group {}", p.group_max_running));
    }
    if let Some(r) = &p.rate {
        parts.push(format!("{}/{}", r.limit, humantime::format_duration(r.per)));
    }
    if parts.is_empty() {
        "—".to_owned()
    } else {
        parts.join(" · ")
    }
}

/// The page.
pub async fn page<S: Store>(
    State(web): State<Arc<Web<S>>>,
    Extension(who): Extension<Who>,
) -> Result<Markup, WebError> {
    let mut stats = Vec::clone(&*web.stats.get(&*web.store).await?);
    stats.retain(|s| who.sees(&s.queue));
    let (minute, ten) = (
        web.rates.over(Duration::from_secs(60)),
        web.rates.over(Duration::from_secs(600)),
    );
    let streams = (web.streams)();
    let body = html! {
        (PreEscaped(r#"<meta http-equiv="refresh" content="5">"#))
        @if who.sees_everything() { p.muted {
            "Enqueued " strong #enqueue-rate { (format!("{:.1}", minute.enqueued)) } "/min over the last minute ("
            (format!("{:.1}", ten.enqueued)) "/min over 10 min) · acked "
            strong #ack-rate { (format!("{:.1}", minute.acked)) } "/min ("
            (format!("{:.1}", ten.acked)) "/min over 10 min) · "
            (streams) " Lease streams open"
        } }
        @if stats.is_empty() {
            p { "No jobs yet." }
        } @else {
            table #queues {
                thead { tr {
                    th { "queue" } th.num { "pending" } th.num { "running" } th.num { "done" }
                    th.num { "failed" } th { "oldest due job waits" } th { "policy" } th.num { "held" }
                } }
                tbody {
                    @for q in &stats {
                        tr data-queue=(q.queue) {
                            td {
                                a href={ "/jobs?queue=" (q.queue) } { (q.queue) }
                                @if q.paused { " " span.paused title="PauseQueue: nothing is taken from it" { "paused" } }
                            }
                            td.num.pending { a href={ "/jobs?queue=" (q.queue) "&status=PENDING" } { (q.pending) } }
                            td.num.running { a href={ "/jobs?queue=" (q.queue) "&status=RUNNING" } { (q.running) } }
                            td.num.done { a href={ "/jobs?queue=" (q.queue) "&status=DONE" } { (q.done) } }
                            td.num.failed { a href={ "/jobs?queue=" (q.queue) "&status=FAILED" } { (q.failed) } }
                            td { (q.oldest_pending_age.map_or_else(|| "—".to_owned(), layout::span)) }
                            td.policy { (policy_text(&q.policy)) }
                            td.num.held title="due jobs the policy holds back: by max_running / by group_max_running / by rate / by group rate" {
                                @if q.policy.is_empty() { "—" } @else {
                                    (q.held_max_running) " / " (q.held_group_max_running) " / " (q.held_rate) " / " (q.held_group_rate)
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(layout::page("Queues", body))
}
