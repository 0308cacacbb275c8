//! `jobq serve`: run the server until SIGINT/SIGTERM.

use anyhow::Context;

/// Runs the server with `config` until a shutdown signal.
pub async fn run(config: jobq_server::Config) -> anyhow::Result<()> {
    let shutdown = crate::shutdown::on_signal();
    let listen = config.listen;
    jobq_server::run(config, shutdown)
        .await
        .with_context(|| format!("jobq serve on {listen}"))
}
