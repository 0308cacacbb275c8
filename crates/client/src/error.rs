//! The crate's one error type.

/// A `Result` whose error is [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a [`Client`](crate::Client) call or a
/// [`Worker`](crate::Worker) run can fail with.
///
/// Server-side refusals arrive as [`Error::Status`] with the gRPC code
/// intact, so callers can tell a stale lease (`ABORTED`) from an unknown job
/// (`NOT_FOUND`) with [`Error::code`].
#[derive(thiserror::Error)]
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
    /// A call on a [`Client`](crate::Client) got no reply: the server is
    /// unreachable, restarting or shutting down (tonic's `UNAVAILABLE`, or
    /// a connection the server closed mid-call). Names the server and the
    /// cause in one line; always transient.
    #[error("no reply from {url} ({code:?}): {cause}")]
    NoReply {
        /// The server's URL (`the server` for a client made from a
        /// channel).
        url: String,
        /// The code the call failed with.
        code: tonic::Code,
        /// What went wrong, in one line.
        cause: String,
        /// The status tonic reported.
        #[source]
        status: tonic::Status,
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
    /// [`Client::wait`](crate::Client::wait): the job ended FAILED (its
    /// attempts ran out, a handler failed it for good, or it was
    /// cancelled: then `last_error` is `cancelled: <reason>`).
    #[error("job {} FAILED: {}", .0.id, .0.last_error.as_deref().unwrap_or("no error given"))]
    JobFailed(Box<crate::Job>),
    /// [`Client::wait`](crate::Client::wait): the job was not final when
    /// the wait's time ran out.
    #[error("job {id} was not finished after {:.1} s", .after.as_secs_f64())]
    WaitTimedOut {
        /// The job.
        id: String,
        /// How long the wait was.
        after: std::time::Duration,
    },
    /// A [`Worker`](crate::Worker) was configured in a way that cannot run
    /// (no queues, no handlers, zero capacity or lease).
    #[error("invalid worker configuration: {0}")]
    Config(String),
}

impl std::fmt::Debug for Error {
    /// The variant and its one-line text: a `main` that returns the error
    /// prints a line, not a dump of tonic's internals.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let variant = match self {
            Error::Transport(_) => "Transport",
            Error::Connect { .. } => "Connect",
            Error::NoReply { .. } => "NoReply",
            Error::Status(_) => "Status",
            Error::Json(_) => "Json",
            Error::MissingField(_) => "MissingField",
            Error::Unreachable { .. } => "Unreachable",
            Error::JobFailed(_) => "JobFailed",
            Error::WaitTimedOut { .. } => "WaitTimedOut",
            Error::Config(_) => "Config",
        };
        write!(f, "{variant}({self})")
    }
}

impl Error {
    /// A failed call's error, for a client of the server at `url`: a call
    /// that got no reply (tonic made the status up from a transport error,
    /// or the server closed the connection under it) is
    /// [`Error::NoReply`]; a status the server sent stays
    /// [`Error::Status`].
    pub(crate) fn from_call(status: tonic::Status, url: Option<&str>) -> Error {
        use std::error::Error as _;
        let closed = status.code() == tonic::Code::Internal
            && status.message().contains("not a result of an error");
        if !closed && status.source().is_none() {
            return Error::Status(status);
        }
        let (code, cause) = if closed {
            (
                tonic::Code::Unavailable,
                "the server closed the connection (it is shutting down or restarting)".to_owned(),
            )
        } else {
            (code_of(&status), root_cause(&status))
        };
        Error::NoReply {
            url: url.unwrap_or("the server").to_owned(),
            code,
            cause,
            status,
        }
    }

    /// The gRPC status code, when the server (or the transport under a
    /// call) reported one; `None` for local errors.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Status(status) => Some(code_of(status)),
            Error::NoReply { code, .. } => Some(*code),
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
            Error::NoReply { .. } => true,
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

/// The innermost cause of a status tonic made up (`Connection refused (os
/// error 111)`), or its message when it has none: the one line that says
/// what happened, without tonic's and hyper's wrappers.
fn root_cause(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = status.source();
    let mut last = None;
    while let Some(c) = cause {
        last = Some(c);
        cause = c.source();
    }
    match last {
        Some(c) => c.to_string(),
        None => status.message().to_owned(),
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
    fn a_call_without_a_reply_names_the_server_and_the_root_cause() {
        let status = tonic::Status::from_error(Box::new(std::io::Error::other(
            "Connection refused (os error 111)",
        )));
        let err = Error::from_call(status, Some("http://10.0.0.7:50051"));
        assert_eq!(
            err.to_string(),
            "no reply from http://10.0.0.7:50051 (Unknown): Connection refused (os error 111)"
        );
        assert!(err.is_transient());
        assert_eq!(
            format!("{err:?}"),
            format!("NoReply({err})"),
            "Debug is one line"
        );
        // A status the server sent is the server's.
        let err = Error::from_call(tonic::Status::not_found("job 9 not found"), Some("u"));
        assert_eq!(err.to_string(), "server replied NotFound: job 9 not found");
    }

    #[test]
    fn a_connection_the_server_closed_gracefully_is_unavailable_not_internal() {
        let status = tonic::Status::internal(
            "h2 protocol error: error reading a body from connection: stream no longer needed, not a result of an error",
        );
        let err = Error::from_call(status, None);
        assert_eq!(err.code(), Some(tonic::Code::Unavailable));
        assert!(err.is_transient());
        assert_eq!(
            err.to_string(),
            "no reply from the server (Unavailable): the server closed the connection (it is shutting down or restarting)"
        );
    }

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
