//! The connections the gRPC server accepts, and their limits.
//!
//! tonic's own accept loop retries a failed `accept` at once, so at the fd
//! limit (EMFILE) it spins at 100 % CPU and logs nothing, and it keeps a
//! connection that sends nothing forever. [`incoming`] replaces it:
//!
//! - **max connections**: a connection over `--max-connections` is closed
//!   as soon as it is accepted, with a log line (at most one a second);
//!   so is one over `--max-connections-per-peer` from one IP address, so
//!   that one peer cannot take every place;
//! - **fd exhaustion**: EMFILE / ENFILE (and ENOBUFS / ENOMEM) make the
//!   loop log and sleep [`ACCEPT_BACKOFF`] instead of spinning; the
//!   connections wait in the kernel's backlog until fds are free again;
//! - **handshake timeout**: a connection that has not sent the whole HTTP/2
//!   client preface (plaintext), or begun its first call (TLS, where the
//!   preface is inside the encryption), within `--handshake-timeout` is
//!   closed: a byte, or a handshake that stalls, does not keep it;
//! - **idle timeout**: a connection with no call in flight and no open
//!   stream for `--idle-timeout` is closed (gRPC clients reconnect on their
//!   next call); a health Watch stream does not count as open, so it does
//!   not keep a connection;
//! - **shutdown**: a connection that never sent anything is closed at
//!   once; the others once their handlers have returned and
//!   [`SHUTDOWN_GRACE`] more has passed for the last frames (a Lease
//!   stream's UNAVAILABLE) and for hyper's own graceful close. A peer that
//!   does not read is not waited for beyond that.
//!
//! Each accepted socket is a [`Conn`], whose shared [`ConnState`] reaches
//! the requests through tonic's connect info; the [`TrackCalls`] layer
//! counts each connection's calls in it. One watchdog task per connection
//! applies the timeouts. Closing a connection makes its socket read EOF and
//! fail writes, so hyper drops it.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use http_body::{Body, Frame, SizeHint};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{codegen::http, transport::server::Connected};
use tower::{Layer, Service};
use tracing::{debug, info, warn};

use crate::config::Config;

/// How long the accept loop sleeps after running out of file descriptors.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// At shutdown, how long a connection whose handlers have returned stays
/// open for its last frames and hyper's graceful close before it is closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Fds `--max-connections` leaves to the store and the rest of the server
/// when it is derived from the fd limit: a quarter, at least this many.
const RESERVED_FDS: u64 = 64;

/// The length of the HTTP/2 client preface ("PRI * HTTP/2.0…").
const H2_PREFACE_BYTES: usize = 24;

/// The health service's streaming call.
pub const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";

/// Most log lines a second about refused connections or accept failures.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The connection limits of `jobq serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most connections open at once from one IP address.
    pub max_per_peer: usize,
    /// The bytes a peer must have sent for its handshake to count as done
    /// (the HTTP/2 client preface, on a plaintext gRPC listener); `None`:
    /// only its first call counts (TLS, HTTP/1).
    pub handshake_bytes: Option<usize>,
    /// How long a new connection may go without beginning a call.
    pub handshake_timeout: Duration,
    /// How long a connection may have no call in flight.
    pub idle_timeout: Duration,
    /// The flags that set these, as the log lines name them.
    pub flags: LimitFlags,
}

/// The flags that set a listener's [`Limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitFlags {
    /// The connection cap's.
    pub max_connections: &'static str,
    /// The per-address cap's.
    pub max_per_peer: &'static str,
    /// The handshake timeout's.
    pub handshake_timeout: &'static str,
    /// The idle timeout's.
    pub idle_timeout: &'static str,
}

impl LimitFlags {
    /// The gRPC listener's.
    pub const GRPC: LimitFlags = LimitFlags {
        max_connections: "--max-connections",
        max_per_peer: "--max-connections-per-peer",
        handshake_timeout: "--handshake-timeout",
        idle_timeout: "--idle-timeout",
    };
}

