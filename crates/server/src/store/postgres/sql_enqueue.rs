//! Enqueue from SQL: `jobq_enqueue(…)`, a function an application calls
//! inside its own transaction on the database jobq uses, so that the job
//! exists if and only if that transaction commits (docs/src/sql-enqueue.md).
//!
//! The function runs the checks of a gRPC Enqueue (`crate::validate`), with
//! the limits the servers publish in `jobq_enqueue_limits` when they start
//! ([`publish`]); it inserts the row a gRPC Enqueue would, meets a retained
//! job with the same key as the unique index `jobq_jobs_key` does for every
//! enqueue (so it returns that job's id, and concurrent enqueues of one key,
//! from SQL or gRPC, make one job), and sends the `jobq_due` notification in
//! the caller's transaction, which PostgreSQL delivers at commit: Lease
//! streams on every server wake then. It runs as its owner (`SECURITY
//! DEFINER`, with a fixed `search_path`), so the role `jobq_producer` needs
//! EXECUTE on it and nothing else.

use std::time::Duration;

use tokio_postgres::GenericClient;

use super::error::PgError;
use crate::config::Config;

/// The limits of an enqueue that the SQL function applies, from the
/// server's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueLimits {
    /// `--max-payload`.
    pub max_payload: usize,
    /// `--default-max-attempts`.
    pub default_max_attempts: u32,
    /// `--max-attempts-limit`.
    pub max_attempts_limit: u32,
    /// `--max-metadata-bytes`.
    pub max_metadata_bytes: usize,
    /// `--max-delay`.
    pub max_delay: Duration,
}

impl EnqueueLimits {
    /// The limits `config` sets.
    pub fn of(config: &Config) -> EnqueueLimits {
        EnqueueLimits {
            max_payload: config.max_payload,
            default_max_attempts: config.default_max_attempts,
            max_attempts_limit: config.max_attempts_limit,
            max_metadata_bytes: config.max_metadata_bytes,
            max_delay: config.max_delay,
        }
    }
}

fn int(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Writes `limits` for the SQL function, as the servers' latest word (with
/// several servers started with different flags, the last one to start
/// sets them), and warns when the role `jobq_producer` is missing.
///
/// # Errors
/// A database error.
pub async fn publish(
    client: &impl GenericClient,
    limits: &EnqueueLimits,
    server: &str,
) -> Result<(), PgError> {
    let max_delay_us = int(limits.max_delay.as_micros());
    client
        .execute(
            "UPDATE jobq_enqueue_limits SET max_payload = $1, default_max_attempts = $2, \
             max_attempts = $3, max_metadata_bytes = $4, \
             max_delay = make_interval(secs => ($5::bigint / 1e6)::double precision), \
             server = $6, updated_at = now()",
            &[
                &int(limits.max_payload),
                &int(limits.default_max_attempts),
                &int(limits.max_attempts_limit),
                &int(limits.max_metadata_bytes),
                &max_delay_us,
                &server,
            ],
        )
        .await?;
    let producer = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jobq_producer')",
            &[],
        )
        .await?;
    if !producer.try_get::<_, bool>(0)? {
        tracing::warn!(
            "no role jobq_producer (jobq's role may not create roles): grant EXECUTE on jobq_enqueue to your application's role by hand"
        );
    }
    Ok(())
}

/// Version 8: `jobq_enqueue_limits`, `jobq_enqueue(…)`, its name check, and
/// the role `jobq_producer` (created when the migrating role may create
/// roles; granted EXECUTE on the function wherever it exists).
///
/// The limits row starts with the flags' defaults; a server overwrites it
/// with its own when it starts. The functions are created in the schema
/// the tables are in (the first of the session's `search_path`), name
/// jobq's objects with that schema, and pin `pg_catalog` alone as their
/// `search_path`. Its parameters are named like the columns,
/// for callers' sake (`jobq_enqueue(queue => …, key => …)`): the body names
/// each as `jobq_enqueue.<name>`.
pub const MIGRATION: &str = r#"
CREATE TABLE jobq_enqueue_limits (
    one                  boolean PRIMARY KEY DEFAULT true CHECK (one),
    max_payload          bigint NOT NULL,
    default_max_attempts bigint NOT NULL,
    max_attempts         bigint NOT NULL,
    max_metadata_bytes   bigint NOT NULL,
    max_delay            interval NOT NULL,
    server               text,
    updated_at           timestamptz NOT NULL DEFAULT now()
);
INSERT INTO jobq_enqueue_limits (max_payload, default_max_attempts, max_attempts, max_metadata_bytes, max_delay)
    VALUES (1048576, 3, 1000, 8192, interval '365 days');

