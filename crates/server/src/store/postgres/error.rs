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
    /// A group-commit transaction that carried this call failed (see
    /// `batch.rs`): every caller in it gets the cause.
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
}

impl PgError {
    /// Whether trying again later may succeed: the connection or the pool
    /// is the problem (the database restarted, failed over, or is
    /// overloaded), or the transaction lost a race (serialization failure,
    /// deadlock). Such failures are UNAVAILABLE; the rest are INTERNAL.
    pub fn transient(&self) -> bool {
        match self {
            PgError::Pool(_) => true,
            PgError::Shared { transient, .. } => *transient,
            PgError::Db(e) => {
                if e.is_closed() {
                    return true;
                }
                match e.code() {
                    // Class 08 (connection), 40 (transaction rollback:
                    // serialization failure, deadlock), 53 (insufficient
                    // resources), 57P0x (shutdown, crash recovery).
                    Some(code) => {
                        let c = code.code();
                        c.starts_with("08")
                            || c.starts_with("40")
                            || c.starts_with("53")
                            || c.starts_with("57P")
                    }
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

impl From<PgError> for crate::Error {
    fn from(err: PgError) -> crate::Error {
        if err.transient() {
            crate::Error::Unavailable(Box::new(err))
        } else {
            crate::Error::Database(Box::new(err))
        }
    }
}