impl Limits {
    /// The limits `config` sets; `--max-connections` unset means three
    /// quarters of the process's fd limit (RLIMIT_NOFILE), so connections
    /// alone cannot starve the store of file descriptors.
    pub fn from_config(config: &Config) -> Limits {
        let max_connections = config
            .max_connections
            .unwrap_or_else(default_max_connections);
        Limits {
            max_connections,
            max_per_peer: config
                .max_connections_per_peer
                .unwrap_or((max_connections / 2).max(1)),
            handshake_bytes: config.tls_cert.is_none().then_some(H2_PREFACE_BYTES),
            handshake_timeout: config.handshake_timeout,
            idle_timeout: config.idle_timeout,
            flags: LimitFlags::GRPC,
        }
    }
}

fn default_max_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and nothing else.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur
    } else {
        1024
    };
    let soft = soft.min(1 << 20);
    let usable = soft.saturating_sub(RESERVED_FDS.max(soft / 4)).max(1);
    usize::try_from(usable).unwrap_or(usize::MAX)
}

/// What a connection's socket, its watchdog and its calls share.
#[derive(Debug)]
pub struct ConnState {
    /// Calls whose handler has not returned yet.
    handlers: AtomicUsize,
    /// Calls whose response (a unary reply, a stream) is still open.
    open: AtomicUsize,
    /// The peer has begun a call: its handshakes (TLS, HTTP/2) are done.
    spoke: AtomicBool,
    /// Bytes read from the peer, counted up to the handshake's.
    read: AtomicUsize,
    /// When the last call ended (or the connection opened).
    idle_since: Mutex<Instant>,
    /// Wakes the watchdog on any of the above.
    changed: Notify,
    /// Closes the connection: its socket reads EOF and fails writes.
    close: CancellationToken,
}

impl ConnState {
    fn new() -> ConnState {
        ConnState {
            handlers: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            spoke: AtomicBool::new(false),
            read: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            changed: Notify::new(),
            close: CancellationToken::new(),
        }
    }

    /// Whether its handshake is done (see [`Limits::handshake_bytes`]).
    fn handshaken(&self, limits: &Limits) -> bool {
        self.spoke.load(Ordering::SeqCst)
            || limits
                .handshake_bytes
                .is_some_and(|n| self.read.load(Ordering::SeqCst) >= n)
    }

    fn idle(&self) -> bool {
        self.handlers.load(Ordering::SeqCst) == 0 && self.open.load(Ordering::SeqCst) == 0
    }

    fn idle_since(&self) -> Instant {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ended_one(&self) {
        if self.idle() {
            *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        }
        self.changed.notify_one();
    }
}

/// What tonic puts in each request's extensions for a [`Conn`].
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: SocketAddr,
    state: Arc<ConnState>,
}

/// One accepted connection: the socket, its slot under
/// `--max-connections`, and its state.
pub struct Conn {
    io: TcpStream,
    remote: SocketAddr,
    state: Arc<ConnState>,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    _slot: OwnedSemaphorePermit,
    _peer: PeerSlot,
}

/// Open connections per IP address (`--max-connections-per-peer`).
#[derive(Debug, Default, Clone)]
struct Peers(Arc<Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>);

/// One connection's place in its address's count; freed on drop.
struct PeerSlot {
    peers: Peers,
    ip: std::net::IpAddr,
}

