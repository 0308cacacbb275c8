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
    /// No token, or an unknown one, where tokens are required.
    #[error("{0}")]
    Unauthenticated(String),
    /// A known token outside its roles or queues, or acting on another
    /// token's lease.
    #[error("{0}")]
    PermissionDenied(String),
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
    /// The server would be reachable from the network without TLS and
    /// tokens, and was not told `--insecure`.
    #[error("{0}")]
    Exposed(String),
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
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::ShuttingDown | Error::FailStopped(_) => Code::Unavailable,
            Error::Storage(_) | Error::Corrupt(_) | Error::Io(_) | Error::Exposed(_) => {
                Code::Internal
            }
        }
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let code = err.code();
        if code == Code::Internal {
            // Storage details are for the operator's log, not for clients.
            tracing::error!(cause = %err, "internal error");
            Status::internal("internal storage error; see the server log")
        } else {
            Status::new(code, err.to_string())
        }
    }
}
