//! The page shell: title, navigation (with a Log out button for a
//! browser signed in with a session), a little CSS. No scripts.

use std::{future::Future, time::SystemTime};

use maud::{html, Markup, PreEscaped, DOCTYPE};

const CSS: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 10px 24px; display: flex; gap: 24px; align-items: baseline; }
header a { color: #cfd6e4; text-decoration: none; } header strong { font-size: 18px; }
main { padding: 16px 24px; }
table { border-collapse: collapse; background: #fff; width: 100%; margin: 8px 0 16px; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid #e3e6eb; vertical-align: top; }
th { background: #eef0f4; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.PENDING { color: #8a6d00; } .RUNNING { color: #0b5cad; } .DONE { color: #1a7f37; } .FAILED { color: #b42318; }
.ACKED { color: #1a7f37; } .FAILED_ATTEMPT, .LEASE_EXPIRED, .WORKER_DISCONNECTED, .REVOKED { color: #b42318; }
pre { background: #fff; border: 1px solid #e3e6eb; padding: 10px; overflow: auto; max-height: 400px; }
form.inline { display: inline; } .error { color: #b42318; } .muted { color: #6b7280; }
ol.timeline { list-style: none; padding-left: 0; border-left: 3px solid #cfd6e4; margin-left: 8px; }
ol.timeline li { margin: 0 0 12px 0; padding-left: 14px; }
button { cursor: pointer; }
header form { margin-left: auto; }
"#;

tokio::task_local! {
    /// Set while a request signed in with a session cookie is handled.
    static SIGNED_IN: bool;
}

/// Runs a request's handler for a browser signed in with a session: its
/// pages show the Log out button.
pub async fn signed_in<F: Future>(handler: F) -> F::Output {
    SIGNED_IN.scope(true, handler).await
}

/// [`signed_in`], for a page rendered outside a handler.
pub fn signed_in_sync<R>(render: impl FnOnce() -> R) -> R {
    SIGNED_IN.sync_scope(true, render)
}

/// A whole page.
pub fn page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · jobq" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    strong { "jobq" }
                    a href="/" { "Queues" }
                    a href="/jobs" { "Jobs" }
                    a href="/jobs?status=FAILED" { "Dead letters" }
                    a href="/metrics" { "Metrics" }
                    @if SIGNED_IN.try_with(|s| *s).unwrap_or(false) {
                        form #logout method="post" action="/logout" {
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// A time as RFC 3339 (UTC, milliseconds).
pub fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// An optional time, or a dash.
pub fn maybe_time(t: Option<SystemTime>) -> String {
    t.map_or_else(|| "—".to_owned(), time)
}

/// A duration, rounded for people.
pub fn span(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        let secs = d.as_secs();
        humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
    }
}
