//! The HTTP listener's connections and their limits.
//!
//! `axum::serve` accepts without a cap and keeps a connection that sends
//! nothing, or half a request, forever: a thousand idle connections used
//! to take every file descriptor, and the store's next flush failed. This
//! listener reuses the gRPC listener's accept loop and connection watchdog
//! (connections.rs), so it gets the same behaviour:
//!
//! - **max connections** (`--http-max-connections`): one more is closed
//!   as soon as it is accepted, with a log line at most once a second;
//! - **fd exhaustion**: the accept loop backs off instead of spinning;
//! - **nothing sent** within `--http-header-timeout`: closed;
//! - **idle** (`--http-idle-timeout`): a connection with no request in
//!   flight (no handler running, no response being sent) for that long is
//!   closed; the [`TrackCalls`] layer counts its requests;
//! - **shutdown**: closed once their requests are answered.
//!
//! On top of that, a request head (request line and headers) must arrive
//! in full within `--http-header-timeout` of its first byte: a client that
//! trickles a header a byte at a time is closed ([`HeadClock`]). hyper's
//! own `header_read_timeout` is not used: it also runs while a kept-alive
//! connection waits for its next request, which would make the idle
//! timeout the header timeout. And a request, once its head is in, has
//! `--http-request-timeout` to send its body and be answered
//! ([`deadline`]): a body trickled forever does not hold a connection.

use std::{
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{body::Body, Router};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::Notify,
    task::JoinSet,
    time::Instant,
};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;
use tower::ServiceExt;
use tracing::{debug, info};

use crate::{
    connections::{self, Conn, TrackCalls},
    error::Result,
};

/// The HTTP listener's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long a request head may take, from its first byte (and how long
    /// a new connection may send nothing).
    pub header_timeout: Duration,
    /// How long a connection may have no request in flight.
    pub idle_timeout: Duration,
    /// How long a request may take after its head: its body and its answer.
    pub request_timeout: Duration,
}

/// Whether a connection is reading a request head, and since when.
#[derive(Debug, Default)]
struct HeadClock {
    /// Requests whose handler has not returned.
    busy: AtomicUsize,
    /// When the first byte of a head not yet dispatched arrived.
    started: Mutex<Option<Instant>>,
    /// Wakes the connection's task on a change.
    changed: Notify,
}

impl HeadClock {
    fn started(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.started.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes arrived: with no request in flight, they begin a head.
    fn read(&self) {
        if self.busy.load(Ordering::SeqCst) == 0 {
            let mut started = self.started();
            if started.is_none() {
                *started = Some(Instant::now());
                self.changed.notify_one();
            }
        }
    }

    /// A whole head arrived: its request is being handled.
    fn dispatched(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        *self.started() = None;
        self.changed.notify_one();
        Busy(Arc::clone(self))
    }

    /// When the head being read must be complete.
    fn deadline(&self, timeout: Duration) -> Option<Instant> {
        if self.busy.load(Ordering::SeqCst) > 0 {
            return None;
        }
        self.started().and_then(|at| at.checked_add(timeout))
    }
}

/// A request whose handler runs.
struct Busy(Arc<HeadClock>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_one();
    }
}

/// A connection's socket that tells its [`HeadClock`] about reads.
struct Clocked {
    conn: Conn,
    clock: Arc<HeadClock>,
}

impl AsyncRead for Clocked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.conn).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.read();
        }
        read
    }
}

impl AsyncWrite for Clocked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.conn).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.conn).poll_shutdown(cx)
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` fires
/// and every connection has closed.
///
/// # Errors
/// None today: accept failures are logged and retried.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    shutdown: CancellationToken,
) -> Result<()> {
    info!(
        max_connections = limits.max_connections,
        header_timeout = ?limits.header_timeout,
        idle_timeout = ?limits.idle_timeout,
        "HTTP connection limits"
    );
    let mut incoming = connections::incoming(
        listener,
        connections::Limits {
            max_connections: limits.max_connections,
            max_per_peer: limits.max_connections,
            handshake_bytes: None,
            handshake_timeout: limits.header_timeout,
            idle_timeout: limits.idle_timeout,
            flags: connections::LimitFlags {
                max_connections: "--http-max-connections",
                max_per_peer: "--http-max-connections",
                handshake_timeout: "--http-header-timeout",
                idle_timeout: "--http-idle-timeout",
            },
        },
        shutdown.clone(),
    );
    let router = router.layer(axum::middleware::from_fn_with_state(
        limits.request_timeout,
        deadline,
    ));
    let mut open = JoinSet::new();
    loop {
        tokio::select! {
            next = incoming.next() => match next {
                Some(Ok(conn)) => {
                    open.spawn(serve_one(conn, router.clone(), limits, shutdown.clone()));
                }
                // The accept loop yields no errors; it ends at shutdown.
                Some(Err(_)) => {}
                None => break,
            },
            Some(_) = open.join_next(), if !open.is_empty() => {}
        }
    }
    // The accept loop has stopped; each connection closes once its
    // requests are answered (connections.rs bounds the wait).
    while open.join_next().await.is_some() {}
    Ok(())
}

/// Serves one connection until it ends, its head is too slow, or shutdown.
async fn serve_one(conn: Conn, router: Router, limits: HttpLimits, shutdown: CancellationToken) {
    let info = conn.connect_info();
    let remote = info.remote;
    let clock = Arc::new(HeadClock::default());
    let service = tower::ServiceBuilder::new()
        .layer(TrackCalls)
        .service(router);
    let handler = {
        let clock = Arc::clone(&clock);
        hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            let busy = clock.dispatched();
            req.extensions_mut().insert(info.clone());
            let call = service.clone().oneshot(req.map(Body::new));
            async move {
                let response = call.await;
                drop(busy);
                response
            }
        })
    };
    let io = TokioIo::new(Clocked {
        conn,
        clock: Arc::clone(&clock),
    });
    let connection = http1::Builder::new()
        // Set, not left at hyper's default: with no timer, the default
        // logs a warning on every connection (see the module docs).
        .header_read_timeout(None::<Duration>)
        .serve_connection(io, handler);
    tokio::pin!(connection);
    let mut draining = false;
    loop {
        let deadline = clock.deadline(limits.header_timeout);
        tokio::select! {
            _ = connection.as_mut() => return,
            () = shutdown.cancelled(), if !draining => {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
            () = clock.changed.notified() => {}
            () = sleep_until_opt(deadline) => {
                if clock.deadline(limits.header_timeout).is_some_and(|at| at <= Instant::now()) {
                    debug!(%remote, timeout = ?limits.header_timeout, "closed an HTTP connection whose request head was too slow (--http-header-timeout)");
                    // Dropping the connection closes its socket.
                    return;
                }
            }
        }
    }
}

/// Answers 503, and closes the connection, for a request that has not
/// been answered within `timeout` of its head (a body trickled forever, a
/// store that does not answer).
async fn deadline(
    axum::extract::State(timeout): axum::extract::State<Duration>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::{
        http::{header, HeaderValue, StatusCode},
        response::IntoResponse,
    };
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            let mut response = (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the request was not read and answered within {} (--http-request-timeout)",
                    crate::config::duration_text(timeout)
                ),
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
