//! The schema, as embedded, versioned migrations applied at startup.
//!
//! Every server runs [`migrate`] when it starts, and `jobq migrate` runs it
//! by hand. It holds a session advisory lock while it looks and applies, so
//! three servers starting at once apply each migration exactly once: the
//! first takes the lock and migrates, the others wait, then find nothing
//! left to do. A migration is never edited once released: a change is a new
//! entry at the end of [`MIGRATIONS`].

use tokio_postgres::Client;
use tracing::info;

use super::error::PgError;

/// The advisory lock key of migrations (any constant; "jobq" in ASCII).
pub const MIGRATION_LOCK: i64 = 0x6a6f_6271;

/// (version, name, SQL), in order.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "jobs, attempts, servers", V1),
    (2, "paused queues", V2),
    (3, "job priorities", V3),
    (4, "schedules", V4),
    (5, "status index", V5),
    (6, "key index", V6),
    (7, "job counts", V7),
    (8, "SQL enqueue", super::sql_enqueue::MIGRATION),
    (9, "job results", V9),
    (10, "groups and queue policies", V10),
];

/// Version 1.
///
/// - `jobq_jobs`: one row per job. The lease is columns of its own so the
///   reaper and the cluster queries can index them; `lease_server` names
///   the server whose Lease stream holds the lease (NULL for a Dequeue
///   lease, which only expires). `extra` holds fields that no query looks
///   at, so adding one is a change to `row.rs` only.
/// - `jobq_jobs_due`: the dequeue's index. Partial (PENDING rows only), so
///   however many DONE rows pile up it stays the size of the backlog, and
///   ordered like the dequeue's `ORDER BY`, so the planner never needs the
///   primary key (see `take.rs`).
/// - `jobq_attempts`: the history, one row per attempt, keyed by its lease.
/// - `jobq_servers`: live servers and their heartbeats.
const V1: &str = r#"
CREATE SEQUENCE jobq_job_ids;

CREATE TABLE jobq_jobs (
    id                bigint PRIMARY KEY,
    queue             text NOT NULL,
    kind              text NOT NULL,
    payload           bytea NOT NULL,
    key               text,
    status            text NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts          integer NOT NULL,
    max_attempts      integer NOT NULL,
    enqueued_at       timestamptz NOT NULL,
    run_at            timestamptz NOT NULL,
    lease_id          bigint,
    lease_worker      text,
    lease_taken_at    timestamptz,
    lease_expires_at  timestamptz,
    lease_duration_ns bigint,
    lease_server      text,
    finished_at       timestamptz,
    last_error        text,
    extra             jsonb NOT NULL DEFAULT '{}',
    -- A job is RUNNING exactly while it holds a lease (docs/src/design.md §1).
    CONSTRAINT jobq_jobs_lease CHECK ((status = 'running') = (lease_id IS NOT NULL))
);

CREATE INDEX jobq_jobs_due ON jobq_jobs (queue, run_at, id) WHERE status = 'pending';
CREATE UNIQUE INDEX jobq_jobs_key ON jobq_jobs (queue, key) WHERE key IS NOT NULL;
CREATE INDEX jobq_jobs_expiry ON jobq_jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobq_jobs_server ON jobq_jobs (lease_server) WHERE lease_server IS NOT NULL;
CREATE INDEX jobq_jobs_queue ON jobq_jobs (queue, id);

CREATE TABLE jobq_attempts (
    job_id     bigint NOT NULL REFERENCES jobq_jobs (id) ON DELETE CASCADE,
    lease_id   bigint NOT NULL,
    seq        bigserial NOT NULL,
    worker_id  text NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz,
    outcome    text,
    error      text,
    PRIMARY KEY (job_id, lease_id)
);

