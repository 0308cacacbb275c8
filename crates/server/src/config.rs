//! Every setting of `jobq serve`: one flag each, a `JOBQ_*` environment
//! variable each, and a sane default.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;

use crate::machine::Backoff;

/// The server's configuration (the flags of `jobq serve`).
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "JOBQ_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Address of the HTTP listener that serves Prometheus `/metrics` and
    /// the dashboard; `off` disables it.
    #[arg(long, env = "JOBQ_HTTP_LISTEN", default_value = "127.0.0.1:9464", value_parser = parse_http_listen)]
    pub http_listen: HttpListen,

    /// Host names the dashboard answers to when tokens are off, besides IP
    /// addresses and `localhost`, which it always answers to (any other
    /// name is refused: a web page could otherwise point its own name at
    /// 127.0.0.1 — DNS rebinding — and read and act on the dashboard).
    /// Repeat, or separate with commas; `*` allows every name.
    #[arg(long, env = "JOBQ_HTTP_ALLOW_HOST", value_delimiter = ',')]
    pub http_allow_host: Vec<String>,

    /// Most HTTP connections (`--http-listen`) open at once; one more is
    /// closed as soon as it is accepted (and logged). Default 256, less
    /// when the fd limit leaves less: a quarter of what `--reserved-fds`
    /// leaves.
    #[arg(long, env = "JOBQ_HTTP_MAX_CONNECTIONS")]
    pub http_max_connections: Option<usize>,

    /// How long an HTTP request's headers may take: a new connection that
    /// has not sent a whole request head within this is closed, and so is
    /// a kept-alive one that began its next request this long ago without
    /// finishing its head.
    #[arg(long, env = "JOBQ_HTTP_HEADER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub http_header_timeout: Duration,

    /// How long a kept-alive HTTP connection may wait, with no request in
    /// flight, for its next request before it is closed.
    #[arg(long, env = "JOBQ_HTTP_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub http_idle_timeout: Duration,

    /// Longest an HTTP request may take once its head has arrived: reading
    /// its body and answering it. One that takes longer is answered 503
    /// and its connection closed.
    #[arg(long, env = "JOBQ_HTTP_REQUEST_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub http_request_timeout: Duration,

    /// How long queue counts shown by `/metrics` and the dashboard may be
    /// reused: a scrape within this of the last one is answered from it,
    /// so any number of scrapers costs one count of the store per period.
    /// 0 counts on every request.
    #[arg(long, env = "JOBQ_STATS_CACHE", default_value = "1s", value_parser = humantime::parse_duration)]
    pub stats_cache: Duration,

    /// How long a dashboard login lasts (with `--auth-tokens`): the
    /// session cookie and the server's record of it expire after this.
    #[arg(long, env = "JOBQ_HTTP_SESSION_LIFETIME", default_value = "12h", value_parser = humantime::parse_duration)]
    pub http_session_lifetime: Duration,

    /// Most dashboard sessions at once; a login beyond it is refused (503)
    /// until one expires or logs out.
    #[arg(long, env = "JOBQ_HTTP_MAX_SESSIONS", default_value_t = 1024)]
    pub http_max_sessions: usize,

    /// Browsers reach the HTTP listener over https, through a
    /// TLS-terminating proxy: the session cookie is marked `Secure` and
    /// named with the `__Host-` prefix, so the browser sends it only over
    /// TLS and only to this host.
    #[arg(long, env = "JOBQ_HTTP_BEHIND_TLS")]
    pub http_behind_tls: bool,

    /// File descriptors neither listener may use, kept for the store (sled
    /// files, PostgreSQL connections, payload files) and the rest of the
    /// server. Default: a quarter of the fd limit, at least 64 (plus
    /// `--pg-pool-size` with `--store`), the least it may be. The server
    /// refuses to start when `--max-connections` plus
    /// `--http-max-connections` plus this exceeds the fd limit.
    #[arg(long, env = "JOBQ_RESERVED_FDS")]
    pub reserved_fds: Option<u64>,

    /// Where jobs live: a PostgreSQL URL (`postgres://user:pass@host/db`)
    /// shared by any number of servers. Unset: the embedded sled database
    /// in `--data`. Its password is never shown (`--help` does not print
    /// the variable's value; logs show the URL with `***`).
    #[arg(long, env = "JOBQ_STORE", hide_env_values = true)]
    pub store: Option<String>,

    /// Most connections to PostgreSQL per server (with `--store`).
    #[arg(long, env = "JOBQ_PG_POOL_SIZE", default_value_t = 16)]
    pub pg_pool_size: usize,

    /// With `--store`: most transitions (acks, fails, heartbeats,
    /// reclaims) committed together in one transaction when they arrive
    /// at once (group commit); 1 commits each call on its own.
    #[arg(long, env = "JOBQ_PG_GROUP_COMMIT", default_value_t = 256)]
    pub pg_group_commit: usize,

    /// With `--store`: PostgreSQL cancels any statement of this server that
    /// runs longer (`statement_timeout`; the call gets UNAVAILABLE), so no
    /// runaway query holds back vacuum for long; 0 for none. It wins over
    /// a `statement_timeout` in the URL's options, the role or the
    /// database. Migrations, and the wait for another server's, run
    /// without it.
    #[arg(long, env = "JOBQ_PG_STATEMENT_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub pg_statement_timeout: Duration,

    /// With `--store`: a server that has not heartbeated for this long is
    /// dead, and the others reclaim its Lease streams' jobs (as worker
    /// disconnected). It heartbeats every fifth of this.
    #[arg(long, env = "JOBQ_SERVER_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub server_timeout: Duration,

    /// Folder holding the sled database (created if missing).
    #[arg(long, env = "JOBQ_DATA", default_value = "./jobq-data")]
    pub data: PathBuf,

    /// Lease length when a request does not give one.
    #[arg(long, env = "JOBQ_DEFAULT_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub default_lease: Duration,

    /// Shortest lease a request may ask for.
    #[arg(long, env = "JOBQ_MIN_LEASE", default_value = "1s", value_parser = humantime::parse_duration)]
    pub min_lease: Duration,

    /// Longest lease a request may ask for.
    #[arg(long, env = "JOBQ_MAX_LEASE", default_value = "12h", value_parser = humantime::parse_duration)]
    pub max_lease: Duration,

    /// Attempts allowed when an enqueue does not say.
    #[arg(long, env = "JOBQ_DEFAULT_MAX_ATTEMPTS", default_value_t = 3)]
    pub default_max_attempts: u32,

    /// Largest max_attempts an enqueue may ask for.
    #[arg(long, env = "JOBQ_MAX_ATTEMPTS_LIMIT", default_value_t = 1000)]
    pub max_attempts_limit: u32,

    /// Largest max_snoozes an enqueue may ask for (a job that does not say
    /// may snooze 100 times).
    #[arg(long, env = "JOBQ_MAX_SNOOZES_LIMIT", default_value_t = 10_000)]
    pub max_snoozes_limit: u32,

    /// Backoff after the first failed attempt (doubles per attempt, with jitter).
    #[arg(long, env = "JOBQ_BACKOFF_BASE", default_value = "1s", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,

    /// Longest backoff between attempts.
    #[arg(long, env = "JOBQ_BACKOFF_CAP", default_value = "10m", value_parser = humantime::parse_duration)]
    pub backoff_cap: Duration,

    /// Largest payload, in bytes.
    #[arg(long, env = "JOBQ_MAX_PAYLOAD", default_value_t = 1024 * 1024)]
    pub max_payload: usize,

    /// Largest enqueue metadata: the bytes of all keys and values together.
    #[arg(long, env = "JOBQ_MAX_METADATA_BYTES", default_value_t = 8 * 1024)]
    pub max_metadata_bytes: usize,

    /// Largest result an Ack may store with its job (read back by GetJob).
    #[arg(long, env = "JOBQ_MAX_RESULT_BYTES", default_value_t = 1024 * 1024)]
    pub max_result_bytes: usize,

    /// Longest progress message a heartbeat may report with a lease.
    #[arg(long, env = "JOBQ_MAX_PROGRESS_MESSAGE_BYTES", default_value_t = 256)]
    pub max_progress_message_bytes: usize,

    /// Longest enqueue `delay`, Fail `retry_delay` or Fail `snooze`.
    #[arg(long, env = "JOBQ_MAX_DELAY", default_value = "365days", value_parser = humantime::parse_duration)]
    pub max_delay: Duration,

    /// Largest gRPC request message, in bytes (bounds EnqueueBatch).
    #[arg(long, env = "JOBQ_MAX_MESSAGE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_message_bytes: usize,

    /// Most bytes of jobs on one ListJobs page (besides `page_size`); a page
    /// holds at least one job whatever its size. Also the most bytes of all
    /// schedules together (ListSchedules answers in one page).
    #[arg(long, env = "JOBQ_MAX_PAGE_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub max_page_bytes: usize,

    /// Longest text a job keeps of why it failed (a Fail's error, a
    /// CancelJob's "cancelled: <reason>"); longer text is cut to it.
    #[arg(long, env = "JOBQ_MAX_ERROR_BYTES", default_value_t = 4096)]
    pub max_error_bytes: usize,

    /// Most jobs in one EnqueueBatch call.
    #[arg(long, env = "JOBQ_MAX_BATCH", default_value_t = 1000)]
    pub max_batch: usize,

    /// Most schedules (CreateSchedule beyond it is RESOURCE_EXHAUSTED).
    #[arg(long, env = "JOBQ_MAX_SCHEDULES", default_value_t = 1000)]
    pub max_schedules: usize,

    /// Most paused queues (PauseQueue of one more is RESOURCE_EXHAUSTED;
    /// pausing a queue already paused is always OK).
    #[arg(long, env = "JOBQ_MAX_PAUSED_QUEUES", default_value_t = DEFAULT_MAX_PAUSED_QUEUES)]
    pub max_paused_queues: usize,

    /// Most queues with a policy (SetQueuePolicy of one more is
    /// RESOURCE_EXHAUSTED; changing or clearing a policy is always OK).
    #[arg(long, env = "JOBQ_MAX_QUEUE_POLICIES", default_value_t = DEFAULT_MAX_QUEUE_POLICIES)]
    pub max_queue_policies: usize,

    /// Longest long-poll `wait` a Dequeue may ask for.
    #[arg(long, env = "JOBQ_MAX_WAIT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub max_wait: Duration,

    /// Most long-polling Dequeue calls and Lease streams at once.
    #[arg(long, env = "JOBQ_MAX_WAITERS", default_value_t = 10_000)]
    pub max_waiters: usize,

    /// Largest capacity of one Lease stream.
    #[arg(long, env = "JOBQ_MAX_CAPACITY", default_value_t = 1000)]
    pub max_capacity: u32,

    /// Most WatchJob streams at once.
    #[arg(long, env = "JOBQ_MAX_WATCHERS", default_value_t = 1000)]
    pub max_watchers: usize,

    /// Most jobs one WatchJob call may watch.
    #[arg(long, env = "JOBQ_MAX_WATCH_IDS", default_value_t = 100)]
    pub max_watch_ids: usize,

    /// With several servers on PostgreSQL: how often a WatchJob stream
    /// reads its unfinished jobs again, to see changes made through the
    /// other servers (this server's own changes wake it at once). Each
    /// read is one query per such job; 0s reads only on this server's
    /// changes.
    #[arg(long, env = "JOBQ_WATCH_POLL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub watch_poll: Duration,

    /// How long a dropped Lease stream's jobs stay leased before they are
    /// reclaimed (a heartbeat within the grace keeps them).
    #[arg(long, env = "JOBQ_DISCONNECT_GRACE", default_value = "0s", value_parser = humantime::parse_duration)]
    pub disconnect_grace: Duration,

    /// How long DONE jobs are kept before they are purged.
    #[arg(long, env = "JOBQ_RETAIN_DONE", default_value = "7days", value_parser = humantime::parse_duration)]
    pub retain_done: Duration,

    /// How long FAILED jobs are kept (unless retried) before they are purged.
    #[arg(long, env = "JOBQ_RETAIN_FAILED", default_value = "30days", value_parser = humantime::parse_duration)]
    pub retain_failed: Duration,

    /// Interval between HTTP/2 keepalive pings to each client, so a silent
    /// peer (no FIN) is found.
    #[arg(long, env = "JOBQ_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub keepalive_interval: Duration,

    /// How long to wait for a keepalive ping's answer before dropping the
    /// connection (and reclaiming its streams' jobs).
    #[arg(long, env = "JOBQ_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub keepalive_timeout: Duration,

    /// Most client connections open at once; one more is closed as soon as
    /// it is accepted (and logged). Default: what the fd limit
    /// (RLIMIT_NOFILE, raised to its hard limit at start) leaves after
    /// `--reserved-fds` and `--http-max-connections`, so connections cannot
    /// starve the store of fds.
    #[arg(long, env = "JOBQ_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,

    /// Most connections open at once from one IP address; one more is
    /// closed as soon as it is accepted (and logged). Default: half of
    /// `--max-connections`, so that one peer cannot take every place.
    #[arg(long, env = "JOBQ_MAX_CONNECTIONS_PER_PEER")]
    pub max_connections_per_peer: Option<usize>,

    /// Most calls at once on one HTTP/2 connection (its
    /// SETTINGS_MAX_CONCURRENT_STREAMS); a client queues its further calls.
    #[arg(long, env = "JOBQ_MAX_STREAMS_PER_CONNECTION", default_value_t = 1024)]
    pub max_streams_per_connection: u32,

    /// Most health Watch streams open at once (they need no token); one
    /// more is RESOURCE_EXHAUSTED.
    #[arg(long, env = "JOBQ_MAX_HEALTH_WATCHES", default_value_t = 64)]
    pub max_health_watches: usize,

    /// Most request bytes held at once by all calls that need no token
    /// (health and reflection), apart from `--max-inflight-request-bytes`;
    /// each such call may hold at most 4 KiB.
    #[arg(long, env = "JOBQ_MAX_UNAUTHENTICATED_REQUEST_BYTES", default_value_t = 256 * 1024)]
    pub max_unauthenticated_request_bytes: usize,

    /// How long a new connection may go without beginning its first call
    /// (TLS and HTTP/2 handshakes included) before it is closed.
    #[arg(long, env = "JOBQ_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub handshake_timeout: Duration,

    /// How long a connection with no call in flight and no open stream is
    /// kept before it is closed (clients reconnect on their next call).
    #[arg(long, env = "JOBQ_IDLE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// sled's page cache, in bytes. sled holds about 1.4 times this in
    /// memory once it is full. Records it does not hold are read back from
    /// the kernel's page cache; a drain of 150k jobs ran as fast with 16
    /// MiB as with 32.
    #[arg(long, env = "JOBQ_CACHE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub cache_bytes: u64,

    /// Payloads of this many bytes or more are stored each in a file of
    /// its own (`<data-dir>/payloads/`), outside sled's page cache, which
    /// would otherwise hold them in memory. Smaller ones stay in sled, and
    /// those of up to 512 bytes in the job's record whatever this says. A
    /// payload a debounce replaced (`on_conflict = REPLACE`) stays in sled
    /// too, whatever its size.
    #[arg(long, env = "JOBQ_PAYLOAD_FILE_BYTES", default_value_t = 16 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub payload_file_bytes: u64,

    /// Wake waiting workers for a job that became due (a new job, a
    /// retry, a lease that ran out) as soon as the change is applied,
    /// before the fsync that makes it durable, instead of after it. Halves
    /// enqueue → delivered latency on sled; but a crash inside that window
    /// (about one fsync) can undo a job a worker already runs: its caller
    /// got no reply and retries. (A take made for another reason can meet
    /// such a job without the flag too; see the book's durability chapter.) No effect on
    /// PostgreSQL, whose changes are committed before a take can see them.
    #[arg(long, env = "JOBQ_DELIVER_BEFORE_FSYNC")]
    pub deliver_before_fsync: bool,

    /// How long shutdown waits for in-flight RPCs before giving up, and
    /// then as long again for the Lease streams to end before the server
    /// leaves a shared store's registry.
    #[arg(long, env = "JOBQ_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// After a restart, how long leases that ran out while the server was
    /// down stay valid, so their workers can reconnect and heartbeat or ack
    /// (a restart is not a worker death). Default: each lease's own length.
    #[arg(long, env = "JOBQ_RESTART_GRACE", value_parser = humantime::parse_duration)]
    pub restart_grace: Option<Duration>,

    /// TOML file of bearer tokens (`[[token]]` entries: name, sha256 of
    /// the secret, queue globs, roles). Unset: no tokens, anyone may call
    /// anything. SIGHUP reloads it.
    #[arg(long, env = "JOBQ_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,

    /// With `--auth-tokens`, let `/metrics` be scraped without a token
    /// (the dashboard still asks for one).
    #[arg(long, env = "JOBQ_METRICS_TOKEN_FREE")]
    pub metrics_token_free: bool,

    /// Most Lease streams one token may hold open at once.
    #[arg(long, env = "JOBQ_MAX_STREAMS_PER_TOKEN", default_value_t = 256)]
    pub max_streams_per_token: usize,

    /// Most request bytes held in memory by all calls at once; a call
    /// over it is RESOURCE_EXHAUSTED.
    #[arg(long, env = "JOBQ_MAX_INFLIGHT_REQUEST_BYTES", default_value_t = 256 * 1024 * 1024)]
    pub max_inflight_request_bytes: usize,

    /// Server certificate chain (PEM): serve gRPC over TLS.
    #[arg(long, env = "JOBQ_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The server certificate's private key (PEM).
    #[arg(long, env = "JOBQ_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// CA (PEM) whose client certificates are accepted; makes client
    /// certificates mandatory (mTLS).
    #[arg(long, env = "JOBQ_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Listen on a non-loopback address without TLS and without tokens
    /// (or client certificates): anyone who reaches the port may read and
    /// change every job.
    #[arg(long, env = "JOBQ_INSECURE")]
    pub insecure: bool,

    /// Fault injection for tests of fail-stop: every fsync after this many
    /// successful ones fails.
    #[arg(long, hide = true, env = "JOBQ_FAULT_SYNC_AFTER")]
    pub fault_sync_after: Option<u64>,

    /// Fault injection for tests of slow disks: every flush round first
    /// sleeps this long, before it writes anything out.
    #[arg(long, hide = true, env = "JOBQ_FAULT_SYNC_DELAY", value_parser = humantime::parse_duration)]
    pub fault_sync_delay: Option<Duration>,

    /// Fault injection: the error the failing fsync reports.
    #[arg(long, hide = true, env = "JOBQ_FAULT_SYNC_ERROR", default_value = "EIO", value_parser = ["EIO", "ENOSPC"])]
    pub fault_sync_error: String,
}

