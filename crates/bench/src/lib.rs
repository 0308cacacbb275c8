//! `jobq bench`: how fast is jobq on this machine, with every reply durable?
//!
//! One command starts a server (or drives `--server URL`), runs a set of
//! workloads with a progress bar, and prints a table of throughput and
//! latency percentiles — or, with `--json`, one JSON object per workload.
//! The server has one durability mode: each reply that promises durability
//! waits for sled's flush plus an `fdatasync` (group commit), so every
//! figure here is a durable one.
//!
//! # Layout
//! - this file: [`BenchArgs`] (the flags), [`Workload`], [`run`] and
//!   [`measure`], which run the selected workloads in order.
//! - `server`: the server under test — a spawned `jobq serve` child on a
//!   temporary data dir (and its memory), or an external one.
//! - `pool`: the client connections (one HTTP/2 connection each), fresh
//!   queue names.
//! - `stamp`: payloads that carry their send time, for latency across tasks.
//! - `hist`: latency histograms (hdrhistogram) and their summaries.
//! - `progress`: the indicatif bar of each workload.
//! - `workloads`: one module per workload (`enqueue` covers A and A-batch,
//!   `drain` B, `latency` C, `held` C over a held backlog, `mixed`), plus
//!   `worker`, the Lease-stream
//!   take-and-ack loop they share.
//! - `report`: the [`Outcome`] of a workload, the table and the JSON lines.
#![warn(missing_docs)]

mod hist;
mod pool;
mod progress;
mod report;
mod server;
mod stamp;
mod workloads;

use std::{io::Write, path::PathBuf, time::Duration};

use clap::{parser::ValueSource, Args, ValueEnum};

pub use hist::Summary;
pub use report::{Outcome, Report};
pub use server::Memory;

/// The flags of `jobq bench`. Defaults are the workloads of the benchmarks
/// chapter (docs/src/benchmarks.md).
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Drive this running server (e.g. http://127.0.0.1:50051) instead of
    /// spawning one; no memory figures then.
    #[command(flatten)]
    pub server: ServerUrl,

    /// Workloads to run, in this order: a (enqueue), a-batch
    /// (enqueue-batch), b (drain), c (latency), mixed, and the
    /// like-for-like shapes where each producer and each worker has its own
    /// connection: a-own (enqueue-own-conn), b-own-cap1
    /// (drain-own-conn-cap1), b-own-cap4 (drain-own-conn-cap4), c-own
    /// (latency-own-conn, capacity 1); and c-held (latency-held-backlog:
    /// c-own past a backlog a policy holds back, `--held-jobs`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "a,a-batch,b,c,mixed,a-own,b-own-cap1,b-own-cap4,c-own"
    )]
    pub workloads: Vec<Workload>,

    /// Set `max_running N` on every queue of the run before its workload
    /// (0: no policy), to measure what a policy costs: a limit above the
    /// workers' capacity holds nothing back.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub policy_max_running: u32,

    /// c-held: PENDING jobs held back while C runs.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub held_jobs: u64,

    /// c-held: the groups they are spread over (each with one job running).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub held_groups: u64,

    /// Jobs per throughput workload (A, A-batch, B).
    #[arg(long, default_value_t = 20_000)]
    pub jobs: u64,

    /// Concurrent producers in A and A-batch.
    #[arg(long, default_value_t = 32)]
    pub producers: usize,

    /// Jobs per EnqueueBatch RPC (A-batch, and B's untimed fill).
    #[arg(long, default_value_t = 100)]
    pub batch_size: usize,

    /// Workers (one Lease stream each) in B and mixed.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,

    /// Capacity of each Lease stream: unacked jobs a worker holds at once.
    #[arg(long, default_value_t = 4)]
    pub capacity: u32,

    /// Payload bytes per job (C and mixed use at least 16: the send time
    /// and a sequence number travel in it).
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,

    /// C: the producer's enqueue rate, jobs per second (open loop: sends
    /// keep the schedule however slow the replies are).
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,

    /// C: jobs to send.
    #[arg(long, default_value_t = 2000)]
    pub latency_jobs: u64,

    /// C: waiting workers (Lease streams).
    #[arg(long, default_value_t = 4)]
    pub latency_workers: usize,

    /// Mixed: producers enqueueing one job per RPC, as fast as replies come.
    #[arg(long, default_value_t = 8)]
    pub mixed_producers: usize,

    /// Mixed: most jobs enqueued but not yet acked (default: twice what the
    /// workers hold, 2 × workers × capacity). Producers wait for acks
    /// beyond it, so the queue stays short and the latency is a steady
    /// state's rather than an ever-growing backlog's.
    #[arg(long)]
    pub mixed_backlog: Option<u64>,

    /// Mixed: how long producers run (workers run alongside, then drain).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// Mixed: enqueue exactly this many jobs instead of running for
    /// --duration; throughput is then jobs / time until the last ack.
    #[arg(long)]
    pub mixed_jobs: Option<u64>,

    /// Client HTTP/2 connections of a, a-batch, b, c and mixed: a number,
    /// shared round-robin by producers and workers (one connection can be
    /// the bottleneck), or `own`: each producer and each worker its own
    /// connection. The `-own` workloads always use `own`.
    #[arg(long, default_value = "8", value_parser = parse_connections)]
    pub connections: Connections,

    /// With `--server`: the server's process id, so its memory (VmRSS,
    /// VmHWM from /proc/PID/status) is reported as for a spawned one.
    #[arg(long, value_name = "PID")]
    pub server_pid: Option<u32>,

    /// Where the spawned server's temporary data dir is made (default: the
    /// system temp dir). Put it on the disk you care about: on tmpfs an
    /// fsync is free.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// An extra flag for the spawned `jobq serve` (repeatable), e.g.
    /// --serve-arg=--cache-bytes=268435456.
    #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,

    /// One JSON object per line and workload on stdout, instead of the table.
    #[arg(long)]
    pub json: bool,

    /// No progress bar (it is drawn on stderr, and only to a terminal).
    #[arg(long)]
    pub no_progress: bool,

    /// A PostgreSQL database (postgres://…): the spawned server stores its
    /// jobs there (`jobq serve --store URL`), `b-own-cap1-analyzed` runs
    /// `ANALYZE jobq_jobs` on it, and the `loop-*` workloads run a plain
    /// `SKIP LOCKED` job loop against it, for comparison in the same run.
    #[arg(long, value_name = "URL")]
    pub pg: Option<String>,
}

