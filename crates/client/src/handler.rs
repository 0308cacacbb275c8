//! What a job handler is and how it reports failure: [`HandlerError`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::{FailOptions, JobContext};

/// Why a handler gave up on a job, and whether and when to retry it.
///
/// Any `std::error::Error` converts into a retryable `HandlerError` (with
/// its source chain in the message), so `?` works in handlers. Use the
/// constructors to say more:
///
/// ```
/// use std::time::Duration;
/// use jobq_client::HandlerError;
///
/// let rate_limited = HandlerError::retry_after("smtp said 421", Duration::from_secs(60));
/// let bad_input = HandlerError::fatal("no such customer");
/// assert!(bad_input.is_fatal());
/// assert_eq!(rate_limited.retry_delay(), Some(Duration::from_secs(60)));
/// ```
///
/// It deliberately does not implement `std::error::Error` itself: that is
/// what lets the blanket `From` conversion exist (the same trade-off as
/// `anyhow::Error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    message: String,
    retry_delay: Option<Duration>,
    fatal: bool,
    snooze: Option<Duration>,
}

impl HandlerError {
    /// A failure worth retrying after the server's backoff (if attempts are
    /// left).
    pub fn retry(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retry_delay: None,
            fatal: false,
            snooze: None,
        }
    }

    /// A failure worth retrying after exactly `delay` (if attempts are left).
    pub fn retry_after(message: impl Into<String>, delay: Duration) -> Self {
        Self {
            message: message.into(),
            retry_delay: Some(delay),
            fatal: false,
            snooze: None,
        }
    }

    /// A failure no retry can fix: the job becomes FAILED (a dead letter) at
    /// once, whatever its attempts.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retry_delay: None,
            fatal: true,
            snooze: None,
        }
    }

    /// Not a failure: put the job back, due after `delay`, without counting
    /// the attempt (the API said "429, Retry-After: 30"). Its history entry
    /// ends SNOOZED with `message` as the reason.
    pub fn snooze(message: impl Into<String>, delay: Duration) -> Self {
        Self {
            message: message.into(),
            retry_delay: None,
            fatal: false,
            snooze: Some(delay),
        }
    }

    /// The snooze asked for, if any.
    pub fn snooze_delay(&self) -> Option<Duration> {
        self.snooze
    }

    /// The message recorded as the job's `last_error`.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The retry delay asked for, if any.
    pub fn retry_delay(&self) -> Option<Duration> {
        self.retry_delay
    }

    /// Whether retries were ruled out.
    pub fn is_fatal(&self) -> bool {
        self.fatal
    }

    /// The `Fail` options this error asks for.
    pub fn fail_options(&self) -> FailOptions {
        FailOptions {
            retry_delay: self.retry_delay,
            fatal: self.fatal,
            snooze: self.snooze,
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error> From<E> for HandlerError {
    fn from(err: E) -> Self {
        let mut message = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Self::retry(message)
    }
}

/// What a handler returns.
pub type HandlerResult = Result<(), HandlerError>;

/// A registered handler with its concrete types erased.
pub(crate) type BoxedHandler =
    Arc<dyn Fn(JobContext) -> BoxFuture<'static, HandlerResult> + Send + Sync>;

/// Boxes `f`. The call to `f` happens inside the returned future, so a
/// handler that panics before its first `.await` is caught by the same
/// `catch_unwind` as one that panics later.
pub(crate) fn boxed<F, Fut>(f: F) -> BoxedHandler
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |ctx| {
        let f = Arc::clone(&f);
        Box::pin(async move { f(ctx).await })
    })
}

/// The text of a panic payload (`panic!` with a literal or a format string).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("send failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn std_errors_convert_with_their_chain() {
        let err = HandlerError::from(Outer(std::io::Error::other("connection refused")));
        assert_eq!(err.message(), "send failed: connection refused");
        assert!(!err.is_fatal());
        assert_eq!(err.retry_delay(), None);
    }

    #[test]
    fn constructors_map_to_fail_options() {
        assert_eq!(
            HandlerError::retry("x").fail_options(),
            FailOptions::default()
        );
        assert_eq!(
            HandlerError::retry_after("x", Duration::ZERO).fail_options(),
            FailOptions::retry_after(Duration::ZERO)
        );
        assert_eq!(
            HandlerError::fatal("x").fail_options(),
            FailOptions::fatal()
        );
    }

    #[test]
    fn panic_payloads_become_text() {
        let literal = std::panic::catch_unwind(|| panic!("boom")).unwrap_err();
        assert_eq!(panic_message(&*literal), "boom");
        let formatted = std::panic::catch_unwind(|| panic!("boom {}", 42)).unwrap_err();
        assert_eq!(panic_message(&*formatted), "boom 42");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(&*other), "non-string panic payload");
    }
}
