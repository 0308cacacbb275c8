//! The `jobq` binary: parses the command line, sets up logging, and hands
//! off to one subcommand module.
//!
//! Layout:
//! - `cli`: the clap [`Cli`] (global `--server`, `--json`) and dispatch.
//! - `exit`: errors to exit codes and stderr text (0 ok, 1 failed call,
//!   2 usage).
//! - `output`: tables, JSON rendering of jobs, readable enum names.
//! - one module per subcommand: `serve`, `migrate`, `enqueue`, `get`, `list`, `retry`,
//!   `stats`, `work`.
//! - `shutdown`: the SIGINT/SIGTERM cancellation token.

mod cli;
mod enqueue;
mod exit;
mod get;
mod list;
mod migrate;
mod output;
mod retry;
mod serve;
mod shutdown;
mod stats;
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
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(cli.default_log_level())),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => exit::report(&err),
    }
}
