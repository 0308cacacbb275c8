//! The command line: global options and one variant per subcommand.

use clap::{Parser, Subcommand};

/// jobq: a durable job queue with a gRPC API.
#[derive(Debug, Parser)]
#[command(name = "jobq", version, about, propagate_version = true)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (sled storage in --data).
    Serve(jobq_server::Config),
}

impl Cli {
    /// Log level when RUST_LOG is not set: the server logs its lifecycle,
    /// the client commands only their warnings.
    pub fn default_log_level(&self) -> &'static str {
        match self.command {
            Command::Serve(_) => "info",
        }
    }
}