/// Injected fsync faults (tests only; see `--fault-sync-after` and
/// `--fault-sync-delay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultSync {
    /// Successful syncs before the failures start; `None`: never fail.
    pub after: Option<u64>,
    /// The errno the failing sync reports.
    pub errno: i32,
    /// How long each sync sleeps first.
    pub delay: Option<Duration>,
}

/// Room a reply needs beside a job's payload and metadata: ids, names,
/// times and a history of a few dozen attempts with their errors.
const REPLY_HEADROOM: usize = 64 * 1024;

/// A duration as the flags take it, in units no longer than a day, or
/// whole years: `365days`, not humantime's `11months 30days 3h 50m 24s`
/// (it counts a month as 30.44 days), and `1000years`.
pub fn duration_text(d: Duration) -> String {
    const DAY: u64 = 24 * 60 * 60;
    // humantime's year (365.25 days): `1000years` reads back as written.
    const YEAR: u64 = 31_557_600;
    if d.subsec_nanos() == 0 && d.as_secs() >= YEAR && d.as_secs() % YEAR == 0 {
        return format!("{}years", d.as_secs() / YEAR);
    }
    let days = d.as_secs() / DAY;
    let rest = d - Duration::from_secs(days * DAY);
    match (days, rest.is_zero()) {
        (0, _) => humantime::format_duration(rest).to_string(),
        (_, true) => format!("{days}days"),
        (_, false) => format!("{days}days {}", humantime::format_duration(rest)),
    }
}