-- Built with the schema's name written into them (`@s@`): their
-- search_path is pg_catalog alone, so nobody who may create objects in
-- jobq's schema can put an operator or function in the way of the
-- owner's code.
DO $do$
BEGIN
EXECUTE replace($create$
CREATE FUNCTION @s@.jobq_check_name(field text, value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    bad text;
BEGIN
    IF value IS NULL OR value = '' THEN
        RAISE EXCEPTION 'jobq_enqueue: % must not be empty', field
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(value) > 128 THEN
        RAISE EXCEPTION 'jobq_enqueue: % is % characters long; the limit is 128', field, octet_length(value)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    bad := substring(value FROM '[^A-Za-z0-9._:-]');
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'jobq_enqueue: % contains "%"; allowed are A-Z a-z 0-9 . _ : -', field, bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$
$create$, '@s@', quote_ident(current_schema()));
-- The count trigger (version 7) runs inside jobq_enqueue as its owner too.
EXECUTE replace($create$
CREATE OR REPLACE FUNCTION @s@.jobq_count() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO @s@.jobq_count_deltas VALUES (NEW.queue, NEW.status, 1);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO @s@.jobq_count_deltas VALUES (OLD.queue, OLD.status, -1);
    ELSE
        INSERT INTO @s@.jobq_count_deltas VALUES (OLD.queue, OLD.status, -1), (NEW.queue, NEW.status, 1);
    END IF;
    RETURN NULL;
END
$fn$
$create$, '@s@', quote_ident(current_schema()));
EXECUTE replace($create$
CREATE FUNCTION @s@.jobq_enqueue(
    queue        text,
    kind         text,
    payload      bytea       DEFAULT '\x',
    key          text        DEFAULT NULL,
    run_at       timestamptz DEFAULT NULL,
    delay        interval    DEFAULT NULL,
    priority     integer     DEFAULT 0,
    max_attempts integer     DEFAULT 0,
    metadata     jsonb       DEFAULT '{}'
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
#variable_conflict use_column
DECLARE
    lim      @s@.jobq_enqueue_limits%ROWTYPE;
    the_key  text := nullif(jobq_enqueue.key, '');
    tries    bigint := coalesce(jobq_enqueue.max_attempts, 0);
    prio     integer := coalesce(jobq_enqueue.priority, 0);
    meta     jsonb := coalesce(jobq_enqueue.metadata, '{}');
    due      timestamptz;
    bytes    bigint := 0;
    m        record;
    new_id   bigint;
BEGIN
    SELECT * INTO lim FROM @s@.jobq_enqueue_limits;
    PERFORM @s@.jobq_check_name('queue', jobq_enqueue.queue);
    PERFORM @s@.jobq_check_name('kind', jobq_enqueue.kind);
    IF the_key IS NOT NULL THEN
        PERFORM @s@.jobq_check_name('key', the_key);
    END IF;
    IF octet_length(coalesce(jobq_enqueue.payload, '\x')) > lim.max_payload THEN
        RAISE EXCEPTION 'jobq_enqueue: payload is % bytes; the limit is % (--max-payload)',
            octet_length(jobq_enqueue.payload), lim.max_payload
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tries < 0 THEN
        RAISE EXCEPTION 'jobq_enqueue: max_attempts % is negative', tries
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF tries = 0 THEN
        tries := greatest(lim.default_max_attempts, 1);
    ELSIF tries > lim.max_attempts THEN
        RAISE EXCEPTION 'jobq_enqueue: max_attempts % is over the limit of %', tries, lim.max_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF prio NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'jobq_enqueue: priority % is out of range: -100..=100', prio
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jobq_enqueue.run_at IS NOT NULL AND jobq_enqueue.delay IS NOT NULL THEN
        RAISE EXCEPTION 'jobq_enqueue: give run_at or delay, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jobq_enqueue.delay < interval '0' THEN
        RAISE EXCEPTION 'jobq_enqueue: delay % is negative', jobq_enqueue.delay
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    due := greatest(now(), coalesce(jobq_enqueue.run_at, now() + coalesce(jobq_enqueue.delay, interval '0')));
    IF due - now() > lim.max_delay THEN
        RAISE EXCEPTION 'jobq_enqueue: the job would wait % from now; the limit is % (--max-delay)',
            due - now(), lim.max_delay
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(meta) <> 'object' THEN
        RAISE EXCEPTION 'jobq_enqueue: metadata must be a JSON object of strings, not %', jsonb_typeof(meta)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR m IN SELECT * FROM jsonb_each(meta) LOOP
        PERFORM @s@.jobq_check_name('metadata key', m.key);
        IF jsonb_typeof(m.value) <> 'string' THEN
            RAISE EXCEPTION 'jobq_enqueue: metadata value of "%" must be a string, not %', m.key, jsonb_typeof(m.value)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        bytes := bytes + octet_length(m.key) + octet_length(m.value #>> '{}'::text[]);
    END LOOP;
    IF bytes > lim.max_metadata_bytes THEN
        RAISE EXCEPTION 'jobq_enqueue: metadata is % bytes of keys and values; the limit is % (--max-metadata-bytes)',
            bytes, lim.max_metadata_bytes
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO @s@.jobq_jobs AS j (id, queue, kind, payload, key, status, attempts, max_attempts,
                                enqueued_at, run_at, extra, priority)
    VALUES (nextval('@s@.jobq_job_ids'), jobq_enqueue.queue, jobq_enqueue.kind,
            coalesce(jobq_enqueue.payload, '\x'), the_key, 'pending', 0, tries, now(), due,
            CASE WHEN meta = '{}' THEN '{}'::jsonb ELSE jsonb_build_object('metadata', meta) END,
            prio)
    ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NOT NULL THEN
        -- Delivered when the caller's transaction commits, never before.
        PERFORM pg_notify('jobq_due', jobq_enqueue.queue);
        RETURN new_id;
    END IF;
    -- A retained job holds the key: that job is the one.
    SELECT j.id INTO new_id FROM @s@.jobq_jobs AS j
        WHERE j.queue = jobq_enqueue.queue AND j.key = the_key;
    IF new_id IS NULL THEN
        RAISE EXCEPTION 'jobq_enqueue: the job that held key "%" was deleted meanwhile; try again', the_key
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN new_id;
END
$body$
$create$, '@s@', quote_ident(current_schema()));
END
$do$;


REVOKE ALL ON FUNCTION jobq_enqueue(text, text, bytea, text, timestamptz, interval, integer, integer, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION jobq_check_name(text, text) FROM PUBLIC;

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jobq_producer') THEN
        BEGIN
            CREATE ROLE jobq_producer NOLOGIN;
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE WARNING 'jobq: no CREATEROLE, so no role jobq_producer; grant EXECUTE on jobq_enqueue by hand';
            -- Roles are the cluster's: another database's migration made it
            -- meanwhile.
            WHEN duplicate_object OR unique_violation THEN
                NULL;
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jobq_producer') THEN
        GRANT EXECUTE ON FUNCTION jobq_enqueue(text, text, bytea, text, timestamptz, interval, integer, integer, jsonb)
            TO jobq_producer;
        BEGIN
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO jobq_producer', current_schema());
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'jobq: cannot grant USAGE on schema % to jobq_producer', current_schema();
        END;
    END IF;
END
$do$;
"#;
