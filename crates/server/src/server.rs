//! Builds and runs the tonic server: the JobQueue service, gRPC server
//! reflection (v1 and v1alpha, so grpcurl 1.8 works too), the standard
//! health service, HTTP/2 keepalive, and graceful shutdown on a
//! `CancellationToken`.

use std::{sync::Arc, time::SystemTime};

use jobq::pb::job_queue_server::JobQueueServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{service::interceptor::InterceptedService, transport::Server};
use tonic_health::ServingStatus;
use tracing::{error, info, warn};

use crate::{
    auth::Auth,
    config::Config,
    connections::{self, TrackCalls},
    error::{Error, Result, TransportCodes},
    fds,
    leases::{self, LeaseHub},
    limits::{HealthWatches, RequestBudget},
    metrics::{Metrics, Rates},
    reaper,
    rpc_timing::RpcTiming,
    scheduler,
    service::JobQueueService,
    store::{
        postgres::{self, PgOptions, PgStore},
        sled::SledStore,
        Fact, Store,
    },
    web::{self, Web},
};

/// How often the dashboard's enqueue and ack rates are sampled.
const RATE_SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The health service name of the job queue.
pub const SERVICE_NAME: &str = "jobq.v1.JobQueue";

/// Binds `config.listen` and serves until `shutdown` fires.
///
/// # Errors
/// When the address cannot be bound, the data folder cannot be opened, the
/// TLS or tokens files are wrong, the transport fails, or the address is
/// not loopback and the server is neither secured nor told `--insecure`
/// ([`Config::check_exposure`]), or the limits contradict each other
/// ([`Config::check_limits`]).
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    config.check_exposure().map_err(Error::Exposed)?;
    config.check_limits().map_err(Error::Limits)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::Io(format!("cannot listen on {}: {e}", config.listen)))?;
    serve(config, listener, shutdown).await
}

/// Serves on an already bound listener (tests bind `127.0.0.1:0`) until
/// `shutdown` fires; then reports NOT_SERVING, stops accepting, ends the
/// Lease streams (keeping their leases), waits for in-flight calls up to
/// `--shutdown-timeout`, and flushes the store.
///
/// # Errors
/// When the data folder cannot be opened or the transport fails.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<()> {
    let mut config = config;
    // Connections must never take the descriptors the store needs (a
    // store that cannot open a file fail-stops): both caps are settled
    // here, under the raised fd limit, with a reserve kept (fds.rs).
    let fd_limit = fds::raise_limit();
    let budget = fds::budget(fd_limit, &config).map_err(Error::Limits)?;
    config.max_connections = Some(budget.max_connections);
    config.http_max_connections = Some(budget.http_max_connections);
    info!(
        fd_limit = budget.limit,
        reserved_fds = budget.reserved,
        max_connections = budget.max_connections,
        http_max_connections = budget.http_max_connections,
        "file descriptors"
    );
    let config = Arc::new(config);
    // Everything that can refuse to start without the store comes first:
    // a store opened and then dropped by an early return would not be
    // closed cleanly (sled's next start would read every record).
    let setup = Setup::load(&config).await?;
    if let Some(url) = config.store.clone() {
        let options = PgOptions::of(&config, &url);
        let store = Arc::new(PgStore::connect(&config, options).await?);
        info!(store = %postgres::redact(&url), server.id = store.backend().server_id(), "PostgreSQL store: migrated and registered");
        let label = postgres::redact(&url);
        return serve_store(config, setup, listener, shutdown, store, None, label).await;
    }
    let label = config.data.display().to_string();
    let opened = {
        let config = Arc::clone(&config);
        tokio::task::spawn_blocking(move || SledStore::open(&config))
            .await
            .map_err(|e| Error::Io(format!("opening the store panicked: {e}")))?
    };
    let store = Arc::new(opened?);
    // Fail-stop: once the store cannot make a change durable, stop serving
    // at once (health, streams, every call) and exit non-zero.
    let engine = tokio::spawn({
        let (store, shutdown) = (Arc::clone(&store), shutdown.clone());
        async move {
            tokio::select! {
                () = store.watch_engine() => {}
                _ = shutdown.cancelled() => {}
            }
        }
    });
    serve_store(
        config,
        setup,
        listener,
        shutdown,
        store,
        Some(engine),
        label,
    )
    .await
}

