//! The PostgreSQL backend's errors, and which of them a client may retry.

/// What can go wrong between the PostgreSQL backend and its database.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// A statement failed, or the connection broke during one.
    #[error("postgres: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// No connection could be had from the pool.
    #[error("postgres pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The pool could not be built from the configuration.
    #[error("postgres pool setup: {0}")]
    Build(#[from] deadpool_postgres::BuildError),
    /// The `--store` URL does not parse.
    #[error("invalid --store URL: {0}")]
    Url(String),
    /// A group-commit transaction that carried this call failed where no
    /// one caller's row was to blame (the connection or the pool failed;
    /// see `batch.rs`): every caller in it gets the cause, which names no
    /// caller's data.
    #[error("postgres (group commit): {message}")]
    Shared {
        /// The failure, as text.
        message: String,
        /// Whether a retry may succeed.
        transient: bool,
    },
    /// The database holds something this server cannot read (a row that
    /// does not map to a job, a schema newer than this binary).
    #[error("postgres: {0}")]
    Schema(String),
    /// Another transaction changed what this one had just read (a row
    /// deleted between two statements): trying again will see it settled.
    #[error("postgres: {0}; retry")]
    Raced(String),
    /// This server's own heartbeat is older than half of
    /// `--server-timeout`: the others may take it for dead and reclaim what
    /// its Lease streams hold, so it takes nothing for them until a
    /// heartbeat succeeds again.
    #[error("this server cannot heartbeat to the database; reconnect to another server")]
    Unregistered,
}

impl PgError {
    /// Whether trying again later may succeed: the connection or the pool
    /// is the problem (the database restarted, failed over, or is
    /// overloaded), or the transaction lost a race (serialization failure,
    /// deadlock). Such failures are UNAVAILABLE; the rest are INTERNAL.
    pub fn transient(&self) -> bool {
        match self {
            PgError::Pool(_) | PgError::Raced(_) | PgError::Unregistered => true,
            PgError::Shared { transient, .. } => *transient,
            PgError::Db(e) => {
                if e.is_closed() {
                    return true;
                }
                match e.code() {
                    Some(code) => transient_sqlstate(code.code()),
                    // No SQLSTATE: an I/O failure on the socket is worth a
                    // retry; a value that does not convert is a bug.
                    None => std::error::Error::source(e)
                        .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()),
                }
            }
            PgError::Build(_) | PgError::Url(_) | PgError::Schema(_) => false,
        }
    }
}

impl PgError {
    /// Whether the transaction that failed so surely committed nothing,
    /// and for a reason of its own rows, so that running its callers again
    /// one by one tells whose row it was: PostgreSQL refused a statement or
    /// the commit for the data (a constraint, a value, a trigger) or broke
    /// a deadlock, or the error arose here before the commit (the
    /// transaction is then dropped and rolled back). Not when the
    /// connection broke or the backend was ended (a commit in flight may
    /// have been applied), nor for a timeout, a cancel or a shortage that
    /// would only recur once per caller.
    pub fn rolled_back(&self) -> bool {
        match self {
            PgError::Db(e) => match e.code() {
                Some(code) => {
                    let c = code.code();
                    c.starts_with("40") || !transient_sqlstate(c)
                }
                None => {
                    !(e.is_closed()
                        || std::error::Error::source(e)
                            .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()))
                }
            },
            PgError::Raced(_) | PgError::Schema(_) | PgError::Unregistered => true,
            PgError::Pool(_) | PgError::Build(_) | PgError::Url(_) | PgError::Shared { .. } => {
                false
            }
        }
    }
}

/// Class 08 (connection), 40 (transaction rollback: serialization failure,
/// deadlock), 53 (insufficient resources), 57P0x (shutdown, crash
/// recovery), 57014 (a statement cancelled: `statement_timeout`,
/// `pg_cancel_backend`), 55P03 (`lock_timeout`), 25P03 (the session was
/// ended idle inside a transaction).
fn transient_sqlstate(c: &str) -> bool {
    c.starts_with("08")
        || c.starts_with("40")
        || c.starts_with("53")
        || c.starts_with("57P")
        || matches!(c, "57014" | "55P03" | "25P03")
}

impl From<PgError> for crate::Error {
    fn from(err: PgError) -> crate::Error {
        if err.transient() {
            crate::Error::Unavailable(Box::new(err))
        } else {
            crate::Error::Database(Box::new(err))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{transient_sqlstate, PgError};

    #[test]
    fn a_race_with_a_delete_is_retried_and_a_bad_row_is_not() {
        assert!(PgError::Raced("key freed meanwhile".into()).transient());
        assert!(!PgError::Schema("unknown job status".into()).transient());
    }

    #[test]
    fn only_a_failure_that_surely_committed_nothing_is_run_again_per_caller() {
        assert!(PgError::Raced("key freed meanwhile".into()).rolled_back());
        assert!(PgError::Schema("a row that does not map".into()).rolled_back());
        assert!(!PgError::Pool(deadpool_postgres::PoolError::Closed).rolled_back());
        let shared = PgError::Shared {
            message: "connection closed".into(),
            transient: true,
        };
        assert!(!shared.rolled_back());
    }

    #[test]
    fn timeouts_and_cancellations_are_worth_a_retry_and_bugs_are_not() {
        for c in [
            "08006", "40001", "40P01", "53300", "57P01", "57014", "55P03", "25P03",
        ] {
            assert!(transient_sqlstate(c), "{c}");
        }
        for c in ["42P01", "23505", "22P02", "XX000"] {
            assert!(!transient_sqlstate(c), "{c}");
        }
    }
}
