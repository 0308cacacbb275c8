//! The `jobq` binary: parses the command line, sets up logging, and hands
//! off to one subcommand module.
//!
//! Layout:
//! - `cli`: the clap [`Cli`] (global `--server`, `--json`) and dispatch;
//!   `conn`: the connection flags (`--server`, `--token`, TLS).
//! - `exit`: errors to exit codes and stderr text (0 ok, 1 failed call,
//!   2 usage).
//! - `logging`: text or JSON log lines on stderr (`--log-format`).
//! - `output`: tables, JSON rendering of jobs, readable enum names.
//! - one module per subcommand: `serve`, `migrate`, `enqueue`, `get`, `list`, `retry`,
//!   `stats`, `work`, `token` (`jobq token new`), and the operator's
//!   `cancel`, `pause` (and resume), `delete`, `purge`.
//! - `shutdown`: the SIGINT/SIGTERM cancellation token.
//! - `watchdog`: `jobq __watchdog`, which kills `jobq work`'s commands
//!   when `jobq work` dies without cleaning up. It is not a clap
//!   subcommand (completion scripts would offer it): `main` runs it before
//!   parsing.
//! - `completions`: `jobq completions bash|zsh|fish`.
//! - `docs_reference` (tests only): renders the book's CLI and
//!   configuration references from these clap definitions and checks them.

mod cancel;
mod cli;
mod completions;
mod conn;
mod delete;
#[cfg(test)]
mod docs_reference;
mod enqueue;
mod exit;
mod get;
mod list;
mod logging;
mod migrate;
mod output;
mod pause;
mod policy;
mod purge;
mod retry;
mod schedule;
mod serve;
mod shutdown;
mod stats;
mod token;
mod watch;
mod watchdog;
mod work;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;

/// jemalloc instead of glibc malloc: the server allocates and frees small
/// buffers for every request (sled pages, prost messages, HTTP/2 frames),
/// and glibc's allocator was ~15% of its CPU in a drain profile.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation: return freed pages to
/// the OS promptly, so the server's resident memory is what it uses.
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0\0";

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if let (Some(first), None) = (args.next(), args.next()) {
        if first == watchdog::SUBCOMMAND {
            return watchdog::run();
        }
    }
    let cli = Cli::parse();
    let telemetry = match logging::init(
        cli.log_format,
        cli.default_log_level(),
        cli.otlp_endpoint.as_deref(),
        cli.service_name(),
    ) {
        Ok(telemetry) => telemetry,
        Err(err) => return exit::report(&err),
    };
    let outcome = cli.run().await;
    telemetry.shutdown().await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => exit::report(&err),
    }
}