/// What the server needs from its configuration and the system before it
/// opens the store: TLS, tokens and the HTTP listener.
struct Setup {
    tls: Option<tonic::transport::ServerTlsConfig>,
    auth: Auth,
    http: Option<TcpListener>,
}

impl Setup {
    async fn load(config: &Config) -> Result<Setup> {
        let tls = crate::tls::server_config(config)?;
        let auth = match &config.auth_tokens {
            Some(path) => Auth::from_file(path).map_err(|e| Error::Io(e.to_string()))?,
            None => Auth::off(),
        };
        let http = match config.http_listen.0 {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
                Error::Io(format!(
                    "cannot listen for HTTP (/metrics, dashboard) on {addr}: {e}; set --http-listen to another address or `off`"
                ))
            })?),
            None => None,
        };
        Ok(Setup { tls, auth, http })
    }
}

/// Serves over an opened store: everything above the [`Store`] seam, the
/// same for every backend. `engine` watches a backend's own failures.
async fn serve_store<S: Store + CommitHook>(
    config: Arc<Config>,
    setup: Setup,
    listener: TcpListener,
    shutdown: CancellationToken,
    store: Arc<S>,
    engine: Option<tokio::task::JoinHandle<()>>,
    data: String,
) -> Result<()> {
    let Setup { tls, auth, http } = setup;
    // A restart is not a worker death: leases that ran out while the
    // server was down get a grace in which their workers can come back.
    let graced = store
        .restart_grace(config.restart_grace, SystemTime::now())
        .await?;
    if graced > 0 {
        info!(leases = graced, grace = ?config.restart_grace, "leases held over the restart get a grace to be heartbeated or acked");
    }
    let fail_stop = tokio::spawn({
        let (stopped, shutdown) = (store.fail_stopped(), shutdown.clone());
        async move {
            tokio::select! {
                _ = stopped.cancelled() => shutdown.cancel(),
                _ = shutdown.cancelled() => {}
            }
        }
    });
    let hub = LeaseHub::new(Arc::clone(&store), Arc::clone(&config), shutdown.clone());
    let metrics = Arc::new(if store.shared() {
        Metrics::new().with_notification_queue()
    } else {
        Metrics::new()
    });
    let rates = Arc::new(Rates::default());
    {
        let (counted, rated) = (Arc::clone(&metrics), Arc::clone(&rates));
        store.observe(Arc::new(move |fact: &Fact<'_>| {
            counted.observe(fact);
            rated.observe(fact);
        }));
        store.commit_hook(&metrics);
    }
    let http = match http {
        Some(listener) => {
            // Logged here, before the gRPC "jobq serving" line, not from the
            // spawned task: tests read this order from the log, and a loaded
            // machine may poll the task late.
            if let Ok(bound) = listener.local_addr() {
                info!(http = %bound, "dashboard and /metrics serving");
            }
            let web = Arc::new(Web {
                store: Arc::clone(&store),
                metrics: Arc::clone(&metrics),
                rates: Arc::clone(&rates),
                streams: {
                    let hub = Arc::clone(&hub);
                    Arc::new(move || hub.open_streams())
                },
                auth: auth.clone(),
                metrics_token_free: config.metrics_token_free,
                allow_hosts: config.http_allow_host.clone(),
                stats: web::stats::StatsCache::new(config.stats_cache),
                sessions: web::sessions::Sessions::new(
                    config.http_session_lifetime,
                    config.http_max_sessions,
                ),
                behind_tls: config.http_behind_tls,
            });
            let limits = web::HttpLimits {
                max_connections: config
                    .http_max_connections
                    .unwrap_or(fds::DEFAULT_HTTP_MAX_CONNECTIONS),
                header_timeout: config.http_header_timeout,
                idle_timeout: config.http_idle_timeout,
                request_timeout: config.http_request_timeout,
            };
            Some(tokio::spawn(web::serve(
                listener,
                web::router(web),
                limits,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    let sampler = tokio::spawn({
        let (rates, shutdown) = (Arc::clone(&rates), shutdown.clone());
        async move {
            let mut every = tokio::time::interval(RATE_SAMPLE_EVERY);
            loop {
                tokio::select! {
                    _ = every.tick() => rates.sample(),
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    });
    // Heartbeats go on until this server has left the registry (see
    // `reaper::run`); however `serve` returns, they stop.
    let left = CancellationToken::new();
    let _heartbeats_end = left.clone().drop_guard();
    let reaper = tokio::spawn(reaper::run(
        Arc::clone(&store),
        Arc::clone(&hub),
        Arc::clone(&config),
        shutdown.clone(),
        left.clone(),
    ));
    let scheduler = tokio::spawn(scheduler::run(Arc::clone(&store), shutdown.clone()));
    let resync = tokio::spawn(leases::reconcile_on_resync(
        Arc::clone(&hub),
        shutdown.clone(),
    ));

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(SERVICE_NAME, ServingStatus::Serving)
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(jobq::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| Error::Io(format!("reflection: {e}")))?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(jobq::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| Error::Io(format!("reflection: {e}")))?;

    let service = JobQueueService::new(
        Arc::clone(&store),
        Arc::clone(&hub),
        Arc::clone(&config),
        shutdown.clone(),
    )
    .with_auth(auth.clone());
    let auth_on = auth.enabled();
    // The SIGHUP handler is installed here, before the server says it is
    // serving: a SIGHUP that arrived before a spawned task got to it would
    // take the default action and kill the process.
    let hangups = hangups(&auth);
    let reload = tokio::spawn(reload_on_sighup(
        auth.clone(),
        Arc::clone(&hub),
        hangups,
        shutdown.clone(),
    ));
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Io(e.to_string()))?;
    // Our own accept loop: connection limits, timeouts, EMFILE backoff,
    // and closing connections at shutdown (see connections.rs).
    let limits = connections::Limits::from_config(&config);
    info!(
        max_connections = limits.max_connections,
        handshake_timeout = ?limits.handshake_timeout,
        idle_timeout = ?limits.idle_timeout,
        "connection limits"
    );
    let incoming = connections::incoming(listener, limits, shutdown.clone());
    let signal = {
        let (shutdown, health) = (shutdown.clone(), health.clone());
        async move {
            shutdown.cancelled().await;
            info!("shutting down: NOT_SERVING, draining in-flight calls");
            health
                .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
                .await;
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
        }
    };
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| Error::Io(format!("TLS: {e}")))?;
    }
    let server = builder
        .http2_keepalive_interval(Some(config.keepalive_interval))
        .max_concurrent_streams(Some(config.max_streams_per_connection))
        .http2_keepalive_timeout(Some(config.keepalive_timeout))
        .layer(TrackCalls)
        .layer(RpcTiming::new(Arc::clone(&metrics)))
        .layer(TransportCodes)
        .layer(RequestBudget::new(
            config.max_inflight_request_bytes,
            config.max_unauthenticated_request_bytes,
        ))
        .layer(HealthWatches::new(config.max_health_watches))
        // Only the job queue is behind the token check: health and
        // reflection reveal no jobs.
        .add_service(InterceptedService::new(
            JobQueueServer::new(service)
                .max_decoding_message_size(config.max_message_bytes)
                .max_encoding_message_size(config.max_message_bytes),
            auth,
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming, signal);
    info!(%addr, %data, tls = config.tls_cert.is_some(), mtls = config.tls_client_ca.is_some(), tokens = auth_on, "jobq serving");

    let drain_deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(config.shutdown_timeout).await;
    };
    let served = tokio::select! {
        served = server => served.map_err(|e| Error::Io(format!("transport: {e}"))),
        () = drain_deadline => {
            warn!(timeout = ?config.shutdown_timeout, "in-flight calls did not finish in time; stopping anyway");
            Ok(())
        }
    };
    // The transport may stop on its own (an error): stop the rest too.
    shutdown.cancel();
    let _ = scheduler.await;
    let _ = resync.await;
    let _ = reload.await;
    if let Some(engine) = engine {
        let _ = engine.await;
    }
    let _ = fail_stop.await;
    let _ = sampler.await;
    if let Some(http) = http {
        match http.await {
            Ok(Err(err)) => warn!(cause = %err, "the HTTP listener failed"),
            Err(err) => warn!(cause = %err, "the HTTP listener panicked"),
            Ok(Ok(())) => {}
        }
    }
    if let Some(cause) = store.fail_cause() {
        error!(%cause, "jobq stopped after a storage failure (fail-stop); restart it to recover from what is on disk");
        return Err(Error::FailStopped(cause.into()));
    }
    // Every stream has ended, and given back what it took but never sent,
    // before this server leaves the registry: a take that committed after
    // the leave would hold a lease of a departed server, which the others
    // reclaim as worker disconnected, spending an attempt on a job no
    // worker saw.
    let streams_left = hub
        .streams_finished(tokio::time::Instant::now() + config.shutdown_timeout)
        .await;
    if streams_left > 0 {
        warn!(
            streams = streams_left,
            "Lease stream tasks did not finish in time; leaving the registry anyway"
        );
    }
    left.cancel();
    let _ = reaper.await;
    if let Err(err) = store.leave().await {
        warn!(cause = %err, "could not leave the server registry; the others will reclaim this server's stream leases after --server-timeout");
    }
    store.close().await?;
    info!("jobq stopped; data flushed");
    served
}

/// The SIGHUP stream, when tokens are on (the only thing SIGHUP reloads).
fn hangups(auth: &Auth) -> Option<tokio::signal::unix::Signal> {
    if !auth.enabled() {
        return None;
    }
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(err) => {
            warn!(cause = %err, "cannot listen for SIGHUP; the tokens file will not be reloaded");
            None
        }
    }
}

/// Reloads the tokens file on SIGHUP until `shutdown`; connections and
/// calls in flight are not touched, but a Lease stream whose token was
/// revoked (or no longer consumes its queues) ends. A bad file keeps the
/// old tokens.
async fn reload_on_sighup<S: Store>(
    auth: Auth,
    hub: Arc<LeaseHub<S>>,
    hangups: Option<tokio::signal::unix::Signal>,
    shutdown: CancellationToken,
) {
    let Some(mut hangups) = hangups else {
        return;
    };
    loop {
        tokio::select! {
            got = hangups.recv() => {
                if got.is_none() {
                    return;
                }
                match auth.reload() {
                    Ok(n) => {
                        info!(tokens = n, "SIGHUP: tokens file reloaded");
                        let ended = hub.refuse_streams(|caller, queues| auth.stream_refused(caller, queues));
                        if ended > 0 {
                            info!(streams = ended, "SIGHUP: ended the Lease streams whose token no longer allows them");
                        }
                    }
                    Err(err) => error!(cause = %err, "SIGHUP: tokens file refused; keeping the old tokens"),
                }
            }
            () = shutdown.cancelled() => return,
        }
    }
}

/// Commit timing for the metrics, where a backend has group-commit rounds
/// of its own (sled's flusher).
pub trait CommitHook {
    /// Tells `metrics` about every commit round.
    fn commit_hook(&self, metrics: &Arc<Metrics>);
}

impl CommitHook for SledStore {
    fn commit_hook(&self, metrics: &Arc<Metrics>) {
        let timed = Arc::clone(metrics);
        self.on_commit(Arc::new(move |took, batch| timed.commit(took, batch)));
    }
}

impl CommitHook for PgStore {
    fn commit_hook(&self, _metrics: &Arc<Metrics>) {}
}
