//! [`WorkerBuilder`]: a [`Worker`]'s options and handlers, checked once.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::handler::{boxed, BoxedHandler, HandlerResult};
use crate::{Client, Error, JobContext, Result, Worker};

/// Where a [`Worker`] gets its connection: an existing [`Client`], or a URL
/// it connects to lazily (so a worker may start before its server).
#[derive(Debug, Clone)]
pub enum WorkerTarget {
    /// Share this client's connection.
    Client(Box<Client>),
    /// Connect to this URL when [`Worker::run`] starts.
    Url(String),
}

impl From<Client> for WorkerTarget {
    fn from(client: Client) -> Self {
        Self::Client(Box::new(client))
    }
}

impl From<String> for WorkerTarget {
    fn from(url: String) -> Self {
        Self::Url(url)
    }
}

impl From<&str> for WorkerTarget {
    fn from(url: &str) -> Self {
        Self::Url(url.to_owned())
    }
}

/// Called each time a Lease stream is established.
pub(crate) type ReadyHook = Arc<dyn Fn() + Send + Sync>;

/// Told of each failure to open or keep the Lease stream, with how long the
/// worker has been without one.
pub(crate) type ConnectionErrorHook = Arc<dyn Fn(&Error, Duration) + Send + Sync>;

/// How long a cancelled handler may keep running by default.
const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);

/// The longest lease a worker may ask for.
const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Everything [`Worker::run`] needs, validated.
pub(crate) struct Config {
    pub(crate) client: Client,
    /// The server's URL, when the worker was given one (for its logs: a
    /// connection error then says where it tried).
    pub(crate) server: Option<String>,
    pub(crate) queues: Vec<String>,
    pub(crate) worker_id: Arc<str>,
    pub(crate) capacity: u32,
    pub(crate) lease: Duration,
    pub(crate) heartbeat_every: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) shutdown: CancellationToken,
    pub(crate) handle_signals: bool,
    pub(crate) handlers: HashMap<String, BoxedHandler>,
    pub(crate) fallback: Option<BoxedHandler>,
    pub(crate) on_ready: Option<ReadyHook>,
    pub(crate) metrics: crate::metrics::Recorder,
    pub(crate) cancel_grace: Duration,
    pub(crate) give_up_after: Option<Duration>,
    pub(crate) on_connection_error: Option<ConnectionErrorHook>,
}

/// Builds a [`Worker`]; start with [`Worker::builder`].
///
/// Defaults: queue `default`, a `<hostname>-<pid>-<hex>` id (64 random bits), capacity 1,
/// 30 s leases heartbeated every lease/3, 30 s drain timeout, 5 s for a
/// cancelled handler to stop, retries for ever when the server is
/// unreachable, a shutdown token nobody cancels, and no signal handling
/// ([`handle_signals`](Self::handle_signals)).
pub struct WorkerBuilder {
    target: WorkerTarget,
    token: Option<String>,
    insecure: bool,
    ca_cert: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    queues: Vec<String>,
    /// Whether the queues were chosen (by `queues` or a typed `job`).
    queues_set: bool,
    worker_id: Option<String>,
    capacity: u32,
    lease: Duration,
    heartbeat_every: Option<Duration>,
    drain_timeout: Duration,
    shutdown: CancellationToken,
    handle_signals: bool,
    handlers: HashMap<String, BoxedHandler>,
    fallback: Option<BoxedHandler>,
    on_ready: Option<ReadyHook>,
    metrics: crate::metrics::Recorder,
    cancel_grace: Duration,
    give_up_after: Option<Duration>,
    on_connection_error: Option<ConnectionErrorHook>,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kinds: Vec<_> = self.handlers.keys().collect();
        kinds.sort();
        f.debug_struct("WorkerBuilder")
            .field("target", &self.target)
            .field("queues", &self.queues)
            .field("worker_id", &self.worker_id)
            .field("capacity", &self.capacity)
            .field("lease", &self.lease)
            .field("heartbeat_every", &self.heartbeat_every)
            .field("drain_timeout", &self.drain_timeout)
            .field("cancel_grace", &self.cancel_grace)
            .field("give_up_after", &self.give_up_after)
            .field("handle_signals", &self.handle_signals)
            .field("handlers", &kinds)
            .field("fallback", &self.fallback.is_some())
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    pub(crate) fn new(target: WorkerTarget) -> Self {
        Self {
            target,
            token: None,
            insecure: false,
            ca_cert: None,
            identity: None,
            queues: vec!["default".to_owned()],
            queues_set: false,
            worker_id: None,
            capacity: 1,
            lease: Duration::from_secs(30),
            heartbeat_every: None,
            drain_timeout: Duration::from_secs(30),
            shutdown: CancellationToken::new(),
            handle_signals: false,
            handlers: HashMap::new(),
            fallback: None,
            on_ready: None,
            metrics: crate::metrics::Recorder::default(),
            cancel_grace: DEFAULT_CANCEL_GRACE,
            give_up_after: None,
            on_connection_error: None,
        }
    }

