//! The PostgreSQL backend: many stateless jobq servers over one database.
//!
//! - Rows: `jobq_jobs` (one per job, mapped in [`row`]), `jobq_attempts`
//!   (the history), `jobq_servers` (live servers); created by the embedded
//!   migrations in [`schema`], applied at startup under an advisory lock.
//! - Changes: [`write`] loads the rows `FOR UPDATE`, applies
//!   [`crate::machine::apply`], and writes them fenced on the lease they
//!   were loaded with, in one transaction that commits durably
//!   (`synchronous_commit` as the database has it, on by default). Takes
//!   commit with `synchronous_commit = off`, as sled's takes do not wait
//!   for their fsync: a lost take is a redelivery, and the ack that follows
//!   waits for a flush that covers it.
//! - Dequeue ([`take`]): `FOR UPDATE SKIP LOCKED` over the partial index of
//!   PENDING jobs, skipping the queues paused in `jobq_paused`.
//! - Operator writes ([`operator`]): delete a job, pause and resume a queue.
//! - Time: `now` is the database's (`now()`, the transaction's start),
//!   read in the same round trip as the rows, so every server's leases run
//!   on one clock. Decisions made before a statement (schedule ticks,
//!   purge cutoffs) read the database's clock as of the last heartbeat
//!   ([`clock`]). [`Clock::Caller`] (tests only) uses the caller's `now`.
//! - Sessions: every connection (pooled, heartbeat, LISTEN) is named
//!   `jobq <server id> <kind>` (`application_name`), and PostgreSQL probes
//!   each with TCP keepalives of its own ([`session_options`]); a server
//!   that declares another dead ends that one's sessions ([`cluster`]).
//! - Coordination: [`listen`] (LISTEN/NOTIFY for wake-ups and lease-ended
//!   events) and [`cluster`] (server registry, heartbeats, reclaim of a
//!   dead server's stream leases).

mod batch;
mod clock;
pub mod cluster;
mod error;
mod insert;
mod limited;
pub mod listen;
mod operator;
mod purge;
mod queries;
mod redact;
mod row;
mod schedules;
pub mod schema;
pub mod sql_enqueue;
mod take;
mod takes;
pub mod testing;
mod tx;
mod write;

use std::{
    collections::BTreeSet,
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
pub use error::PgError;
pub use operator::{pause_lock_key, PAUSE_LOCK};
pub use queries::{list_sizes, ListFilters, NEXT_RUN_AT};
pub use redact::{redact, UNPARSEABLE};
pub use sql_enqueue::EnqueueLimits;
pub use take::dequeue;
use tokio::task::AbortHandle;
use tokio_postgres::NoTls;

use super::{
    rules::Retention, Backend, Change, Enqueued, Jobs, ListFilter, Page, QueueStats, Remote,
};
use crate::{
    config::Config,
    error::Result,
    job::{JobId, LeaseId, NewJob},
    machine::Event,
    policy::QueuePolicy,
};

/// The store over PostgreSQL: [`Jobs`] over [`Pg`].
pub type PgStore = Jobs<Pg>;

/// Whose clock a change uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The database's `now()`: one clock for every server. The default.
    Database,
    /// The `now` the caller passes: for tests that replay time.
    Caller,
}

/// How to reach and use the database.
#[derive(Clone)]
pub struct PgOptions {
    /// `postgres://user:pass@host:port/db`.
    pub url: String,
    /// Most pooled connections (`--pg-pool-size`).
    pub pool_size: usize,
    /// A server silent this long is dead (`--server-timeout`).
    pub server_timeout: Duration,
    /// Whose clock.
    pub clock: Clock,
    /// Most transitions per group-commit transaction (`--pg-group-commit`);
    /// 1 commits each call on its own.
    pub group_commit: usize,
    /// `statement_timeout` of every pooled session
    /// (`--pg-statement-timeout`); zero for none.
    pub statement_timeout: Duration,
    /// The limits `jobq_enqueue(…)` applies, published at connect.
    pub enqueue: EnqueueLimits,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &redact(&self.url))
            .field("pool_size", &self.pool_size)
            .field("server_timeout", &self.server_timeout)
            .field("clock", &self.clock)
            .field("group_commit", &self.group_commit)
            .field("statement_timeout", &self.statement_timeout)
            .field("enqueue", &self.enqueue)
            .finish()
    }
}