impl BenchArgs {
    /// The policy `--policy-max-running` asks for.
    fn policy(&self) -> Option<jobq_client::QueuePolicy> {
        (self.policy_max_running > 0)
            .then(|| jobq_client::QueuePolicy::new().max_running(self.policy_max_running))
    }
}

/// `--server URL`, counted only when given on the command line.
///
/// `jobq`'s global `--server` has the same name, a default and the
/// `JOBQ_SERVER` variable, and clap hands those down to this flag too. A
/// user whose shell points JOBQ_SERVER at production must not bench
/// production by accident, so only an explicit `--server` (before or after
/// `bench`) selects an external server; otherwise the bench spawns its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerUrl(pub Option<String>);

impl ServerUrl {
    const ID: &'static str = "server";
}

impl clap::FromArgMatches for ServerUrl {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let explicit = matches.value_source(Self::ID) == Some(ValueSource::CommandLine);
        Ok(ServerUrl(
            explicit
                .then(|| matches.get_one::<String>(Self::ID).cloned())
                .flatten(),
        ))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for ServerUrl {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.arg(
            clap::Arg::new(Self::ID)
                .long("server")
                .value_name("URL")
                .help("Drive this running server (e.g. http://127.0.0.1:50051) instead of spawning one; no memory figures then. Several servers over one PostgreSQL: URLs separated by commas, connections spread round-robin"),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// How producers and workers get their HTTP/2 connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connections {
    /// This many, shared round-robin.
    Shared(usize),
    /// One per producer and per worker.
    Own,
}

impl std::fmt::Display for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connections::Shared(n) => write!(f, "{n}"),
            Connections::Own => f.write_str("own"),
        }
    }
}

impl From<Connections> for serde_json::Value {
    fn from(c: Connections) -> serde_json::Value {
        match c {
            Connections::Shared(n) => n.into(),
            Connections::Own => "own".into(),
        }
    }
}