    /// Sends `authorization: Bearer <token>` (for a URL target; a
    /// [`Client`] target brings its own, see [`Client::builder`]).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Lets the token travel over plaintext `http://` to a URL target that
    /// is not this machine, as [`Connect::insecure`](crate::Connect::insecure);
    /// refused by default.
    pub fn insecure(mut self, insecure: bool) -> Self {
        self.insecure = insecure;
        self
    }

    /// Trusts this CA (PEM) for an `https://` URL target.
    pub fn ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_cert = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (PEM) to an mTLS server.
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The queues to take jobs from, in strict priority order.
    pub fn queues<I, S>(mut self, queues: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.queues = queues.into_iter().map(Into::into).collect();
        self.queues_set = true;
        self
    }

    /// Adds `queue` to the queues taken from (last, so after those set
    /// before); the first such call replaces the default queue unless
    /// [`queues`](Self::queues) was called.
    pub(crate) fn take_queue(mut self, queue: &str) -> Self {
        if !self.queues_set {
            self.queues.clear();
            self.queues_set = true;
        }
        if !self.queues.iter().any(|q| q == queue) {
            self.queues.push(queue.to_owned());
        }
        self
    }

    /// The id the server records on jobs this worker runs. Must be unique
    /// among live workers: the server's drain signal applies to every Lease
    /// stream opened under it.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// How many handlers run at once (and how many jobs the Lease stream
    /// holds).
    pub fn capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// How long each lease lasts; heartbeats extend it by as much again.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often in-flight leases are heartbeated (one batched call per
    /// tick). Defaults to lease/3; must be shorter than the lease.
    pub fn heartbeat_every(mut self, every: Duration) -> Self {
        self.heartbeat_every = Some(every);
        self
    }

    /// How long, after shutdown, in-flight handlers get to finish before
    /// they are cancelled (and left for the server to reclaim).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// How long a cancelled handler keeps running (its future polled) after
    /// [`JobContext::cancelled`](crate::JobContext::cancelled) fires, so it
    /// can stop cleanly, before it is dropped. Default 5 s; zero drops it
    /// at once. The job's lease is gone by then (or the drain deadline
    /// passed), so nothing it returns is reported.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// Makes [`Worker::run`] return [`Error::Unreachable`] once it has been
    /// without a Lease stream (the server unreachable, refusing, or
    /// restarting) for `after`. By default a worker retries for ever; a
    /// process supervisor that would rather restart it, or alert, sets
    /// this. Jobs still running are drained first, as at shutdown.
    pub fn give_up_after(mut self, after: Duration) -> Self {
        self.give_up_after = Some(after);
        self
    }

    /// Calls `hook` on every failure to open or keep the Lease stream, with
    /// the error and how long the worker has been without a stream (zero
    /// for a stream that just dropped): for an application's own alerting,
    /// where a log line at `warn` may go unseen.
    pub fn on_connection_error(
        mut self,
        hook: impl Fn(&Error, Duration) + Send + Sync + 'static,
    ) -> Self {
        self.on_connection_error = Some(Arc::new(hook));
        self
    }