impl PgOptions {
    /// The options of `config` (whose `store` is the URL), database clock.
    pub fn of(config: &Config, url: &str) -> PgOptions {
        PgOptions {
            url: url.to_owned(),
            pool_size: config.pg_pool_size,
            server_timeout: config.server_timeout,
            clock: Clock::Database,
            group_commit: config.pg_group_commit,
            statement_timeout: config.pg_statement_timeout,
            enqueue: EnqueueLimits::of(config),
        }
    }
}

/// The shortest `idle_in_transaction_session_timeout` set on a session.
const MIN_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);

/// libpq's default TCP keepalive idle time, which tokio-postgres keeps.
const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// TCP keepalives and a TCP user timeout on every connection (pool,
/// heartbeat, LISTEN), unless the URL sets them: with the defaults, a
/// connection whose peer vanished (a failover, a NAT that forgot it) stays
/// half-open for two hours. The LISTEN connection would then hear nothing
/// and never reconnect (waiting workers miss other servers' jobs), and a
/// query or heartbeat would hang for the kernel's ~15 minutes of
/// retransmissions instead of failing within about `--server-timeout`.
fn keep_alive(pg_config: &mut tokio_postgres::Config, server_timeout: Duration) {
    let timeout = server_timeout.max(MIN_IDLE_IN_TRANSACTION);
    if pg_config.get_keepalives_idle() == DEFAULT_KEEPALIVES_IDLE {
        pg_config
            .keepalives(true)
            .keepalives_idle(timeout)
            .keepalives_interval((timeout / 5).max(Duration::from_secs(1)))
            .keepalives_retries(5);
    }
    if pg_config.get_tcp_user_timeout().is_none() {
        pg_config.tcp_user_timeout(timeout * 2);
    }
}

/// The TCP keepalives that PostgreSQL applies to its end of every session
/// jobq opens (`tcp_keepalives_*`, `tcp_user_timeout`), as the client side
/// has them ([`keep_alive`]): without them, the database keeps the session
/// of a server whose machine vanished (powered off, cut off) for the
/// kernel's two hours of keepalive idle. That session's LISTEN stops
/// reading, so the notification queue, which every listener shares, keeps
/// the notifications it has not read, and the row locks of a transaction
/// it had open stay held until `idle_in_transaction_session_timeout`.
/// With these, PostgreSQL ends such a session within about twice
/// `--server-timeout` (at least 10 s) of its going silent: probes from
/// one timeout of silence on, five of them a fifth of it apart, or, while
/// notifications wait unacknowledged, `tcp_user_timeout`. Given first, so
/// the URL's own `options` win. No `idle_session_timeout`: the LISTEN
/// session and pooled connections are idle by design, and ending them
/// would only make a live server reconnect; the keepalives end the
/// sessions whose peer is gone, and the survivors end a dead server's
/// (see [`cluster`]).
fn server_keepalives(server_timeout: Duration) -> String {
    let idle = server_timeout.max(MIN_IDLE_IN_TRANSACTION);
    let interval = (idle / 5).max(Duration::from_secs(1));
    format!(
        "-c tcp_keepalives_idle={} -c tcp_keepalives_interval={} -c tcp_keepalives_count={KEEPALIVE_PROBES} \
         -c tcp_user_timeout={}",
        idle.as_secs(),
        interval.as_secs(),
        (idle * 2).as_millis()
    )
}

/// Keepalive probes unanswered before a connection counts as dead.
const KEEPALIVE_PROBES: u32 = 5;