fn parse_connections(s: &str) -> Result<Connections, String> {
    if s == "own" {
        return Ok(Connections::Own);
    }
    match s.parse::<usize>() {
        Ok(0) => Err("--connections must be at least 1 (or `own`)".into()),
        Ok(n) => Ok(Connections::Shared(n)),
        Err(_) => Err(format!("`{s}` is neither a number nor `own`")),
    }
}

/// One workload of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// A: enqueue, one job per RPC, concurrent producers.
    #[value(name = "a", alias = "enqueue")]
    Enqueue,
    /// A-batch: the same jobs through EnqueueBatch.
    #[value(name = "a-batch", alias = "enqueue-batch")]
    EnqueueBatch,
    /// B: drain pending jobs through Lease streams with acks.
    #[value(name = "b", alias = "drain")]
    Drain,
    /// C: enqueue → delivered latency at a fixed rate.
    #[value(name = "c", alias = "latency")]
    Latency,
    /// Producers and workers at once.
    #[value(name = "mixed")]
    Mixed,
    /// A like for like: each of `--producers` on its own connection.
    #[value(name = "a-own", alias = "enqueue-own-conn")]
    EnqueueOwn,
    /// B like for like: each of `--workers` on its own connection, one job
    /// at a time (capacity 1).
    #[value(name = "b-own-cap1", alias = "drain-own-conn-cap1")]
    DrainOwnCap1,
    /// B on own connections with capacity 4.
    #[value(name = "b-own-cap4", alias = "drain-own-conn-cap4")]
    DrainOwnCap4,
    /// C like for like: the producer and each worker on its own connection,
    /// capacity 1.
    #[value(name = "c-own", alias = "latency-own-conn")]
    LatencyOwn,
    /// `c-own` over a held backlog: `--held-jobs` PENDING jobs in
    /// `--held-groups` groups that a policy holds back (one running job per
    /// group, each group's running), each C job in a group of its own.
    #[value(name = "c-held", alias = "latency-held-backlog")]
    LatencyHeld,
    /// `b-own-cap1` after `ANALYZE jobq_jobs` on `--pg`'s database (run
    /// between the fill and the drain).
    #[value(name = "b-own-cap1-analyzed", alias = "drain-own-conn-cap1-analyzed")]
    DrainOwnCap1Analyzed,
    /// The plain loop's A on `--pg`: one INSERT per job, a connection per
    /// producer.
    #[value(name = "loop-a", alias = "loop-enqueue")]
    LoopEnqueue,
    /// The plain loop's B on `--pg`: SKIP LOCKED take, then ack, a
    /// connection per worker.
    #[value(name = "loop-b", alias = "loop-drain")]
    LoopDrain,
    /// The plain loop's B after `ANALYZE`.
    #[value(name = "loop-b-analyzed", alias = "loop-drain-analyzed")]
    LoopDrainAnalyzed,
    /// The plain loop's C: LISTEN/NOTIFY wake-ups, SKIP LOCKED takes.
    #[value(name = "loop-c", alias = "loop-latency")]
    LoopLatency,
}

impl Workload {
    /// The name in the table and the JSON `workload` field.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Enqueue => "enqueue",
            Workload::EnqueueBatch => "enqueue-batch",
            Workload::Drain => "drain",
            Workload::Latency => "latency",
            Workload::Mixed => "mixed",
            Workload::EnqueueOwn => "enqueue-own-conn",
            Workload::DrainOwnCap1 => "drain-own-conn-cap1",
            Workload::DrainOwnCap4 => "drain-own-conn-cap4",
            Workload::LatencyOwn => "latency-own-conn",
            Workload::LatencyHeld => "latency-held-backlog",
            Workload::DrainOwnCap1Analyzed => "drain-own-conn-cap1-analyzed",
            Workload::LoopEnqueue => "loop-enqueue",
            Workload::LoopDrain => "loop-drain",
            Workload::LoopDrainAnalyzed => "loop-drain-analyzed",
            Workload::LoopLatency => "loop-latency",
        }
    }

    /// The like-for-like workloads: every producer and worker on its own
    /// connection whatever `--connections` says.
    pub fn own_connections(self) -> bool {
        matches!(
            self,
            Workload::EnqueueOwn
                | Workload::DrainOwnCap1
                | Workload::DrainOwnCap4
                | Workload::LatencyOwn
                | Workload::LatencyHeld
                | Workload::DrainOwnCap1Analyzed
        )
    }

    /// The plain `SKIP LOCKED` loop's workloads, run without the server.
    pub fn is_loop(self) -> bool {
        matches!(
            self,
            Workload::LoopEnqueue
                | Workload::LoopDrain
                | Workload::LoopDrainAnalyzed
                | Workload::LoopLatency
        )
    }

    /// Enqueue or drain: the workloads whose peak RSS the report sums up
    /// as "during A+B".
    pub fn is_a_or_b(self) -> bool {
        matches!(
            self,
            Workload::Enqueue
                | Workload::Drain
                | Workload::EnqueueOwn
                | Workload::DrainOwnCap1
                | Workload::DrainOwnCap4
                | Workload::DrainOwnCap1Analyzed
        )
    }
}