    /// The token whose cancellation starts a graceful shutdown.
    pub fn shutdown(mut self, token: CancellationToken) -> Self {
        self.shutdown = token;
        self
    }

    /// Shuts down gracefully on SIGINT (Ctrl-C) or SIGTERM: the same drain
    /// as cancelling the [`shutdown`](Self::shutdown) token, which the
    /// signal cancels. Off by default, since a library should not take over
    /// a process's signals unasked. The handlers are installed when
    /// [`Worker::run`] starts and stay for the life of the process (a
    /// later Ctrl-C no longer kills it by default). On Unix, a second
    /// signal during the drain (or any signal once the token was
    /// cancelled) ends the process at once, killed by that signal (as
    /// without handlers): running handlers are cut off, and their jobs come
    /// back to the queue when the stream drops.
    pub fn handle_signals(mut self, on: bool) -> Self {
        self.handle_signals = on;
        self
    }

    /// Runs `handler` for jobs of `kind`, replacing any earlier one.
    ///
    /// A job whose kind has no handler is failed (retryably, so a worker
    /// that has the handler can take it) with the error
    /// `no handler for kind "<kind>"`.
    pub fn handler<F, Fut>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.handlers.insert(kind.into(), boxed(handler));
        self
    }

    /// Runs `handler` for jobs of every kind that has no handler of its own
    /// (a catch-all, e.g. for a generic worker that hands every job to an
    /// external command). Without one, such jobs fail with
    /// `no handler for kind "<kind>"`.
    pub fn fallback<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        self.fallback = Some(boxed(handler));
        self
    }

    /// Registers the worker's own metrics (jobs run by outcome, handler
    /// duration, leases lost by reason) in `registry`, which the
    /// application serves to Prometheus. Needs the `metrics` feature.
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, registry: &mut prometheus_client::registry::Registry) -> Self {
        self.metrics = crate::metrics::Recorder::register(registry);
        self
    }

    /// Calls `hook` each time a Lease stream is established (at start and
    /// after every reconnect), e.g. to print a readiness line.
    pub fn on_ready(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_ready = Some(Arc::new(hook));
        self
    }

    /// Finishes the builder. Options are checked when the worker runs.
    pub fn build(self) -> Worker {
        Worker::from_builder(self)
    }

    /// The worker id in effect (chosen now if none was set).
    pub(crate) fn resolved_worker_id(&mut self) -> Arc<str> {
        // Unique even where every container's pid is 1: host, pid and 64
        // random bits.
        let id = self.worker_id.get_or_insert_with(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| {
                    h.trim()
                        .chars()
                        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                        .take(48)
                        .collect::<String>()
                })
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "host".to_owned());
            format!(
                "{host}-{}-{:016x}",
                std::process::id(),
                rand::random::<u64>()
            )
        });
        Arc::from(id.as_str())
    }

    /// Checks the options and connects (lazily) when given a URL.
    pub(crate) fn into_config(mut self) -> Result<Config> {
        let worker_id = self.resolved_worker_id();
        let heartbeat_every = self.heartbeat_every.unwrap_or(self.lease / 3);
        let problem = if self.queues.is_empty() {
            Some("no queues".to_owned())
        } else if self.capacity == 0 {
            Some("capacity must be at least 1".to_owned())
        } else if self.lease.is_zero() {
            Some("lease must be positive".to_owned())
        } else if self.lease > MAX_LEASE {
            // Far past any server's --max-lease; bounded so that deadlines
            // computed from it cannot overflow a clock.
            Some(format!("lease {:?} is over a year", self.lease))
        } else if heartbeat_every.is_zero() || heartbeat_every >= self.lease {
            Some(format!("heartbeat interval {heartbeat_every:?} must be positive and shorter than the lease {:?}", self.lease))
        } else if self.handlers.is_empty() && self.fallback.is_none() {
            Some("no handlers".to_owned())
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::Config(problem));
        }
        let connection_set = self.token.is_some()
            || self.insecure
            || self.ca_cert.is_some()
            || self.identity.is_some();
        let server = match &self.target {
            WorkerTarget::Url(url) => Some(url.clone()),
            WorkerTarget::Client(_) => None,
        };
        let client = match self.target {
            WorkerTarget::Client(_) if connection_set => {
                return Err(Error::Config(
                    "token, insecure, CA and identity apply to a URL target; set them on the Client (Client::builder) instead".into(),
                ))
            }
            WorkerTarget::Client(client) => *client,
            WorkerTarget::Url(url) => {
                let mut connect = Client::builder(url).insecure(self.insecure);
                if let Some(token) = self.token {
                    connect = connect.token(token);
                }
                if let Some(pem) = self.ca_cert {
                    connect = connect.ca_cert(pem);
                }
                if let Some((cert, key)) = self.identity {
                    connect = connect.identity(cert, key);
                }
                connect.connect_lazy()?
            }
        };
        Ok(Config {
            client,
            server,
            queues: self.queues,
            worker_id,
            capacity: self.capacity,
            lease: self.lease,
            heartbeat_every,
            drain_timeout: self.drain_timeout,
            shutdown: self.shutdown,
            handle_signals: self.handle_signals,
            handlers: self.handlers,
            fallback: self.fallback,
            on_ready: self.on_ready,
            metrics: self.metrics,
            cancel_grace: self.cancel_grace,
            give_up_after: self.give_up_after,
            on_connection_error: self.on_connection_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HandlerError;

    fn builder() -> WorkerBuilder {
        Worker::builder("http://127.0.0.1:1")
            .handler("k", |_ctx| async { Ok::<(), HandlerError>(()) })
    }

    fn problem(b: WorkerBuilder) -> String {
        match b.into_config() {
            Err(Error::Config(p)) => p,
            other => panic!("expected a config error, got {:?}", other.map(|_| ())),
        }
    }

    #[tokio::test]
    async fn defaults_are_valid_and_heartbeat_is_a_third_of_the_lease() {
        let cfg = builder()
            .lease(Duration::from_secs(9))
            .into_config()
            .unwrap();
        assert_eq!(cfg.heartbeat_every, Duration::from_secs(3));
        assert_eq!(cfg.queues, ["default"]);
        // host-pid-<64 random bits>: unique even where every pid is 1.
        let parts: Vec<&str> = cfg.worker_id.rsplitn(3, '-').collect();
        assert_eq!(parts.len(), 3, "{}", cfg.worker_id);
        assert_eq!(parts[0].len(), 16, "{}", cfg.worker_id);
        assert_eq!(parts[1], std::process::id().to_string());
    }

    #[tokio::test]
    async fn bad_options_are_refused() {
        assert_eq!(problem(builder().queues(Vec::<String>::new())), "no queues");
        assert_eq!(
            problem(builder().capacity(0)),
            "capacity must be at least 1"
        );
        assert!(problem(
            builder()
                .lease(Duration::from_secs(1))
                .heartbeat_every(Duration::from_secs(1))
        )
        .starts_with("heartbeat interval"));
        assert_eq!(
            problem(Worker::builder("http://127.0.0.1:1")),
            "no handlers"
        );
    }

    #[tokio::test]
    async fn a_worker_does_not_send_its_token_in_clear_to_another_machine() {
        let remote = || {
            Worker::builder("http://192.0.2.1:50051")
                .handler("k", |_ctx| async { Ok::<(), HandlerError>(()) })
                .token("s3cret")
        };
        let refused = problem(remote());
        assert!(
            refused.contains("refusing to send the token in clear to 192.0.2.1"),
            "{refused}"
        );
        assert!(remote().insecure(true).into_config().is_ok());
        assert!(builder().token("s3cret").into_config().is_ok());
        // On a Client target the Client decides.
        let client = Client::connect_lazy("http://127.0.0.1:1").unwrap();
        let on_client = Worker::builder(client)
            .handler("k", |_ctx| async { Ok::<(), HandlerError>(()) })
            .insecure(true);
        assert!(problem(on_client).contains("insecure"));
    }
}