/// The `options` startup parameter of every session: the database-side
/// keepalives, then the URL's own options, then the timeouts jobq insists
/// on (see [`Pg::connect`]).
fn session_options(
    given: Option<&str>,
    server_timeout: Duration,
    statement_timeout: Duration,
) -> String {
    // A server frozen in the middle of a transaction (a paused VM or
    // container, a stopped process) holds its row locks, and every
    // other server's changes to those jobs wait for it: PostgreSQL
    // ends such a session once it has been idle inside a transaction
    // for as long as a silent server counts as dead (at least 5 s, so
    // that a loaded machine's pause between two statements is not
    // taken for it). jobq's own transactions never idle that long
    // between statements.
    let idle = server_timeout.max(MIN_IDLE_IN_TRANSACTION).as_millis();
    let mut options = server_keepalives(server_timeout);
    if let Some(given) = given.filter(|g| !g.is_empty()) {
        options.push(' ');
        options.push_str(given);
    }
    options.push_str(&format!(
        " -c idle_in_transaction_session_timeout={idle} -c statement_timeout={}",
        // Whole milliseconds, rounded up: 0 would mean none.
        statement_timeout.as_nanos().div_ceil(1_000_000)
    ));
    options
}

/// The `application_name` of this server's sessions of one kind: `jobq
/// <server id> <kind>`, then the URL's own name if it gave one. The
/// server id comes first, so PostgreSQL's cut at 63 bytes never loses it:
/// an operator sees whose session each is in `pg_stat_activity`, and the
/// server that declares this one dead finds and ends them.
pub fn application_name(server: &str, kind: &str, given: Option<&str>) -> String {
    match given.filter(|g| !g.is_empty()) {
        Some(given) => format!("{SESSION_PREFIX}{server} {kind} {given}"),
        None => format!("{SESSION_PREFIX}{server} {kind}"),
    }
}

/// What every jobq session's `application_name` starts with.
pub const SESSION_PREFIX: &str = "jobq ";

/// `config` for a session of one kind (see [`application_name`]).
fn named(config: &tokio_postgres::Config, server: &str, kind: &str) -> tokio_postgres::Config {
    let mut named = config.clone();
    named.application_name(application_name(
        server,
        kind,
        config.get_application_name(),
    ));
    named
}

/// The PostgreSQL backend. See the module docs.
pub struct Pg {
    core: Arc<Core>,
    /// How the LISTEN connection connects.
    listen_config: tokio_postgres::Config,
    /// How the notifying connection connects (see [`listen`]).
    notify_config: tokio_postgres::Config,
    /// One connection of its own for this server's heartbeat: behind a
    /// pool that slow reads or a stuck row lock have drained, it would
    /// wait past `--server-timeout`, and the other servers would take this
    /// live server for dead and reclaim its streams' leases.
    heartbeats: Pool,
    /// The database's clock as of the last heartbeat (see [`clock`]).
    db_clock: clock::DbClock,
    listener: Mutex<Option<AbortHandle>>,
    /// The task that folds the job counts (see [`queries::fold_counts`]).
    folder: Mutex<Option<AbortHandle>>,
    remote: std::sync::OnceLock<Remote>,
    /// Group commit of transitions; `None` with the caller's clock (tests
    /// replay each caller's own `now`) or `--pg-group-commit 1`.
    batcher: Option<batch::Batcher<batch::Apply>>,
    /// Group commit of enqueues, likewise.
    inserter: Option<batch::Batcher<batch::Insert>>,
    /// Takes that arrive together share a transaction, likewise.
    batched_takes: Option<takes::Takes>,
    /// The notifier's end of [`Core::outbox`], until [`Backend::attach`]
    /// starts the LISTEN task with it.
    inbox: Mutex<Option<listen::Inbox>>,
    /// Servers whose heartbeat was older than `--server-timeout` at this
    /// server's last heartbeat (see [`cluster::heartbeat`]).
    silent: AtomicU64,
}

