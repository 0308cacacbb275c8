//! [`WorkerBuilder::handle_signals`](crate::WorkerBuilder::handle_signals):
//! SIGINT (Ctrl-C) and SIGTERM start the worker's graceful shutdown.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Cancels `shutdown` on the first SIGINT or SIGTERM. The handlers are
/// installed before this returns, so a signal that arrives right after is
/// not lost (nor does it kill the process).
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
                _ = terminate.recv() => info!(signal = "SIGTERM", "draining"),
                _ = interrupt.recv() => info!(signal = "SIGINT", "draining"),
                _ = shutdown.cancelled() => return,
            }
        }
        #[cfg(not(unix))]
        tokio::select! {
            _ = tokio::signal::ctrl_c() => info!(signal = "Ctrl-C", "draining"),
            _ = shutdown.cancelled() => return,
        }
        shutdown.cancel();
    })
}