impl Config {
    /// The defaults, with the given data folder; for tests and embedding.
    pub fn with_data(data: impl Into<PathBuf>) -> Config {
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            config: Config,
        }
        // Parsing an empty command line applies every default in one place.
        // Environment variables are read too, as for the real binary.
        let mut config = <Wrap as clap::Parser>::try_parse_from(["jobq"])
            .map(|w| w.config)
            .unwrap_or_else(|e| panic!("invalid JOBQ_* environment: {e}"));
        config.data = data.into();
        // Embedded servers (tests, other programs) open no HTTP port unless
        // asked to.
        config.http_listen = HttpListen(None);
        config
    }

    /// The injected fsync failure, if any.
    pub fn fault_sync(&self) -> Option<FaultSync> {
        if self.fault_sync_after.is_none() && self.fault_sync_delay.is_none() {
            return None;
        }
        Some(FaultSync {
            after: self.fault_sync_after,
            errno: if self.fault_sync_error == "ENOSPC" {
                libc_enospc()
            } else {
                libc_eio()
            },
            delay: self.fault_sync_delay,
        })
    }

    /// Refuses to expose the queue by accident: a non-loopback `--listen`
    /// needs TLS and a way to tell callers apart (tokens or client
    /// certificates), and a non-loopback `--http-listen` needs tokens,
    /// unless `--insecure`.
    ///
    /// # Errors
    /// The reason, naming the flags that would fix it.
    pub fn check_exposure(&self) -> Result<(), String> {
        if self.insecure {
            return Ok(());
        }
        let tls = self.tls_cert.is_some();
        let callers_known = self.auth_tokens.is_some() || self.tls_client_ca.is_some();
        let secured = tls && callers_known;
        if !(self.listen.ip().is_loopback() || secured) {
            let missing = match (tls, callers_known) {
                (false, false) => "without TLS and without tokens",
                (false, true) => "without TLS (tokens would cross the network in clear)",
                _ => "without tokens or client certificates (anyone could call it)",
            };
            return Err(format!(
                "refusing to listen on {} {missing}: anyone who can reach it could read every payload and ack, fail or retry any job. \
                 Use --tls-cert/--tls-key with --auth-tokens (or --tls-client-ca), listen on 127.0.0.1, \
                 or pass --insecure if the network is trusted",
                self.listen
            ));
        }
        if let Some(http) = self.http_listen.0 {
            if !http.ip().is_loopback() {
                let why = if self.auth_tokens.is_none() {
                    "without --auth-tokens: anyone who can reach it could read jobs and retry them"
                } else {
                    "over plain HTTP: tokens and job data would cross the network in clear"
                };
                return Err(format!(
                    "refusing to serve the dashboard and /metrics on {http} {why}. \
                     Keep --http-listen on 127.0.0.1 (behind a TLS-terminating proxy if others need it), set it to off, or pass --insecure"
                ));
            }
        }
        Ok(())
    }

    /// Refuses limits that contradict each other, or that would put a
    /// job's times out of every store's reach (PostgreSQL's timestamps end
    /// in 294276, the encoding of its driver overflows long before; sled's
    /// index saturates in 2554): a lease, delay or backoff of at most
    /// [`MAX_LIMIT_DURATION`], and `--min-lease` ≤ `--default-lease` ≤
    /// `--max-lease`, `--backoff-base` ≤ `--backoff-cap`.
    ///
    /// # Errors
    /// The first contradiction, naming its flags.
    pub fn check_limits(&self) -> Result<(), String> {
        let longest = [
            ("--max-lease", self.max_lease),
            ("--default-lease", self.default_lease),
            ("--max-delay", self.max_delay),
            ("--backoff-cap", self.backoff_cap),
        ];
        for (flag, value) in longest {
            if value > MAX_LIMIT_DURATION {
                return Err(format!(
                    "{flag} {} is over the longest jobq accepts, {}",
                    duration_text(value),
                    duration_text(MAX_LIMIT_DURATION)
                ));
            }
        }
        let ordered = [
            (
                "--min-lease",
                self.min_lease,
                "--default-lease",
                self.default_lease,
            ),
            (
                "--default-lease",
                self.default_lease,
                "--max-lease",
                self.max_lease,
            ),
            (
                "--backoff-base",
                self.backoff_base,
                "--backoff-cap",
                self.backoff_cap,
            ),
        ];
        for (low_flag, low, high_flag, high) in ordered {
            if low > high {
                return Err(format!(
                    "{low_flag} {} is longer than {high_flag} {}",
                    duration_text(low),
                    duration_text(high)
                ));
            }
        }
        if self.min_lease.is_zero() {
            return Err("--min-lease must be longer than 0s".into());
        }
        if self.max_connections_per_peer == Some(0) {
            return Err("--max-connections-per-peer must be at least 1".into());
        }
        if self.max_streams_per_connection == 0 {
            return Err("--max-streams-per-connection must be at least 1".into());
        }
        let http = [
            ("--http-header-timeout", self.http_header_timeout),
            ("--http-idle-timeout", self.http_idle_timeout),
            ("--http-request-timeout", self.http_request_timeout),
            ("--http-session-lifetime", self.http_session_lifetime),
        ];
        for (flag, value) in http {
            if value.is_zero() || value > MAX_LIMIT_DURATION {
                return Err(format!(
                    "{flag} {} must be longer than 0s and at most {}",
                    duration_text(value),
                    duration_text(MAX_LIMIT_DURATION)
                ));
            }
        }
        if self.http_max_sessions == 0 {
            return Err("--http-max-sessions must be at least 1".into());
        }
        // PostgreSQL takes whole milliseconds up to i32::MAX.
        let longest_statement = Duration::from_millis(u64::from(i32::MAX.unsigned_abs()));
        if self.pg_statement_timeout > longest_statement {
            return Err(format!(
                "--pg-statement-timeout {} is over the longest PostgreSQL takes, {}",
                duration_text(self.pg_statement_timeout),
                duration_text(longest_statement)
            ));
        }
        // PostgreSQL keeps max_attempts in an integer column.
        let most_attempts = u32::try_from(i32::MAX).unwrap_or(u32::MAX);
        if self.max_attempts_limit > most_attempts {
            return Err(format!(
                "--max-attempts-limit {} is over the most jobq stores, {most_attempts}",
                self.max_attempts_limit
            ));
        }
        if self.default_max_attempts == 0 || self.default_max_attempts > self.max_attempts_limit {
            return Err(format!(
                "--default-max-attempts {} must be between 1 and --max-attempts-limit {}",
                self.default_max_attempts, self.max_attempts_limit
            ));
        }
        // A job travels whole in one reply (Dequeue, Lease, GetJob with
        // its result): one that --max-message-bytes cannot carry would be
        // accepted, taken and never delivered, spending its attempts, or
        // acked and never read.
        let needed = self
            .max_payload
            .saturating_add(self.max_metadata_bytes)
            .saturating_add(self.max_result_bytes)
            .saturating_add(self.max_progress_message_bytes)
            .saturating_add(REPLY_HEADROOM);
        if needed > self.max_message_bytes {
            return Err(format!(
                "--max-message-bytes {} cannot carry a job with --max-payload {}, --max-metadata-bytes {} and --max-result-bytes {} (it needs {needed}: {} more for the job's other fields and history); such a job could be accepted and never delivered",
                self.max_message_bytes,
                self.max_payload,
                self.max_metadata_bytes,
                self.max_result_bytes,
                REPLY_HEADROOM
            ));
        }
        if self.max_page_bytes > self.max_message_bytes {
            return Err(format!(
                "--max-page-bytes {} is over --max-message-bytes {}: a full page could not be sent",
                self.max_page_bytes, self.max_message_bytes
            ));
        }
        Ok(())
    }

    /// The backoff policy.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            base: self.backoff_base,
            cap: self.backoff_cap,
        }
    }
}

