//! The command line: global options and one variant per subcommand, and the
//! dispatch from a parsed [`Cli`] to the subcommand modules.

use anyhow::Context;
use clap::{Parser, Subcommand};
use jobq_client::Client;

use crate::output::Out;
use crate::{enqueue, get, list, migrate, retry, serve, stats, work};

/// jobq: a durable job queue with a gRPC API.
///
/// Exit codes: 0 ok, 1 a failed call (the gRPC code and message go to
/// stderr), 2 a usage error. Durations are written like 30s, 5m, 2h.
#[derive(Debug, Parser)]
#[command(name = "jobq", version, about, long_about, propagate_version = true)]
pub struct Cli {
    /// The jobq server to talk to (client commands and `work`).
    #[arg(
        long,
        global = true,
        env = "JOBQ_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,

    /// Machine-readable output: JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
// Parsed once per process: the size of `Serve` (every server flag) costs
// nothing worth a Box.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Run the server (sled storage in --data, or PostgreSQL with --store).
    Serve(jobq_server::Config),
    /// Apply the PostgreSQL store's schema migrations (servers also do at
    /// startup).
    Migrate(migrate::Args),
    /// Add a job (or many, with --batch-file).
    Enqueue(enqueue::Args),
    /// Show one job with its attempt history.
    Get(get::Args),
    /// List jobs by queue, status and key.
    List(list::Args),
    /// Bring FAILED jobs (dead letters) back to PENDING.
    Retry(retry::Args),
    /// Per-queue counts and the age of the oldest due job.
    Stats(stats::Args),
    /// Run a command for each job of a queue: a worker in any language.
    Work(work::Args),
    /// Measure throughput and latency (durable replies) on this machine.
    Bench(jobq_bench::BenchArgs),
}

impl Cli {
    /// Log level when RUST_LOG is not set: the server and the worker log
    /// their lifecycle, the one-shot client commands only their warnings.
    pub fn default_log_level(&self) -> &'static str {
        match self.command {
            Command::Serve(_) => "info",
            Command::Work(_) => "warn,jobq_client=info,jobq=info",
            _ => "warn",
        }
    }

    /// Runs the chosen subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        let out = Out { json: self.json };
        match self.command {
            Command::Serve(config) => serve::run(config).await,
            Command::Migrate(args) => migrate::run(args).await,
            Command::Work(args) => work::run(&self.server, args).await,
            Command::Enqueue(args) => enqueue::run(&connect(&self.server).await?, out, args).await,
            Command::Get(args) => get::run(&connect(&self.server).await?, out, args).await,
            Command::List(args) => list::run(&connect(&self.server).await?, out, args).await,
            Command::Retry(args) => retry::run(&connect(&self.server).await?, out, args).await,
            Command::Stats(args) => stats::run(&connect(&self.server).await?, out, args).await,
            Command::Bench(args) => jobq_bench::run(args).await,
        }
    }
}

/// Connects to `server`; a refused connection reads as UNAVAILABLE.
async fn connect(server: &str) -> anyhow::Result<Client> {
    match Client::connect(server).await {
        Ok(client) => Ok(client),
        Err(jobq_client::Error::Transport(err)) => {
            // tonic's transport error prints only "transport error"; the
            // cause (connection refused, bad URI) is in its source chain.
            let mut why = String::new();
            let mut source: Option<&dyn std::error::Error> = Some(&err);
            while let Some(cause) = source {
                why = cause.to_string();
                source = cause.source();
            }
            Err(tonic::Status::unavailable(format!("cannot connect to {server}: {why}")).into())
        }
        Err(err) => Err(err).with_context(|| format!("cannot connect to {server}")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// clap's own consistency checks (duplicate flags, bad defaults,
    /// conflicting globals), which otherwise only run when a flag is used.
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn globals_work_after_the_subcommand() {
        let cli =
            Cli::try_parse_from(["jobq", "list", "--json", "--server", "http://h:1"]).unwrap();
        assert!(cli.json);
        assert_eq!(cli.server, "http://h:1");
    }
}