impl Peers {
    /// A place for one more connection from `ip`, unless it has `max`.
    fn admit(&self, ip: std::net::IpAddr, max: usize) -> Option<PeerSlot> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

impl Conn {
    /// Whether the server closed it; registers the waker, so a close wakes
    /// the connection's task.
    fn poll_closed(&mut self, cx: &mut Context<'_>) -> bool {
        self.closed.as_mut().poll(cx).is_ready()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Ends the watchdog.
        self.state.close.cancel();
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            remote: self.remote,
            state: Arc::clone(&self.state),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.poll_closed(cx) {
            // EOF: hyper ends the connection.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 && self.state.read.load(Ordering::Relaxed) < H2_PREFACE_BYTES {
            self.state.read.fetch_add(n, Ordering::SeqCst);
            self.state.changed.notify_one();
        }
        read
    }
}

fn closed_error() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "connection closed by the server")
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.poll_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.poll_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.poll_closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Accepts connections on `listener` under `limits` until the returned
/// stream is dropped (tonic drops it when shutdown begins) or `shutdown`
/// fires; see the module docs.
pub fn incoming(
    listener: TcpListener,
    limits: Limits,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(accept_loop(listener, limits, shutdown, tx));
    ReceiverStream::new(rx)
}

/// Whether an accept error means the process (or system) is out of file
/// descriptors or memory: retrying at once would spin.
fn exhausted(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Whether an accept error concerns only the one connection (it went away
/// before it was accepted): the next accept may succeed at once.
fn per_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Logs at most once per [`LOG_EVERY`], counting what it did not log.
struct Throttle {
    last: Option<Instant>,
    quiet: u64,
}

impl Throttle {
    fn new() -> Throttle {
        Throttle {
            last: None,
            quiet: 0,
        }
    }

    /// `Some(how many were not logged since)` when this one should be.
    fn tick(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|at| now < at + LOG_EVERY) {
            self.quiet += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.quiet))
    }
}

