//! `/jobs`: jobs filtered by queue, status, kind and key, a page at a time;
//! and `POST /retry`, which brings back every dead letter matching a filter.

use std::{sync::Arc, time::SystemTime};

use axum::{
    extract::{Query, State},
    response::Redirect,
    Extension, Form,
};
use maud::{html, Markup};
use serde::Deserialize;

use super::{layout, Web, WebError};
use crate::{
    auth::{Role, Who},
    error::Error,
    job::{JobId, Status},
    store::{ListFilter, Store},
    validate,
};

/// Jobs per page.
const PAGE: usize = 50;
/// Most dead letters one "retry all" click brings back...
const RETRY_ALL_LIMIT: usize = 10_000;
/// ...and most it reads to find them (a `kind` or a token's queues may
/// match few of them).
const RETRY_ALL_EXAMINED: usize = 10 * RETRY_ALL_LIMIT;

/// The filter, from the query string (or the retry form).
#[derive(Debug, Default, Deserialize)]
pub struct Filter {
    #[serde(default)]
    queue: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    after: String,
    #[serde(default)]
    retried: Option<usize>,
}

fn status(s: &str) -> Result<Option<Status>, Error> {
    Status::ALL
        .into_iter()
        // Any case, as the CLI's --status.
        .find(|st| st.to_string().eq_ignore_ascii_case(s))
        .map(Some)
        .or_else(|| s.is_empty().then_some(None))
        .ok_or_else(|| Error::InvalidArgument(format!("unknown status {s:?}")))
}

fn opt(field: &str, s: &str) -> Result<Option<String>, Error> {
    if s.is_empty() {
        return Ok(None);
    }
    validate::name(field, s)?;
    Ok(Some(s.to_owned()))
}

impl Filter {
    // The struct update keeps this compiling as ListFilter gains options.
    #[allow(clippy::needless_update)]
    fn list(&self, after: Option<JobId>, limit: usize) -> Result<ListFilter, Error> {
        Ok(ListFilter {
            queue: opt("queue", &self.queue)?,
            status: status(&self.status)?,
            key: opt("key", &self.key)?,
            after,
            limit,
            // The table shows no payloads.
            omit_payload: true,
            ..ListFilter::default()
        })
    }

    fn query(&self) -> String {
        let mut parts = Vec::new();
        for (name, value) in [
            ("queue", &self.queue),
            ("status", &self.status),
            ("kind", &self.kind),
            ("key", &self.key),
        ] {
            if !value.is_empty() {
                parts.push(format!("{name}={value}"));
            }
        }
        parts.join("&")
    }
}

/// The filter's form.
fn form(filter: &Filter) -> Markup {
    html! {
        form method="get" action="/jobs" {
            input name="queue" placeholder="queue" value=(filter.queue);
            " "
            select name="status" {
                option value="" selected[filter.status.is_empty()] { "any status" }
                @for s in Status::ALL {
                    option value=(s) selected[filter.status == s.to_string()] { (s) }
                }
            }
            " "
            input name="kind" placeholder="kind" value=(filter.kind);
            " "
            input name="key" placeholder="key" value=(filter.key);
            " "
            button type="submit" { "Filter" }
        }
    }
}

