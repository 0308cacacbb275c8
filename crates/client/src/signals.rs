//! [`WorkerBuilder::handle_signals`](crate::WorkerBuilder::handle_signals):
//! SIGINT (Ctrl-C) and SIGTERM start the worker's graceful shutdown.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Cancels `shutdown` on the first SIGINT or SIGTERM; once it is
/// cancelled (by a signal or by its owner), the next signal ends the
/// process at once, killed by that signal, unless `run` has returned and
/// aborted this task. The handlers are installed before this returns, so a signal
/// that arrives right after is not lost (nor does it kill the process).
pub(crate) fn watch(shutdown: CancellationToken) -> JoinHandle<()> {
    #[cfg(unix)]
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    #[cfg(unix)]
    let interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            let (mut terminate, mut interrupt) = match (terminate, interrupt) {
                (Ok(t), Ok(i)) => (t, i),
                (Err(err), _) | (_, Err(err)) => {
                    warn!(cause = %err, "cannot install signal handlers; shut down with the token");
                    return;
                }
            };
            tokio::select! {
                _ = terminate.recv() => info!(signal = "SIGTERM", "draining (send it again to exit at once)"),
                _ = interrupt.recv() => info!(signal = "SIGINT", "draining (send it again to exit at once)"),
                _ = shutdown.cancelled() => {}
            }
            shutdown.cancel();
            // The handlers stay installed, so without this a signal during
            // the drain would do nothing until it ends. `run` aborts this
            // task when it returns.
            let signal = tokio::select! {
                _ = terminate.recv() => libc::SIGTERM,
                _ = interrupt.recv() => libc::SIGINT,
            };
            warn!(signal, "signal during the drain; exiting at once");
            // As the signal's default action would have: a shell sees the
            // process killed by it (status 128 + the signal otherwise).
            // SAFETY: setting a signal's disposition to its default and
            // raising it touch no memory of this process.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
            std::process::exit(128 + signal);
        }
        #[cfg(not(unix))]
        {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => info!(signal = "Ctrl-C", "draining"),
                _ = shutdown.cancelled() => return,
            }
            shutdown.cancel();
        }
    })
}
