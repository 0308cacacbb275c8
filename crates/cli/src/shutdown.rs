//! One `CancellationToken` for the whole process, cancelled on Ctrl-C or
//! SIGTERM. A second signal exits at once.

use tokio_util::sync::CancellationToken;

/// A token that is cancelled when the process receives SIGINT or SIGTERM.
///
/// The first signal starts a graceful stop (the token); a second one, while
/// that stop still waits (for in-flight calls, running handlers, a slow
/// disk), exits the process at once with 128 + the signal's number, as a
/// shell reports a process killed by it. Nothing acknowledged is lost by
/// that: every acknowledged change is already on disk. A server's next
/// start then reads every record instead of its saved indexes.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let Some(mut signals) = Signals::install() else {
            return;
        };
        let first = signals.next().await;
        tracing::info!(
            signal = first,
            "signal received; shutting down (send it again to exit at once)"
        );
        trigger.cancel();
        let second = signals.next().await;
        tracing::warn!(
            signal = second,
            "second signal received; exiting without waiting"
        );
        std::process::exit(128 + second);
    });
    token
}

/// The signals that stop the process.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn install() -> Option<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let int = match signal(SignalKind::interrupt()) {
            Ok(int) => int,
            Err(err) => {
                tracing::warn!(cause = %err, "cannot watch SIGINT or SIGTERM; only SIGKILL stops this process");
                return None;
            }
        };
        let term = signal(SignalKind::terminate())
            .inspect_err(|err| {
                tracing::warn!(cause = %err, "cannot watch SIGTERM; only Ctrl-C stops this process");
            })
            .ok();
        Some(Signals { term, int })
    }

    /// Waits for the next SIGINT or SIGTERM; returns its number.
    async fn next(&mut self) -> i32 {
        let term = async {
            match self.term.as_mut() {
                Some(term) => term.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = term => libc::SIGTERM,
        }
    }
}

#[cfg(not(unix))]
impl Signals {
    fn install() -> Option<Signals> {
        Some(Signals {})
    }

    async fn next(&mut self) -> i32 {
        let _ = tokio::signal::ctrl_c().await;
        2
    }
}