/// What every statement needs, shared with the group-commit task.
pub struct Core {
    pool: Pool,
    /// Takes hold at most half the pool at once: a burst of Lease streams
    /// woken together must not leave acks, fails, heartbeats and cancels
    /// waiting for a connection while their leases run out.
    takes: tokio::sync::Semaphore,
    /// This server's id in `jobq_servers`, fresh per process.
    me: String,
    /// A server silent this long is dead (`--server-timeout`).
    server_timeout: Duration,
    /// Next due times read by takes that came up short (see [`takes`]).
    recent: takes::Recent,
    clock: Clock,
    doubles: AtomicU64,
    batches: AtomicU64,
    batched: AtomicU64,
    /// Wake-ups for the other servers, sent after the commit by the LISTEN
    /// task ([`listen`]).
    outbox: listen::Outbox,
    /// Which queues have a policy, as this server last read it.
    limits: limited::Limits,
}

impl std::ops::Deref for Pg {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        for task in [&self.listener, &self.folder] {
            if let Some(task) = task.lock().unwrap_or_else(|p| p.into_inner()).take() {
                task.abort();
            }
        }
    }
}

/// Parses a `--store` URL.
///
/// # Errors
/// [`PgError::Url`] when it does not parse.
pub fn parse_url(url: &str) -> Result<tokio_postgres::Config, PgError> {
    url.parse::<tokio_postgres::Config>()
        .map_err(|e| PgError::Url(e.to_string()))
}

/// Applies the embedded migrations (`jobq migrate`); returns the versions
/// applied.
///
/// # Errors
/// When the database cannot be reached or a migration fails.
pub async fn migrate(url: &str) -> Result<Vec<i32>> {
    let config = parse_url(url)?;
    let (mut client, connection) = config.connect(NoTls).await.map_err(PgError::from)?;
    let driver = tokio::spawn(connection);
    let applied = schema::migrate(&mut client).await;
    drop(client);
    let _ = driver.await;
    Ok(applied?)
}

impl Jobs<Pg> {
    /// Connects, migrates, registers this server, and returns the store.
    ///
    /// # Errors
    /// See [`Pg::connect`].
    pub async fn connect(config: &Config, options: PgOptions) -> Result<PgStore> {
        Ok(Jobs::new(Pg::connect(options).await?, config.backoff())
            .deliver_before_durable(config.deliver_before_fsync)
            .max_paused_queues(config.max_paused_queues)
            .max_queue_policies(config.max_queue_policies))
    }
}