/// Runs the bench and prints the table (or the JSON lines) on stdout.
///
/// # Errors
/// When the server cannot be spawned or reached, or any RPC of a workload
/// fails: a figure measured around a failure would be wrong.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let json = args.json;
    let measured = measure(args, |outcome| {
        if json {
            // Each line as soon as its workload ends, so a long run can be
            // watched (or cut short) by a consumer.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", outcome.to_json());
            let _ = out.flush();
        }
    });
    // On Ctrl-C or SIGTERM, dropping the run kills the spawned server and
    // removes its temporary data dir.
    let report = tokio::select! {
        report = measured => report?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
        _ = terminated() => anyhow::bail!("terminated"),
    };
    let mut stdout = std::io::stdout().lock();
    if !json {
        report.write_table(&mut stdout)?;
    }
    Ok(())
}

/// Runs the selected workloads and returns their outcomes, calling
/// `on_outcome` as each one finishes. The server (if spawned) is stopped
/// before this returns.
///
/// A spawned server is killed when the *thread* that polled this future
/// when it spawned the server exits (`PR_SET_PDEATHSIG`): poll it from a
/// thread that outlives the run (a runtime's worker or `block_on`
/// thread), not from a short-lived one.
///
/// # Errors
/// As [`run`].
pub async fn measure(
    args: BenchArgs,
    mut on_outcome: impl FnMut(&Outcome),
) -> anyhow::Result<Report> {
    anyhow::ensure!(
        args.connections != Connections::Shared(0),
        "--connections must be at least 1"
    );
    // Checked before anything runs: a zero here would hang a workload
    // (nothing to wait for never arrives) or end the run only after the
    // workloads before it.
    let at_least_one: [(&str, u64); 11] = [
        ("--capacity", u64::from(args.capacity)),
        ("--batch-size", args.batch_size as u64),
        ("--jobs", args.jobs),
        ("--producers", args.producers as u64),
        ("--workers", args.workers as u64),
        ("--rate", u64::from(args.rate)),
        ("--latency-jobs", args.latency_jobs),
        ("--latency-workers", args.latency_workers as u64),
        ("--mixed-producers", args.mixed_producers as u64),
        ("--mixed-jobs", args.mixed_jobs.unwrap_or(1)),
        ("--held-groups", args.held_groups),
    ];
    for (flag, value) in at_least_one {
        anyhow::ensure!(value > 0, "{flag} must be at least 1");
    }
    anyhow::ensure!(
        args.mixed_backlog != Some(0),
        "--mixed-backlog must be at least 1"
    );
    anyhow::ensure!(
        !args.workloads.contains(&Workload::LatencyHeld)
            || args.policy_max_running == 0
            || u64::from(args.policy_max_running) > args.held_groups.min(args.held_jobs),
        "c-held keeps one job of each of --held-groups running: --policy-max-running must be above it (or 0)"
    );
    anyhow::ensure!(
        args.mixed_jobs.is_some() || !args.duration.is_zero(),
        "--duration must be more than 0"
    );
    anyhow::ensure!(
        args.pg.is_some()
            || !args
                .workloads
                .iter()
                .any(|w| w.is_loop() || *w == Workload::DrainOwnCap1Analyzed),
        "the loop-* and b-own-cap1-analyzed workloads need --pg URL"
    );
    let server = match &args.server.0 {
        Some(url) => server::Server::attach(url.clone(), args.server_pid),
        None => {
            let mut serve_args = args.serve_args.clone();
            if let Some(pg) = &args.pg {
                serve_args.extend(["--store".to_owned(), pg.clone()]);
            }
            server::Server::spawn(args.data_dir.as_deref(), &serve_args).await?
        }
    };
    let shared = match args.connections {
        Connections::Shared(n) => Some(pool::Pool::connect(&server.url(), n, args.policy()).await?),
        Connections::Own => None,
    };
    if !args.json {
        report::write_header(&mut std::io::stdout().lock(), &server, &args)?;
    }
    let progress = progress::Progress::new(!args.no_progress);
    let mut report = Report::new(server.describe());
    for &workload in &args.workloads {
        // Each workload's peak RSS is its own: VmHWM starts again from the
        // current RSS.
        server.reset_peak();
        let own;
        let pool = match &shared {
            Some(pool) if !workload.own_connections() => pool,
            _ => {
                let n = workloads::clients(workload, &args);
                own = pool::Pool::connect(&server.url(), n, args.policy()).await?;
                &own
            }
        };
        let mut outcome = workloads::run(workload, &args, pool, &progress).await?;
        outcome.memory = server.memory();
        on_outcome(&outcome);
        report.outcomes.push(outcome);
    }
    report.memory = server.memory();
    drop(shared);
    server.stop().await;
    Ok(report)
}

