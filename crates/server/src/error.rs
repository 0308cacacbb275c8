//! The server's error type, and the one place where errors become gRPC
//! status codes (docs/src/design.md §2).

use std::sync::Arc;

use tonic::{codegen::http, Code, Status};

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
    /// No schedule with this name.
    #[error("schedule {0:?} not found")]
    ScheduleNotFound(String),
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
    /// durable (a failed fsync, a full disk): fail-stop (docs/src/design.md §1 rule
    /// 8). The process exits; a restart recovers from what is on disk.
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
    /// The configured limits contradict each other or are out of every
    /// store's reach ([`crate::Config::check_limits`]).
    #[error("{0}")]
    Limits(String),
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
    /// A transition the status machine refused (a stale lease, a wrong
    /// status, no such job): its answer reads the store's state rather
    /// than changing it.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Error::Transition(_) | Error::NotFound(_) | Error::ScheduleNotFound(_)
        )
    }

    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) | Error::ScheduleNotFound(_) => Code::NotFound,
            Error::Transition(t) => match t {
                TransitionError::StaleLease { .. } | TransitionError::Expired { .. } => {
                    Code::Aborted
                }
                TransitionError::NotAllowed { .. }
                | TransitionError::NotDue { .. }
                | TransitionError::NotExpired { .. }
                | TransitionError::Running { .. } => Code::FailedPrecondition,
            },
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::ShuttingDown | Error::FailStopped(_) | Error::Unavailable(_) => {
                Code::Unavailable
            }
            Error::Storage(_)
            | Error::Database(_)
            | Error::Corrupt(_)
            | Error::Io(_)
            | Error::Exposed(_)
            | Error::Limits(_) => Code::Internal,
        }
    }
}

impl Error {
    /// Whether the same call may succeed later, unchanged: a shared
    /// database was unreachable, its pool exhausted, or a transaction lost
    /// a race. Nothing was changed by the failed call.
    pub fn transient(&self) -> bool {
        matches!(self, Error::Unavailable(_))
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
        if let Error::FailStopped(_) = err {
            // The storage failure (an OS error, a path) was logged when the
            // server stopped; clients learn only that it did.
            return Status::unavailable(
                "the server stopped serving after a storage failure (see its log); retry on another server or after its restart",
            );
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

/// The code a status that tonic's transport made, before any handler ran,
/// is answered with:
/// - a request over `max_decoding_message_size` (`--max-message-bytes`)
///   comes as OUT_OF_RANGE; docs/src/design.md §2 answers limits with
///   RESOURCE_EXHAUSTED. No handler of ours returns OUT_OF_RANGE
///   ([`Error::code`]).
/// - a request that is not a valid protobuf message (a string field that
///   is not UTF-8, a truncated or garbled body) comes as INTERNAL, as the
///   gRPC status-code table has it for a library that cannot parse a
///   request; here INTERNAL means the server's own storage failed (an
///   operator's alarm), and bad input is INVALID_ARGUMENT (docs/src/design.md §2).
///   Told apart by prost's message, which no handler of ours sends.
pub fn transport_code(code: Code, message: &str) -> Code {
    match code {
        Code::OutOfRange => Code::ResourceExhausted,
        Code::Internal if message.starts_with(UNDECODABLE) => Code::InvalidArgument,
        other => other,
    }
}

/// How prost's decode errors begin (`prost::DecodeError`'s `Display`),
/// which tonic sends as an INTERNAL status's message.
const UNDECODABLE: &str = "failed to decode Protobuf message";

/// A tower layer that applies [`transport_code`] to every trailers-only
/// response (how tonic answers a request it could not decode), so the
/// mapping lives here, beside [`Error::code`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TransportCodes;

impl<S> tower::Layer<S> for TransportCodes {
    type Service = TransportCoded<S>;

    fn layer(&self, inner: S) -> TransportCoded<S> {
        TransportCoded { inner }
    }
}

/// The service [`TransportCodes`] wraps.
#[derive(Debug, Clone)]
pub struct TransportCoded<S> {
    inner: S,
}

impl<S, B, RB> tower::Service<http::Request<B>> for TransportCoded<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let call = self.inner.call(req);
        Box::pin(async move {
            let mut response = call.await?;
            if let Some(status) = tonic::Status::from_header_map(response.headers()) {
                let code = status.code();
                let mapped = transport_code(code, status.message());
                if mapped != code {
                    response
                        .headers_mut()
                        .insert("grpc-status", http::HeaderValue::from(mapped as i32));
                }
            }
            Ok(response)
        })
    }
}