async fn accept_loop(
    listener: TcpListener,
    limits: Limits,
    shutdown: CancellationToken,
    tx: mpsc::Sender<io::Result<Conn>>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Peers::default();
    let (mut refusals, mut failures) = (Throttle::new(), Throttle::new());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = tx.closed() => return,
            () = shutdown.cancelled() => return,
        };
        let (io, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(err) if per_connection(&err) => {
                debug!(cause = %err, "accept failed for one connection");
                continue;
            }
            Err(err) => {
                if let Some(unlogged) = failures.tick() {
                    let cause = if exhausted(&err) {
                        "out of file descriptors (or memory)"
                    } else {
                        "unexpected error"
                    };
                    warn!(%err, unlogged, backoff = ?ACCEPT_BACKOFF, "accept failed: {cause}; backing off (new connections wait in the listen backlog)");
                }
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    () = tx.closed() => return,
                    () = shutdown.cancelled() => return,
                }
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            if let Some(unlogged) = refusals.tick() {
                warn!(%remote, limit = limits.max_connections, unlogged, "refused a connection: {} reached", limits.flags.max_connections);
            }
            drop(io);
            continue;
        };
        let Some(peer) = peers.admit(remote.ip(), limits.max_per_peer) else {
            if let Some(unlogged) = refusals.tick() {
                warn!(%remote, limit = limits.max_per_peer, unlogged, "refused a connection: {} reached for this address", limits.flags.max_per_peer);
            }
            drop(io);
            continue;
        };
        // Latency matters more than packet count for small RPCs.
        let _ = io.set_nodelay(true);
        let state = Arc::new(ConnState::new());
        tokio::spawn(watch(Arc::clone(&state), limits, shutdown.clone(), remote));
        let conn = Conn {
            io,
            remote,
            closed: Box::pin(state.close.clone().cancelled_owned()),
            state,
            _slot: slot,
            _peer: peer,
        };
        if tx.send(Ok(conn)).await.is_err() {
            return;
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One connection's watchdog: the handshake and idle timeouts, and its
/// close at shutdown.
async fn watch(
    state: Arc<ConnState>,
    limits: Limits,
    shutdown: CancellationToken,
    remote: SocketAddr,
) {
    let opened = Instant::now();
    loop {
        let now = Instant::now();
        let deadline = if !state.handshaken(&limits) {
            let at = opened + limits.handshake_timeout;
            if now >= at {
                info!(%remote, timeout = ?limits.handshake_timeout, "closed a connection that began no call ({})", limits.flags.handshake_timeout);
                state.close.cancel();
                return;
            }
            Some(at)
        } else if state.idle() {
            let at = state.idle_since() + limits.idle_timeout;
            if now >= at {
                debug!(%remote, timeout = ?limits.idle_timeout, "closed an idle connection ({})", limits.flags.idle_timeout);
                state.close.cancel();
                return;
            }
            Some(at)
        } else {
            None
        };
        tokio::select! {
            () = state.close.cancelled() => return,
            () = shutdown.cancelled() => break,
            () = state.changed.notified() => {}
            () = sleep_until_opt(deadline) => {}
        }
    }
    // Shutdown. Nothing to wait for on a connection that never spoke.
    if !state.handshaken(&limits) {
        state.close.cancel();
        return;
    }
    // In-flight handlers finish (server.rs bounds this by
    // --shutdown-timeout); writing their replies to a peer that does not
    // read is not waited for beyond the grace.
    while state.handlers.load(Ordering::SeqCst) > 0 {
        tokio::select! {
            () = state.close.cancelled() => return,
            () = state.changed.notified() => {}
        }
    }
    tokio::select! {
        () = state.close.cancelled() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {
            debug!(%remote, "closing a connection at shutdown");
            state.close.cancel();
        }
    }
}

/// Counts one call against its connection while it lives.
struct CallGuard {
    state: Arc<ConnState>,
    counter: fn(&ConnState) -> &AtomicUsize,
}

impl CallGuard {
    fn new(state: &Arc<ConnState>, counter: fn(&ConnState) -> &AtomicUsize) -> CallGuard {
        state.spoke.store(true, Ordering::SeqCst);
        counter(state).fetch_add(1, Ordering::SeqCst);
        state.changed.notify_one();
        CallGuard {
            state: Arc::clone(state),
            counter,
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        (self.counter)(&self.state).fetch_sub(1, Ordering::SeqCst);
        self.state.ended_one();
    }
}

/// The tower layer that counts each connection's calls: a call's handler
/// until it returns, its response (a unary reply, a Lease stream) until its
/// body is done.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackCalls;

impl<S> Layer<S> for TrackCalls {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked { inner }
    }
}

/// The service [`TrackCalls`] wraps.
#[derive(Debug, Clone)]
pub struct Tracked<S> {
    inner: S,
}

impl<S, B, RB> Service<http::Request<B>> for Tracked<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<TrackedBody<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let state = req
            .extensions()
            .get::<ConnInfo>()
            .map(|info| Arc::clone(&info.state));
        // A health Watch may stay open for good: it does not keep its
        // connection from the idle timeout (its handler still counts while
        // it runs).
        let watch = req.uri().path() == HEALTH_WATCH;
        let open = state
            .as_ref()
            .filter(|_| !watch)
            .map(|s| CallGuard::new(s, |s| &s.open));
        let handler = state.as_ref().map(|s| CallGuard::new(s, |s| &s.handlers));
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = call.await;
            drop(handler);
            Ok(response?.map(|inner| TrackedBody { inner, _open: open }))
        })
    }
}

/// A response body that keeps its call counted until it is dropped.
pub struct TrackedBody<B> {
    inner: B,
    _open: Option<CallGuard>,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_exhaustion_backs_off_and_a_vanished_peer_does_not() {
        assert!(exhausted(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(exhausted(&io::Error::from_raw_os_error(libc::ENFILE)));
        assert!(!per_connection(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(per_connection(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
    }

    #[test]
    fn the_default_connection_limit_leaves_fds_to_the_store() {
        let n = default_max_connections();
        assert!(n >= 1);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
            && limit.rlim_cur < (1 << 20)
        {
            assert!((n as u64) < limit.rlim_cur);
        }
    }
}
