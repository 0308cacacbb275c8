//! The HTTP side of `jobq serve` (`--http-listen`): Prometheus `/metrics`
//! and the dashboard, server-rendered HTML (maud) from the same store calls
//! the gRPC service makes. No JavaScript is needed to view or act; the
//! queues page refreshes itself every few seconds.
//!
//! One file per page: [`queues`] (`/`), [`jobs`] (`/jobs`, and retrying
//! every dead letter that matches a filter), [`job`] (`/jobs/{id}` and its
//! Retry), [`metrics`] (`/metrics`); [`layout`] is the page shell;
//! [`login`] asks for a token when tokens are on (`/login`, `/logout`,
//! and the guard in front of every other route), [`sessions`] keeps the
//! browsers' logins; [`stats`] caches the queue counts; [`listener`]
//! accepts connections under their cap and timeouts.

mod job;
mod jobs;
mod layout;
pub mod listener;
mod login;
mod metrics;
mod queues;
pub mod sessions;
pub mod stats;

use std::sync::Arc;

use axum::{
    http::StatusCode,
    middleware,
    response::{IntoResponse, Response},
    routing::{get, post},
    Router,
};

use crate::{
    auth::Auth,
    error::Error,
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
    /// The tokens (off: every page is open).
    pub auth: Auth,
    /// `/metrics` needs no token (`--metrics-token-free`).
    pub metrics_token_free: bool,
    /// Host names answered to without tokens (`--http-allow-host`).
    pub allow_hosts: Vec<String>,
    /// The queue counts, reused for `--stats-cache`.
    pub stats: stats::StatsCache,
    /// The browsers' logins.
    pub sessions: sessions::Sessions,
    /// Browsers reach the listener over https (`--http-behind-tls`).
    pub behind_tls: bool,
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
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&web),
            login::guard::<S>,
        ))
        .route("/login", get(login::form).post(login::submit::<S>))
        .route("/logout", post(login::logout::<S>))
        .layer(middleware::from_fn(same_origin_posts))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&web),
            known_host::<S>,
        ))
        .layer(middleware::map_response(security_headers))
        .with_state(web)
}

/// Without tokens, the dashboard answers only requests addressed to an IP
/// address, `localhost` (or a name under it) or a `--http-allow-host`
/// name. A page on `http://evil.example:9464` that re-points its own name
/// at 127.0.0.1 (DNS rebinding) is same-origin with the dashboard as far
/// as the browser knows, and could read every job and retry every dead
/// letter; its requests still carry `Host: evil.example`. With tokens,
/// such a page has no token (the cookie belongs to the real name), so no
/// name is refused. `/metrics` (counts, no jobs) is left out: Prometheus
/// scrapes by whatever name its targets say.
async fn known_host<S: Store>(
    axum::extract::State(web): axum::extract::State<Arc<Web<S>>>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    if web.auth.enabled() || req.uri().path() == "/metrics" {
        return next.run(req).await;
    }
    let host = match req.headers().get(axum::http::header::HOST) {
        Some(value) => value.to_str().ok(),
        // HTTP/2 carries it in the URI (`:authority`).
        None => req.uri().host(),
    };
    match host {
        Some(host) if host_allowed(host, &web.allow_hosts) => next.run(req).await,
        // No name, or one that is not text: refused as well.
        host => (
            StatusCode::FORBIDDEN,
            layout::page(
                "Forbidden",
                maud::html! {
                    p.error {
                        "This dashboard has no tokens, so it answers only to IP addresses, "
                        "localhost and the names given with --http-allow-host; "
                        (host.unwrap_or("a request without a readable Host")) " is none of them."
                    }
                },
            ),
        )
            .into_response(),
    }
}

/// Whether `host` (a `Host` header: a name or address, maybe a port) is
/// an IP address, `localhost`, a name under `localhost`, or in `allowed`.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let host = host.trim();
    // `[::1]:9464`, `[::1]`, `127.0.0.1:9464`, `name:9464`, `name`.
    // The name and, after a colon, the port (which must be digits).
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((address, "")) => (address, None),
            Some((address, after)) => match after.strip_prefix(':') {
                Some(port) => (address, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if !port_ok || name.is_empty() {
        return false;
    }
    name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed
            .iter()
            .map(|a| a.trim())
            .any(|a| a == "*" || a.trim_end_matches('.').eq_ignore_ascii_case(&name))
}

/// No page may be framed by another site (a framed dashboard's own Retry
/// button would pass the same-origin check: clickjacking), nor sniffed as
/// another content type, nor leak its address (job ids, filters) to other
/// sites. `same-origin`, not `no-referrer`: under `no-referrer` a browser
/// sends `Origin: null` on the dashboard's own POSTs, which
/// [`same_origin_posts`] would refuse for a browser that sends no
/// `Sec-Fetch-Site`.
async fn security_headers(mut res: Response) -> Response {
    use axum::http::{header, HeaderValue};
    let h = res.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

/// Refuses a POST another site's page made the browser send (cross-site
/// request forgery): with tokens off, the default on loopback, a page the
/// operator visits could otherwise retry every dead letter. A browser says
/// where the page came from in `Sec-Fetch-Site` (every current browser
/// sends it): `same-origin` for the dashboard's own forms. An older one
/// sends only `Origin`, which must then name the address the request went
/// to (`Host`, or `X-Forwarded-Host` behind a proxy that rewrites `Host`).
/// Tools that send neither header (curl) are not browsers and pass.
async fn same_origin_posts(req: axum::extract::Request, next: middleware::Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let headers = req.headers();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let allowed = match (text("sec-fetch-site"), text("origin")) {
        (Some(site), _) => matches!(site, "same-origin" | "none"),
        (None, None) => true,
        (None, Some(origin)) => {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            // The first X-Forwarded-Host is the one the browser used (each
            // proxy on the way appends its own).
            let forwarded = text("x-forwarded-host")
                .and_then(|hosts| hosts.split(',').next())
                .map(str::trim);
            authority.is_some_and(|a| Some(a) == text("host") || Some(a) == forwarded)
        }
    };
    if allowed {
        return next.run(req).await;
    }
    (
        StatusCode::FORBIDDEN,
        layout::page(
            "Forbidden",
            maud::html! { p.error { "a POST from another site's page is refused" } },
        ),
    )
        .into_response()
}

pub use listener::{serve, HttpLimits};

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
            tonic::Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
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

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn without_tokens_only_addresses_localhost_and_allowed_names_pass() {
        let none: &[String] = &[];
        for host in [
            "127.0.0.1:9464",
            "127.0.0.1",
            "[::1]:9464",
            "[::1]",
            "10.0.0.7:80",
            "localhost:9464",
            "LOCALHOST",
            "localhost.",
            "jobq.localhost:9464",
        ] {
            assert!(host_allowed(host, none), "{host}");
        }
        for host in [
            "evil.example:9464",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "[::1]evil",
            "[::1",
            "127.0.0.1:x",
            "",
            ":9464",
        ] {
            assert!(!host_allowed(host, none), "{host}");
        }
        let allowed = ["jobq.internal".to_owned()];
        assert!(host_allowed("JOBQ.internal:9464", &allowed));
        assert!(!host_allowed("other.internal", &allowed));
        assert!(host_allowed("anything", &["*".to_owned()]));
        assert!(host_allowed("anything", &[" * ".to_owned()]));
    }
}