CREATE TABLE jobq_servers (
    id           text PRIMARY KEY,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
"#;

/// Version 2: `jobq_paused`, one row per paused queue (PauseQueue inserts,
/// ResumeQueue deletes). Every take reads it in its own transaction, so a
/// pause made on one server holds on all of them.
const V2: &str = r#"
CREATE TABLE jobq_paused (
    queue     text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
"#;

/// Version 3: `jobq_jobs.priority` (existing jobs get 0), and the dequeue's
/// index replaced by `jobq_jobs_due_by_priority`, ordered like the new
/// dequeue's `ORDER BY priority DESC, run_at, id` (docs/src/design.md §1 rule 5).
/// Still partial: the size of the backlog, whatever piles up in DONE.
const V3: &str = r#"
ALTER TABLE jobq_jobs ADD COLUMN priority integer NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -100 AND 100);
DROP INDEX jobq_jobs_due;
CREATE INDEX jobq_jobs_due_by_priority ON jobq_jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
"#;

/// Version 4: `jobq_schedules`, one row per schedule (CreateSchedule
/// upserts, DeleteSchedule deletes); `last_tick` is the latest tick any
/// server enqueued.
const V4: &str = r#"
CREATE TABLE jobq_schedules (
    name         text PRIMARY KEY,
    queue        text NOT NULL,
    kind         text NOT NULL,
    payload      bytea NOT NULL,
    cron         text NOT NULL,
    timezone     text NOT NULL,
    max_attempts integer NOT NULL,
    created_at   timestamptz NOT NULL,
    last_tick    timestamptz
);
"#;

/// Version 5: ListJobs by status reads its page from an index, with a
/// queue (`jobq_jobs_queue_status`) or without (`jobq_jobs_status`),
/// instead of walking the jobs of other statuses in id order (all of them,
/// when none matches). Two more index entries per transition. Built
/// without CONCURRENTLY (migrations run in a transaction): writes to
/// `jobq_jobs` wait while they build.
const V5: &str = r#"
CREATE INDEX jobq_jobs_status ON jobq_jobs (status, id);
CREATE INDEX jobq_jobs_queue_status ON jobq_jobs (queue, status, id);
"#;

/// Version 6: ListJobs by key without a queue ("where is order 4711's
/// email?", in whichever queue) reads `jobq_jobs_by_key` instead of every
/// job (the unique `jobq_jobs_key` leads with the queue). Keyless jobs are
/// left out of it. Built like version 5: writes wait while it builds.
const V6: &str = r#"
CREATE INDEX jobq_jobs_by_key ON jobq_jobs (key, id) WHERE key IS NOT NULL;
"#;

/// Version 7: counts of jobs per queue and status, so that Stats, the
/// `/metrics` gauges and the dashboard read a few rows instead of counting
/// every job (docs/src/internals/postgres.md, "Counts").
///
/// A trigger on `jobq_jobs` appends each row's change of (queue, status)
/// to `jobq_count_deltas` (an insert only: no two transactions ever wait
/// on one counter), in the transaction that changes the row, whichever
/// server (or hand) changes it. The counts are `jobq_counts` plus the
/// deltas; every server folds the deltas into `jobq_counts` a few times a
/// second (`queries::fold_counts`); the deltas table is vacuumed once
/// 10,000 of its rows are dead, whatever its size, so that Stats reads
/// few. The backfill counts the jobs there are
/// under a lock that makes writes wait while it runs, as versions 5 and 6
/// do.
const V7: &str = r#"
LOCK TABLE jobq_jobs IN SHARE MODE;
CREATE TABLE jobq_counts (
    queue  text   NOT NULL,
    status text   NOT NULL,
    n      bigint NOT NULL,
    PRIMARY KEY (queue, status)
);
CREATE TABLE jobq_count_deltas (
    queue  text   NOT NULL,
    status text   NOT NULL,
    delta  bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
CREATE FUNCTION jobq_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO jobq_count_deltas VALUES (NEW.queue, NEW.status, 1);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO jobq_count_deltas VALUES (OLD.queue, OLD.status, -1);
    ELSE
        INSERT INTO jobq_count_deltas VALUES (OLD.queue, OLD.status, -1), (NEW.queue, NEW.status, 1);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobq_count_rows AFTER INSERT OR DELETE ON jobq_jobs
    FOR EACH ROW EXECUTE FUNCTION jobq_count();
CREATE TRIGGER jobq_count_moves AFTER UPDATE OF queue, status ON jobq_jobs
    FOR EACH ROW WHEN (OLD.queue IS DISTINCT FROM NEW.queue OR OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION jobq_count();
INSERT INTO jobq_counts (queue, status, n)
    SELECT queue, status, count(*) FROM jobq_jobs GROUP BY queue, status;
"#;

/// Version 9: `jobq_results`, the result each DONE job's ack stored, one
/// row per job that has one, apart from `jobq_jobs` so that no other
/// change rewrites it and only GetJob reads it; deleted with its job.
const V9: &str = r#"
CREATE TABLE jobq_results (
    job_id bigint PRIMARY KEY REFERENCES jobq_jobs (id) ON DELETE CASCADE,
    result bytea NOT NULL
);
"#;

/// Version 10: a job's group (`grp`, NULL for none; never changed after
/// the insert, so no UPDATE writes it) and `jobq_policies`, one row per
/// queue with a policy (SetQueuePolicy), read by every take of its queue
/// in the take's transaction; `jobq_rate_buckets` and
/// `jobq_group_buckets`, the token buckets of each queue and group with a
/// rate limit (no row: full), written by the takes that spend their
/// tokens, under the queue's policy lock. `jobq_jobs_groups` holds the grouped jobs
/// that are PENDING or RUNNING only: a sequence's take finds whether an
/// older job of the group is open with one probe. Adding a column with no
/// default rewrites nothing; the index is built like version 5's (writes
/// wait while it builds, over the grouped rows only, none before this).
const V10: &str = r#"
ALTER TABLE jobq_jobs ADD COLUMN grp text;
CREATE TABLE jobq_policies (
    queue             text PRIMARY KEY,
    max_running       integer NOT NULL CHECK (max_running >= 0),
    group_max_running integer NOT NULL CHECK (group_max_running >= 0),
    rate_limit        integer NOT NULL DEFAULT 0 CHECK (rate_limit >= 0),
    rate_per_us       bigint  NOT NULL DEFAULT 0 CHECK (rate_per_us >= 0),
    rate_burst        integer NOT NULL DEFAULT 0 CHECK (rate_burst >= 0),
    group_rate_limit  integer NOT NULL DEFAULT 0 CHECK (group_rate_limit >= 0),
    group_rate_per_us bigint  NOT NULL DEFAULT 0 CHECK (group_rate_per_us >= 0),
    group_rate_burst  integer NOT NULL DEFAULT 0 CHECK (group_rate_burst >= 0)
);
CREATE TABLE jobq_rate_buckets (
    queue  text PRIMARY KEY,
    tokens float8 NOT NULL,
    at     timestamptz NOT NULL
);
CREATE TABLE jobq_group_buckets (
    queue  text NOT NULL,
    grp    text NOT NULL,
    tokens float8 NOT NULL,
    at     timestamptz NOT NULL,
    PRIMARY KEY (queue, grp)
);
CREATE INDEX jobq_jobs_groups ON jobq_jobs (queue, grp, id)
    WHERE grp IS NOT NULL AND status IN ('pending', 'running');
"#;

/// Applies every migration the database lacks, under the advisory lock.
/// Returns the versions applied.
///
/// # Errors
/// A database error, or a database migrated by a newer jobq.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, PgError> {
    // Another server's migration may hold the lock for as long as an index
    // build takes: no `--pg-statement-timeout` for the wait, nor for the
    // migrations; the session's own value comes back after.
    client.batch_execute("SET statement_timeout = 0").await?;
    let result = migrate_under_lock(client).await;
    let reset = client.batch_execute("RESET statement_timeout").await;
    let applied = result?;
    reset?;
    Ok(applied)
}

async fn migrate_under_lock(client: &mut Client) -> Result<Vec<i32>, PgError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let result = migrate_locked(client).await;
    // The lock is the session's: released on disconnect even if this fails.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let applied = result?;
    unlocked?;
    Ok(applied)
}

async fn migrate_locked(client: &mut Client) -> Result<Vec<i32>, PgError> {
    client
        .batch_execute(
            "SET client_min_messages TO warning;
            CREATE TABLE IF NOT EXISTS jobq_migrations (
                version    integer PRIMARY KEY,
                name       text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )",
        )
        .await?;
    let current: i32 = client
        .query_one("SELECT coalesce(max(version), 0) FROM jobq_migrations", &[])
        .await?
        .get(0);
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > latest {
        return Err(PgError::Schema(format!(
            "the database is at schema version {current}, newer than this jobq knows ({latest}): upgrade jobq"
        )));
    }
    let mut applied = Vec::new();
    for &(version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO jobq_migrations (version, name) VALUES ($1, $2)",
            &[&version, &name],
        )
        .await?;
        tx.commit().await?;
        info!(version, name, "applied a schema migration");
        applied.push(version);
    }
    Ok(applied)
}
