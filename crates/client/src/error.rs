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
    /// reachable at it (without the URL; [`Error::Connect`] names it).
    #[error("transport: {}", chain(.0))]
    Transport(#[from] tonic::transport::Error),
    /// [`Client::connect`](crate::Client::connect) (or a lazy client's
    /// setup) failed: names the URL and the root cause (`connection
    /// refused`, `the URL has no scheme`, a TLS error, ...).
    #[error("cannot connect to {url}: {cause}")]
    Connect {
        /// The URL as given.
        url: String,
        /// What went wrong, with tonic's chain of causes.
        cause: String,
        /// The transport error, when there was one.
        #[source]
        source: Option<tonic::transport::Error>,
    },
    /// The server answered with a non-OK gRPC status.
    /// (tonic also reports a call that never reached the server as a
    /// status, `UNAVAILABLE` with the transport error as its source; the
    /// text then says so, with the cause.)
    #[error("{}", status_text(.0))]
    Status(#[from] tonic::Status),
    /// A payload could not be encoded to or decoded from JSON.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The server's reply lacked a field the contract says it always sets.
    #[error("malformed reply: missing `{0}`")]
    MissingField(&'static str),
    /// A [`Worker`](crate::Worker) with
    /// [`give_up_after`](crate::WorkerBuilder::give_up_after) was without a
    /// Lease stream for that long.
    #[error("no lease stream for {:.1} s; last error: {last}", .down_for.as_secs_f64())]
    Unreachable {
        /// How long the worker was without a stream.
        down_for: std::time::Duration,
        /// The last failure, as text.
        last: String,
    },
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
            Error::Status(status) => Some(code_of(status)),
            _ => None,
        }
    }

    /// Whether this is a transient failure worth retrying the same call for:
    /// the server is unreachable, restarting or shutting down.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport(_) => true,
            // A malformed URL will not fix itself; a refused connection may.
            Error::Connect { source, .. } => source.is_some(),
            Error::Status(status) => is_transient_code(code_of(status)),
            _ => false,
        }
    }
}

/// The status's code, except that a call's timeout ([`Connect::timeout`]
/// (crate::Connect::timeout)) passing is `DEADLINE_EXCEEDED`, as gRPC has
/// it: tonic reports its own timeout, on either side, as `CANCELLED`
/// "Timeout expired".
fn code_of(status: &tonic::Status) -> tonic::Code {
    if status.code() == tonic::Code::Cancelled
        && status.message() == tonic::TimeoutExpired(()).to_string()
    {
        return tonic::Code::DeadlineExceeded;
    }
    status.code()
}

/// A status the server sent, or one tonic made up for a call that never
/// got an answer (then with the transport error's chain, e.g. `Connection
/// refused`).
fn status_text(status: &tonic::Status) -> String {
    use std::error::Error as _;
    match status.source() {
        Some(cause) => {
            let mut text = status.message().to_owned();
            append_causes(&mut text, Some(cause));
            format!("no reply ({:?}): {text}", code_of(status))
        }
        None => format!("server replied {:?}: {}", code_of(status), status.message()),
    }
}

/// `err` and its causes, `: `-separated: tonic's top-level text alone is
/// `transport error`, which says nothing.
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    append_causes(&mut text, err.source());
    text
}

/// Appends each cause from `source` on that `text` does not already say
/// (hyper and tonic repeat the inner message in the outer one, and wrap
/// it in a bare `transport error`).
fn append_causes(text: &mut String, mut source: Option<&(dyn std::error::Error + 'static)>) {
    while let Some(cause) = source {
        let next = cause.to_string();
        if next != "transport error" && !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
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
    fn a_status_tonic_made_up_says_there_was_no_reply_and_why() {
        let status = tonic::Status::from_error(Box::new(std::io::Error::other(
            "Connection refused (os error 111)",
        )));
        assert_eq!(
            Error::from(status).to_string(),
            "no reply (Unknown): Connection refused (os error 111)"
        );
    }

    #[test]
    fn unavailable_is_transient() {
        assert!(Error::from(tonic::Status::unavailable("down")).is_transient());
        assert!(!Error::MissingField("job").is_transient());
    }
}
