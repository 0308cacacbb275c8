//! One `CancellationToken` for the whole process, cancelled on Ctrl-C or
//! SIGTERM. A second signal exits at once.

use tokio_util::sync::CancellationToken;

/// A token that is cancelled when the process receives SIGINT or SIGTERM.
///
/// The first signal starts a graceful stop (the token); a second one, while
/// that stop still waits (for in-flight calls, running handlers, a slow
/// disk), ends the process at once, killed by that signal. Nothing
/// acknowledged is lost by that: every acknowledged change is already on
/// disk. A server's next start then reads every record instead of its
/// saved indexes.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    // Installed before the task is spawned, so that a signal that arrives
    // before the task first runs is not lost (nor kills the process).
    let Some(mut signals) = Signals::install() else {
        return token;
    };
    tokio::spawn(async move {
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
        die_of(second);
    });
    token
}

/// Ends the process as `signal`'s default action does, so that a shell or
/// supervisor sees it killed by that signal (a shell loop around `jobq
/// work` stops on Ctrl-C); with status 128 + the signal if it survives.
fn die_of(signal: i32) -> ! {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to its default and raising
    // it touch no memory of this process.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
    std::process::exit(128 + signal)
}

/// The signals that stop the process.
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
impl Signals {
    /// Watches SIGINT and SIGTERM, each if it can; `None` if neither.
    fn install() -> Option<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let watch = |kind: SignalKind, name: &str| {
            signal(kind)
                .inspect_err(|err| tracing::warn!(cause = %err, signal = name, "cannot watch this signal; it keeps its default action"))
                .ok()
        };
        let int = watch(SignalKind::interrupt(), "SIGINT");
        let term = watch(SignalKind::terminate(), "SIGTERM");
        (int.is_some() || term.is_some()).then_some(Signals { int, term })
    }

    /// Waits for the next SIGINT or SIGTERM; returns its number.
    async fn next(&mut self) -> i32 {
        async fn recv(signal: Option<&mut tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = recv(self.int.as_mut()) => libc::SIGINT,
            () = recv(self.term.as_mut()) => libc::SIGTERM,
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
