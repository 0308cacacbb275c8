//! The server's error type, and the one place where errors become gRPC
//! status codes (DESIGN.md §2).

use std::sync::Arc;

use tonic::{Code, Status};

use crate::{job::JobId, machine::TransitionError};

/// Everything that can go wrong in the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed input: names, sizes, ranges, ids.
    #[error("{0}")]
    InvalidArgument(String),
    /// No job with this id.
    #[error("job {0} not found")]
    NotFound(JobId),
    /// The state machine refused the event.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// A server capacity limit was reached (too many waiting Dequeues and
    /// Lease streams). Oversized requests are `InvalidArgument`.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The server stopped serving because a change could not be made
    /// durable (a failed fsync, a full disk): fail-stop (DESIGN.md §1 rule
    /// 7). The process exits; a restart recovers from what is on disk.
    #[error("the server stopped serving after a storage failure: {0}")]
    FailStopped(Arc<str>),
    /// The storage backend failed; each backend has its own error type
    /// (`store::sled::SledError`, …) behind this.
    #[error("storage failure: {0}")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A shared database (the PostgreSQL store) failed in a way worth
    /// retrying: the connection broke, the pool is exhausted, or the
    /// transaction lost a race. Nothing was changed: a database transaction
    /// either commits or not, so no fail-stop either.
    #[error("database unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A shared database refused a statement for good (a bug, or a schema
    /// it does not know). Nothing was changed, so no fail-stop.
    #[error("database failure: {0}")]
    Database(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// Binding, opening files, or the transport failed.
    #[error("{0}")]
    Io(String),
    /// A stored record could not be decoded, or an fsync failed.
    #[error("storage failure: {0}")]
    Corrupt(String),
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::Transition(t) => match t {
                TransitionError::StaleLease { .. } | TransitionError::Expired { .. } => {
                    Code::Aborted
                }
                TransitionError::NotAllowed { .. }
                | TransitionError::NotDue { .. }
                | TransitionError::NotExpired { .. } => Code::FailedPrecondition,
            },
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::ShuttingDown | Error::FailStopped(_) | Error::Unavailable(_) => {
                Code::Unavailable
            }
            Error::Storage(_) | Error::Database(_) | Error::Corrupt(_) | Error::Io(_) => {
                Code::Internal
            }
        }
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let code = err.code();
        if let Error::Unavailable(_) = err {
            // The cause (a host name, a SQLSTATE) is for the operator.
            tracing::warn!(cause = %err, "database unavailable");
            return Status::unavailable("the database is unavailable; retry");
        }
        if code == Code::Internal {
            // Storage details are for the operator's log, not for clients.
            tracing::error!(cause = %err, "internal error");
            Status::internal("internal storage error; see the server log")
        } else {
            Status::new(code, err.to_string())
        }
    }
}