impl Pg {
    /// Builds the pool, applies the migrations, and registers this server.
    ///
    /// # Errors
    /// When the URL is malformed, the database cannot be reached, or a
    /// migration fails.
    pub async fn connect(options: PgOptions) -> Result<Pg> {
        let mut pg_config = parse_url(&options.url)?;
        let combined = session_options(
            pg_config.get_options(),
            options.server_timeout,
            options.statement_timeout,
        );
        pg_config.options(&combined);
        keep_alive(&mut pg_config, options.server_timeout);
        let me = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        let manager = Manager::from_config(
            named(&pg_config, &me, "pool"),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(2))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(10)))
            .build()
            .map_err(PgError::from)?;
        let heartbeats = Pool::builder(Manager::from_config(
            named(&pg_config, &me, "heartbeat"),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        ))
        .max_size(1)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(options.server_timeout))
        .build()
        .map_err(PgError::from)?;
        {
            let mut client = pool.get().await.map_err(PgError::from)?;
            schema::migrate(&mut client).await?;
            sql_enqueue::publish(&**client, &options.enqueue, &me).await?;
        }
        let (outbox, inbox) = tokio::sync::mpsc::unbounded_channel();
        let core = Arc::new(Core {
            outbox,
            server_timeout: options.server_timeout,
            recent: takes::Recent::default(),
            pool,
            takes: tokio::sync::Semaphore::new((options.pool_size.max(2) / 2).max(1)),
            me: me.clone(),
            clock: options.clock,
            doubles: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            batched: AtomicU64::new(0),
            limits: limited::Limits::default(),
        });
        operator::policies(&core).await?;
        let batching = options.clock == Clock::Database && options.group_commit > 1;
        // Half the pool for transitions, a quarter for enqueues, the rest
        // for takes and reads.
        let batcher = batching.then(|| {
            let lanes = (options.pool_size / 2).max(1);
            batch::Batcher::start(Arc::downgrade(&core), options.group_commit, lanes)
        });
        let inserter = batching.then(|| {
            let lanes = (options.pool_size / 4).max(1);
            batch::Batcher::start(Arc::downgrade(&core), options.group_commit, lanes)
        });
        let batched_takes = batching.then(|| takes::Takes::start(Arc::downgrade(&core)));
        let pg = Pg {
            core,
            batched_takes,
            listen_config: named(&pg_config, &me, "listen"),
            notify_config: named(&pg_config, &me, "notify"),
            heartbeats,
            db_clock: clock::DbClock::default(),
            listener: Mutex::new(None),
            folder: Mutex::new(None),
            remote: std::sync::OnceLock::new(),
            batcher,
            inserter,
            inbox: Mutex::new(Some(inbox)),
            silent: AtomicU64::new(0),
        };
        let silent = cluster::heartbeat(&pg).await?;
        pg.silent.store(silent, Ordering::Relaxed);
        Ok(pg)
    }

    /// Records a reading of the database's clock (see [`clock`]).
    fn observed_clock(&self, at: SystemTime, returned: Instant) {
        self.db_clock.observed(at, returned);
    }

    /// Group-commit transactions that carried more than one caller, and
    /// the callers they carried.
    pub fn group_commits(&self) -> (u64, u64) {
        (
            self.batches.load(Ordering::Relaxed),
            self.batched.load(Ordering::Relaxed),
        )
    }

    /// Calls (transitions, enqueues) waiting for a group-commit
    /// transaction: queued while every lane of their kind is busy.
    pub fn group_commit_queued(&self) -> (usize, usize) {
        (
            self.batcher.as_ref().map_or(0, batch::Batcher::queued),
            self.inserter.as_ref().map_or(0, batch::Batcher::queued),
        )
    }
}

impl Core {
    /// This server's id in `jobq_servers`.
    pub fn server_id(&self) -> &str {
        &self.me
    }

