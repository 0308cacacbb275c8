//! The command line: global options and one variant per subcommand, and the
//! dispatch from a parsed [`Cli`] to the subcommand modules.

use clap::{CommandFactory, Parser, Subcommand};

use crate::conn::Conn;
use crate::logging::LogFormat;
use crate::output::Out;
use crate::{
    cancel, completions, delete, enqueue, get, list, migrate, pause, policy, purge, retry,
    schedule, serve, stats, token, watch, work,
};

/// jobq: a durable job queue with a gRPC API.
///
/// Exit codes: 0 ok, 1 a failed call (the gRPC code and message go to
/// stderr), 2 a usage error. Durations are written like 30s, 5m, 2h.
#[derive(Debug, Parser)]
#[command(name = "jobq", version, about, long_about, propagate_version = true)]
pub struct Cli {
    /// Where the server is and how to reach it (token, TLS).
    #[command(flatten)]
    pub conn: Conn,

    /// Machine-readable output: JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// Log lines on stderr: `text`, or `json` (one object per line, with
    /// job ids, queues and attempts as fields).
    #[arg(
        long,
        global = true,
        env = "JOBQ_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    pub log_format: LogFormat,

    /// Export spans over OTLP/gRPC to this collector (e.g.
    /// http://127.0.0.1:4317). Off by default.
    #[arg(
        long,
        global = true,
        env = "JOBQ_OTLP_ENDPOINT",
        // A collector's URL may carry credentials.
        hide_env_values = true
    )]
    pub otlp_endpoint: Option<String>,

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
    Serve(Box<jobq_server::Config>),
    /// Apply the PostgreSQL store's schema migrations (servers also do at
    /// startup).
    Migrate(migrate::Args),
    /// Add a job (or many, with --batch-file).
    Enqueue(enqueue::Args),
    /// Show one job with its attempt history.
    Get(get::Args),
    /// Print each state of jobs as it changes, until every one is DONE or
    /// FAILED (exit 1 if one ended FAILED).
    Watch(watch::Args),
    /// List jobs by queue, status and key.
    List(list::Args),
    /// Bring FAILED jobs (dead letters) back to PENDING.
    Retry(retry::Args),
    /// Cancel a PENDING or RUNNING job (it becomes FAILED; a running
    /// job's worker is told to stop). Retry brings it back.
    Cancel(cancel::Args),
    /// Pause a queue: nothing is taken from it until `jobq resume`
    /// (enqueues are accepted, running jobs finish). Survives restarts.
    Pause(pause::Args),
    /// Resume a paused queue.
    Resume(pause::Args),
    /// Show or set a queue's policy: how many of its jobs run at once, over
    /// every server and per group. Survives restarts.
    Policy(policy::Args),
    /// Delete PENDING, DONE or FAILED jobs for good (cancel a RUNNING one
    /// first).
    Delete(delete::Args),
    /// Delete a queue's finished jobs (DONE and/or FAILED) by age, or its
    /// PENDING jobs.
    Purge(purge::Args),
    /// Jobs enqueued on a cron schedule: add, list, rm.
    Schedule(schedule::Args),
    /// Per-queue counts and the age of the oldest due job.
    Stats(stats::Args),
    /// Run a command for each job of a queue: a worker in any language.
    Work(work::Args),
    /// Make bearer tokens for `serve --auth-tokens`.
    Token(token::Args),
    /// Measure throughput and latency (durable replies) on this machine.
    Bench(jobq_bench::BenchArgs),
    /// Prints a shell completion script (bash, zsh or fish) to stdout:
    /// `source <(jobq completions bash)`.
    Completions(completions::Args),
    // `jobq __watchdog` (watchdog.rs) is dispatched in main.rs before the
    // parse: as a hidden subcommand, the completion scripts offered it.
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

    /// The OpenTelemetry `service.name` of this process's spans.
    pub fn service_name(&self) -> &'static str {
        match self.command {
            Command::Serve(_) => "jobq-server",
            Command::Work(_) => "jobq-worker",
            _ => "jobq-cli",
        }
    }

    /// Runs the chosen subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        let out = Out { json: self.json };
        match self.command {
            Command::Serve(config) => serve::run(*config).await,
            Command::Migrate(args) => migrate::run(args).await,
            Command::Work(args) => work::run(&self.conn, args).await,
            Command::Enqueue(args) => enqueue::run(&self.conn.client().await?, out, args).await,
            Command::Get(args) => get::run(&self.conn.client().await?, out, args).await,
            Command::Watch(args) => watch::run(&self.conn.client().await?, out, args).await,
            Command::List(args) => list::run(&self.conn.client().await?, out, args).await,
            Command::Retry(args) => retry::run(&self.conn.client().await?, out, args).await,
            Command::Cancel(args) => cancel::run(&self.conn.client().await?, out, args).await,
            Command::Delete(args) => delete::run(&self.conn.client().await?, out, args).await,
            Command::Purge(args) => purge::run(&self.conn.client().await?, out, args).await,
            Command::Schedule(args) => schedule::run(&self.conn.client().await?, out, args).await,
            Command::Pause(args) => pause::run(&self.conn.client().await?, out, args, true).await,
            Command::Resume(args) => pause::run(&self.conn.client().await?, out, args, false).await,
            Command::Policy(args) => policy::run(&self.conn.client().await?, out, args).await,
            Command::Stats(args) => stats::run(&self.conn, out, args).await,
            Command::Token(args) => token::run(out, args),
            Command::Bench(args) => jobq_bench::run(args).await,
            Command::Completions(args) => completions::run(args),
        }
    }
}

/// A usage error found after parsing (e.g. a flag combination clap cannot
/// express); reported like clap's own, with exit code 2.
pub fn usage(message: impl std::fmt::Display) -> anyhow::Error {
    Cli::command()
        .error(clap::error::ErrorKind::ArgumentConflict, message)
        .into()
}

#[cfg(test)]
mod tests {

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
        assert_eq!(cli.conn.server, "http://h:1");
    }
}
