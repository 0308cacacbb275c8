//! The crate's one error type.

/// A `Result` whose error is [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a [`Client`](crate::Client) call or a
/// [`Worker`](crate::Worker) run can fail with.
///
/// Server-side refusals arrive as [`Error::Status`] with the gRPC code
/// intact, so callers can tell a stale lease (`ABORTED`) from an unknown job
/// (`NOT_FOUND`) with [`Error::code`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection could not be set up: a malformed URL, or no server
    /// reachable at it.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The server answered with a non-OK gRPC status.
    #[error("server replied {:?}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// A payload could not be encoded to or decoded from JSON.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The server's reply lacked a field the contract says it always sets.
    #[error("malformed reply: missing `{0}`")]
    MissingField(&'static str),
    /// A [`Worker`](crate::Worker) was configured in a way that cannot run
    /// (no queues, no handlers, zero capacity or lease).
    #[error("invalid worker configuration: {0}")]
    Config(String),
}

impl Error {
    /// The gRPC status code, when the server (or the transport under a
    /// call) reported one; `None` for local errors.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Status(status) => Some(status.code()),
            _ => None,
        }
    }

    /// Whether this is a transient failure worth retrying the same call for:
    /// the server is unreachable, restarting or shutting down.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport(_) => true,
            Error::Status(status) => is_transient_code(status.code()),
            _ => false,
        }
    }
}

/// Codes that mean "the server did not get to decide", as opposed to a
/// decision (ABORTED, NOT_FOUND, ...). tonic reports a refused or reset
/// connection as UNAVAILABLE, and some mid-call drops as UNKNOWN or
/// CANCELLED.
pub(crate) fn is_transient_code(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_keeps_its_code() {
        let err = Error::from(tonic::Status::aborted("stale lease"));
        assert_eq!(err.code(), Some(tonic::Code::Aborted));
        assert!(!err.is_transient());
        assert_eq!(err.to_string(), "server replied Aborted: stale lease");
    }

    #[test]
    fn unavailable_is_transient() {
        assert!(Error::from(tonic::Status::unavailable("down")).is_transient());
        assert!(!Error::MissingField("job").is_transient());
    }
}