/// `--max-paused-queues` unless set: a few per team is plenty, and each
/// is an entry of every Stats reply.
pub const DEFAULT_MAX_PAUSED_QUEUES: usize = 1000;

/// `--max-queue-policies` unless set: like pauses, each is an entry of
/// every Stats reply.
pub const DEFAULT_MAX_QUEUE_POLICIES: usize = 1000;

/// The longest lease, delay or backoff a flag may allow: 100 years.
pub const MAX_LIMIT_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// EIO on Linux (and every Unix jobq runs on).
const fn libc_eio() -> i32 {
    5
}

/// ENOSPC on Linux.
const fn libc_enospc() -> i32 {
    28
}

/// `--http-listen`: an address, or `off` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpListen(pub Option<SocketAddr>);

fn parse_http_listen(s: &str) -> Result<HttpListen, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(HttpListen(None));
    }
    s.parse()
        .map(|a| HttpListen(Some(a)))
        .map_err(|e| format!("{s:?} is neither an address nor `off`: {e}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::duration_text;

    #[test]
    fn limits_read_back_in_the_units_the_flags_take() {
        const DAY: u64 = 24 * 60 * 60;
        assert_eq!(duration_text(Duration::from_secs(365 * DAY)), "365days");
        assert_eq!(
            duration_text(Duration::from_secs(400 * DAY + 90)),
            "400days 1m 30s"
        );
        assert_eq!(duration_text(Duration::from_secs(12 * 3600)), "12h");
        assert_eq!(duration_text(Duration::from_millis(1500)), "1s 500ms");
        assert_eq!(duration_text(Duration::ZERO), "0s");
        assert_eq!(
            duration_text(humantime::parse_duration("1000years").unwrap()),
            "1000years"
        );
        for text in ["365days", "400days 1m 30s", "12h", "200years"] {
            let parsed = humantime::parse_duration(text).unwrap();
            assert_eq!(duration_text(parsed), text, "round trip");
        }
    }
}