/// The page.
pub async fn page<S: Store>(
    State(web): State<Arc<Web<S>>>,
    Extension(who): Extension<Who>,
    Query(filter): Query<Filter>,
) -> Result<Markup, WebError> {
    // Any case in, the canonical name out: the form and its Retry button
    // compare with it.
    let mut filter = filter;
    if let Some(s) = status(&filter.status)? {
        filter.status = s.to_string();
    }
    // As ListJobs: a queue the token may not read is refused, not shown
    // empty (with its Retry form).
    if !filter.queue.is_empty() && !who.sees(&filter.queue) {
        return Err(Error::PermissionDenied(format!(
            "this token may not read queue {:?}",
            filter.queue
        ))
        .into());
    }
    let after = if filter.after.is_empty() {
        None
    } else {
        Some(validate::job_id("after", &filter.after)?)
    };
    opt("kind", &filter.kind)?;
    // As ListJobs: a token that reads only some queues lists one of them.
    // Across queues, its pages would step through the others' jobs, and
    // the next-page link would name them.
    if filter.queue.is_empty() && !who.sees_everything() {
        let queues: Vec<String> = web
            .stats
            .get(&*web.store)
            .await?
            .iter()
            .map(|s| s.queue.clone())
            .filter(|q| who.sees(q))
            .collect();
        let rest = filter.query();
        let body = html! {
            (form(&filter))
            p #pick { "This token reads only some queues: pick one." }
            ul #queues {
                @for q in &queues {
                    li { a href={ "/jobs?queue=" (q) "&" (rest) } { (q) } }
                }
            }
        };
        return Ok(layout::page("Jobs", body));
    }
    let page = web.store.list(filter.list(after, PAGE)?).await?;
    // The kind filter applies to each page as it is read.
    let jobs: Vec<_> = page
        .jobs
        .iter()
        .filter(|j| filter.kind.is_empty() || j.kind == filter.kind)
        .collect();
    let now = web.store.now();
    let body = html! {
        (form(&filter))
        @if let Some(n) = filter.retried {
            p #flash { "Retried " (n) " dead letters." }
        }
        @if filter.status == "FAILED" {
            form.inline method="post" action="/retry" {
                input type="hidden" name="queue" value=(filter.queue);
                input type="hidden" name="status" value="FAILED";
                input type="hidden" name="kind" value=(filter.kind);
                input type="hidden" name="key" value=(filter.key);
                button #retry-all type="submit" { "Retry every dead letter that matches" }
            }
        }
        table #jobs {
            thead { tr {
                th { "id" } th { "queue" } th { "kind" } th { "key" } th { "status" }
                th.num { "attempts" } th { "run at" } th { "last error" } th {}
            } }
            tbody {
                @for job in &jobs {
                    tr data-id=(job.id) {
                        td { a href={ "/jobs/" (job.id) } { (job.id) } }
                        td { (job.queue) }
                        td { (job.kind) }
                        td { (job.key.as_deref().unwrap_or("")) }
                        td class=(job.status) { (job.status) }
                        td.num { (job.attempts) "/" (job.max_attempts) }
                        td {
                            @if job.status == Status::Pending && job.run_at > now {
                                (layout::time(job.run_at))
                            } @else if job.status == Status::Pending {
                                "due"
                            } @else { "" }
                        }
                        td.error { (job.last_error.as_deref().unwrap_or("")) }
                        td {
                            @if job.status == Status::Failed {
                                form.inline method="post" action={ "/jobs/" (job.id) "/retry" } {
                                    button type="submit" { "Retry" }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if jobs.is_empty() { p { "No jobs match." } }
        @if let Some(next) = page.next {
            a #next href={ "/jobs?" (filter.query()) "&after=" (next) } { "Next page →" }
        }
    };
    Ok(layout::page("Jobs", body))
}

/// Retries every FAILED job that matches the filter (up to a bound), then
/// shows them.
pub async fn retry_matching<S: Store>(
    State(web): State<Arc<Web<S>>>,
    Extension(who): Extension<Who>,
    Form(mut filter): Form<Filter>,
) -> Result<Redirect, WebError> {
    filter.status = "FAILED".into();
    opt("kind", &filter.kind)?;
    let mut after = None;
    let (mut retried, mut examined) = (0, 0);
    'pages: while retried < RETRY_ALL_LIMIT && examined < RETRY_ALL_EXAMINED {
        let page = web.store.list(filter.list(after, 500)?).await?;
        for job in &page.jobs {
            if retried >= RETRY_ALL_LIMIT {
                break 'pages;
            }
            examined += 1;
            if !filter.kind.is_empty() && job.kind != filter.kind
                || !who.may(Role::Admin, &job.queue)
            {
                continue;
            }
            // Retried by someone else meanwhile: skip it.
            if web.store.retry(job.id, SystemTime::now()).await.is_ok() {
                retried += 1;
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    filter.status = String::new();
    Ok(Redirect::to(&format!(
        "/jobs?{}&retried={retried}",
        filter.query()
    )))
}