/// Resolves on SIGTERM (never, where it cannot be listened for).
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            term.recv().await;
            return;
        }
    }
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use clap::{Parser, Subcommand};

    use super::*;

    /// The shape of `jobq`'s command line: a global `--server` with a
    /// default, `--json`, and `bench` below.
    #[derive(Parser)]
    struct Jobq {
        #[arg(long, global = true, default_value = "http://127.0.0.1:50051")]
        server: String,
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        command: Cmd,
    }

    #[derive(Subcommand)]
    enum Cmd {
        Bench(BenchArgs),
    }

    fn bench(argv: &[&str]) -> BenchArgs {
        let Cmd::Bench(args) = Jobq::try_parse_from(argv).expect("flags").command;
        args
    }

    #[test]
    fn only_an_explicit_server_is_external() {
        assert_eq!(bench(&["jobq", "bench"]).server, ServerUrl(None));
        let url = Some("http://h:1".to_owned());
        assert_eq!(
            bench(&["jobq", "bench", "--server", "http://h:1"]).server,
            ServerUrl(url.clone())
        );
        assert_eq!(
            bench(&["jobq", "--server", "http://h:1", "bench"]).server,
            ServerUrl(url)
        );
    }

    #[test]
    fn defaults_are_the_tables_workloads_and_json_works_either_side() {
        let args = bench(&["jobq", "bench"]);
        assert_eq!(
            args.workloads,
            [
                Workload::Enqueue,
                Workload::EnqueueBatch,
                Workload::Drain,
                Workload::Latency,
                Workload::Mixed,
                Workload::EnqueueOwn,
                Workload::DrainOwnCap1,
                Workload::DrainOwnCap4,
                Workload::LatencyOwn,
            ]
        );
        assert_eq!(
            (args.jobs, args.producers, args.batch_size),
            (20_000, 32, 100)
        );
        assert_eq!(
            (args.workers, args.capacity, args.payload_bytes),
            (8, 4, 100)
        );
        assert_eq!(
            (args.rate, args.latency_jobs, args.latency_workers),
            (1000, 2000, 4)
        );
        assert_eq!(args.connections, Connections::Shared(8));
        assert!(!args.json);
        assert!(bench(&["jobq", "--json", "bench"]).json);
        assert!(bench(&["jobq", "bench", "--json"]).json);
        let picked = bench(&["jobq", "bench", "--workloads", "b,drain,c"]).workloads;
        assert_eq!(
            picked,
            [Workload::Drain, Workload::Drain, Workload::Latency]
        );
    }

    #[test]
    fn connections_are_a_number_or_own() {
        let own = bench(&["jobq", "bench", "--connections", "own"]).connections;
        assert_eq!(own, Connections::Own);
        let n = bench(&["jobq", "bench", "--connections", "32"]).connections;
        assert_eq!(n, Connections::Shared(32));
        assert!(parse_connections("0").is_err());
        assert!(parse_connections("lots").is_err());
        let picked = bench(&[
            "jobq",
            "bench",
            "--workloads",
            "a-own,b-own-cap1,b-own-cap4,c-own",
        ]);
        assert!(picked.workloads.iter().all(|w| w.own_connections()));
    }
}