    /// The pool, for tests and tools that inspect the database.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    fn count_batch(&self, callers: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched.fetch_add(callers as u64, Ordering::Relaxed);
    }

    /// `now` as a statement parameter: `None` lets the database use its
    /// own (`coalesce($n, now())`).
    fn now_param(&self, now: SystemTime) -> Option<SystemTime> {
        match self.clock {
            Clock::Database => None,
            Clock::Caller => Some(now),
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, PgError> {
        Ok(self.pool.get().await?)
    }

    /// Hands committed queues that have a job due to the notifier, for the
    /// other servers' waiters (this server's are woken by the store).
    fn due(&self, queues: impl IntoIterator<Item = String>) {
        for queue in queues {
            // Closed only with the store.
            let _ = self.outbox.send(listen::Outgoing::Due(queue));
        }
    }

    async fn apply_events(
        &self,
        events: Vec<(JobId, Event)>,
        now: SystemTime,
    ) -> Result<Vec<Result<Change>>, PgError> {
        let tx = tx::Open::new(self.client().await?);
        let ids: BTreeSet<JobId> = events.iter().map(|(id, _)| *id).collect();
        let (_, db_now, loaded) = futures::try_join!(
            tx.begin(),
            queries::now(tx.client(), self.now_param(now)),
            write::lock(&tx, &ids)
        )?;
        let (results, writes, doubles) = write::apply_all(loaded, events, db_now);
        if doubles > 0 {
            self.doubles.fetch_add(doubles, Ordering::Relaxed);
            tracing::info!(
                doubles,
                "reclaims refused: another server had reclaimed the lease first (fenced, harmless)"
            );
        }
        let due = match write::write(&tx, self, &writes).await {
            Ok(due) => due,
            Err(err) => {
                tx.rollback().await;
                return Err(err);
            }
        };
        tx.commit().await?;
        self.due(due);
        Ok(results)
    }
}

impl Backend for Pg {
    type Cluster = Pg;

    fn cluster(&self) -> Option<&Pg> {
        Some(self)
    }

    fn attach(&self, remote: Remote) {
        let _ = self.remote.set(remote.clone());
        let Some(inbox) = self.inbox.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let task = tokio::spawn(listen::run(
            self.listen_config.clone(),
            self.notify_config.clone(),
            self.me.clone(),
            remote,
            inbox,
        ));
        *self.listener.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.abort_handle());
        let folder = tokio::spawn(queries::fold_counts_forever(Arc::downgrade(&self.core)));
        *self.folder.lock().unwrap_or_else(|p| p.into_inner()) = Some(folder.abort_handle());
    }

    /// Every insert is a network round trip (or a wait for a group-commit
    /// lane): run to the end even if the caller gives up.
    fn insert_waits(&self, _batch: &[NewJob]) -> bool {
        true
    }

    fn apply_waits(&self) -> bool {
        true
    }

    async fn insert(&self, batch: Vec<NewJob>, now: SystemTime) -> Result<Vec<Enqueued>> {
        match &self.inserter {
            Some(inserter) => Ok(inserter.run(batch, now).await?),
            None => Ok(insert::insert(&self.core, batch, now).await?),
        }
    }

    async fn take(
        &self,
        queues: &[String],
        take: Event,
        streamed: bool,
        now: SystemTime,
    ) -> Result<Option<Change>> {
        // Only a stream's takes share transactions: a stream's task waits
        // for its take to the end, while a Dequeue's caller may go away
        // midway, and a job taken for it in a shared transaction would
        // then stay leased to nobody until its lease ran out.
        match (&self.batched_takes, streamed) {
            (Some(takes), true) => Ok(takes.take(queues, take, streamed, now).await?),
            _ => {
                let taken = take::take(self, queues, take, streamed, now).await?;
                if taken.is_none() {
                    // Its caller asks for the next due time next: from the
                    // database, not from a reading older than this take.
                    self.recent.forget(queues);
                }
                Ok(taken)
            }
        }
    }

    async fn apply(
        &self,
        events: Vec<(JobId, Event)>,
        now: SystemTime,
    ) -> Result<Vec<Result<Change>>> {
        match &self.batcher {
            Some(batcher) => Ok(batcher.run(events, now).await?),
            None => Ok(self.apply_events(events, now).await?),
        }
    }

    async fn set_paused(&self, queue: &str, paused: bool, most: usize) -> Result<()> {
        operator::set_paused(self, queue, paused, most).await
    }

    async fn paused(&self) -> Result<Vec<String>> {
        Ok(operator::paused(self).await?)
    }

    async fn set_policy(&self, queue: &str, policy: QueuePolicy, most: usize) -> Result<()> {
        operator::set_policy(self, queue, policy, most).await
    }

    async fn policies(&self) -> Result<Vec<(String, QueuePolicy)>> {
        Ok(operator::policies(self).await?)
    }

    fn limited(&self, queue: &str) -> bool {
        self.limits.freed_by_changes(queue)
    }

    async fn expiring(&self, at: SystemTime) -> Result<Vec<(JobId, LeaseId)>> {
        Ok(queries::expiring(self, at).await?)
    }

    async fn last_pending(&self, queue: &str) -> Result<Option<JobId>> {
        Ok(purge::last_pending(self, queue).await?)
    }

    async fn purge_chunk(
        &self,
        after: Option<JobId>,
        retention: Retention,
    ) -> Result<(u64, Option<JobId>)> {
        Ok(purge::purge_chunk(self, after, retention).await?)
    }

    async fn delete(&self, id: JobId) -> Result<()> {
        operator::delete(self, id).await
    }

    async fn put_schedule(&self, schedule: &crate::schedule::Schedule) -> Result<()> {
        Ok(schedules::put(self, schedule).await?)
    }

    async fn delete_schedule(&self, name: &str) -> Result<Option<crate::schedule::Schedule>> {
        Ok(schedules::delete(self, name).await?)
    }

    async fn schedules(&self) -> Result<Vec<crate::schedule::Schedule>> {
        Ok(schedules::all(self).await?)
    }

    async fn schedule(&self, name: &str) -> Result<Option<crate::schedule::Schedule>> {
        Ok(schedules::get(self, name).await?)
    }

    async fn schedule_ticked(
        &self,
        name: &str,
        created_at: SystemTime,
        tick: SystemTime,
    ) -> Result<()> {
        Ok(schedules::ticked(self, name, created_at, tick).await?)
    }

    async fn get(&self, id: JobId) -> Result<crate::job::Job> {
        queries::get(self, id, true).await
    }

    async fn peek(&self, id: JobId) -> Result<crate::job::Job> {
        queries::get(self, id, false).await
    }

    async fn list(&self, filter: ListFilter) -> Result<Page> {
        Ok(queries::list(self, &filter).await?)
    }

    async fn stats(&self, queue: Option<&str>, now: SystemTime) -> Result<Vec<QueueStats>> {
        Ok(queries::stats(self, queue, now).await?)
    }

    async fn next_run_at(&self, queues: &[String]) -> Result<Option<SystemTime>> {
        let next = queries::next_run_at(self, queues).await?;
        // A due job that a take just left is held by a policy: its slot
        // freeing wakes the waiters (a wake-up); until then, and in case
        // the server that freed it did not know of the policy yet, look
        // again after a while rather than at once.
        let now = SystemTime::now();
        match next {
            Some(at) if at <= now && queues.iter().any(|q| self.limits.limited(q)) => {
                // A rate limit out of tokens: when its next one comes.
                let client = self.client().await?;
                let wait = limited::token_wait(&client, queues).await?;
                let recheck = wait.map_or(limited::RECHECK, |w| w.min(limited::RECHECK));
                Ok(Some(now + recheck))
            }
            next => Ok(next),
        }
    }

    async fn next_lease_expiry(&self) -> Result<Option<SystemTime>> {
        Ok(queries::next_lease_expiry(self).await?)
    }

    fn durable(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        // Every write committed before it returned.
        std::future::ready(Ok(()))
    }

    /// The database's clock as of the last heartbeat, moved on by this
    /// process's monotonic clock (see [`clock`]); the caller's clock in
    /// tests that replay time.
    fn now(&self) -> SystemTime {
        match self.clock {
            Clock::Database => self.db_clock.now().unwrap_or_else(SystemTime::now),
            Clock::Caller => SystemTime::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{application_name, keep_alive, parse_url, session_options};

    #[test]
    fn connections_notice_a_vanished_database_within_seconds_unless_the_url_says_otherwise() {
        let mut config = parse_url("postgres://jobq@db/jobq").unwrap();
        keep_alive(&mut config, Duration::from_secs(5));
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(5));
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&Duration::from_secs(10))
        );

        let mut own =
            parse_url("postgres://jobq@db/jobq?keepalives_idle=60&tcp_user_timeout=90").unwrap();
        keep_alive(&mut own, Duration::from_secs(5));
        assert_eq!(own.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(own.get_tcp_user_timeout(), Some(&Duration::from_secs(90)));
    }

    #[test]
    fn sessions_are_named_for_their_server_and_kept_alive_by_the_database_too() {
        let options = session_options(
            Some("-c search_path=jobq -c tcp_keepalives_idle=60"),
            Duration::from_secs(10),
            Duration::from_millis(1500),
        );
        assert_eq!(
            options,
            "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=5 \
             -c tcp_user_timeout=20000 -c search_path=jobq -c tcp_keepalives_idle=60 \
             -c idle_in_transaction_session_timeout=10000 -c statement_timeout=1500",
            "the URL's own settings come after the keepalives, so they win"
        );
        assert!(
            session_options(None, Duration::from_secs(1), Duration::ZERO)
                .starts_with("-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=1 ")
        );
        assert_eq!(
            application_name("42-0000beef", "listen", None),
            "jobq 42-0000beef listen"
        );
        assert_eq!(
            application_name("42-0000beef", "pool", Some("billing")),
            "jobq 42-0000beef pool billing"
        );
    }
}
