//! The fault suite: three `jobq serve` processes on one PostgreSQL cluster
//! of the suite's own (one server with its clock 30 s ahead, under
//! libfaketime; one reaching PostgreSQL through the suite's TCP proxy),
//! producers that enqueue with keys through random servers, worker
//! processes (raw Lease-stream workers, the Rust client's `Worker`, and
//! the Python client's when `JOBQ_CHAOS_PYTHON` names an interpreter) that
//! record everything they see, a schedule ticking every 2 s, and beside
//! them a sled server with its own producer and workers. Faults land at
//! random moments drawn from a seed the test prints (`JOBQ_CHAOS_SEED`
//! fixes it): SIGKILL and restart of a server, SIGSTOP of a server past
//! `--server-timeout`, SIGKILL of a worker (and a new one),
//! `pg_terminate_backend` of one server's sessions, `pg_ctl restart` of
//! PostgreSQL, latency and black holes on the proxied server's database
//! traffic, and SIGKILL and restart of the sled server. Then the checkers
//! read the workers' histories and the final state and hold the promises:
//! nothing lost, nothing stuck, no job acked under two leases, no stale
//! lease honoured, no job held by two workers at once, no attempt spent
//! while its holder heartbeated on time, a killed worker's and a dead
//! server's jobs due again in time, every schedule tick once and never
//! early, and the queue's policy never exceeded.
//!
//! `JOBQ_CHAOS_LONG=1` runs the long profile (more faults, more jobs);
//! see docs/src/operations/fault-suite.md. PostgreSQL (`scripts/pg-test.sh`
//! names its binaries and user) and libfaketime are needed: without them
//! the suite fails, it is never skipped.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs::File,
    io::Write,
    ops::Range,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use jobq::pb::{self, lease_event::Event};
use jobq_client::{Client, EnqueueOptions};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    clocks::{libfaketime, AHEAD},
    harness::{free_port, signal, until, ServerProcess},
};

mod checker;
mod checker_test;
mod client_worker;
mod cluster;
mod limits;
mod pg;
mod producer;
mod proxy;
mod schedule;
mod sled;
mod timing;
mod worker;

use checker::*;
use client_worker::*;
use cluster::*;
use limits::*;
use pg::*;
use producer::*;
use proxy::*;
use schedule::*;
use sled::*;
use timing::*;
use worker::*;

/// `--server-timeout` of the suite's servers.
const SERVER_TIMEOUT: Duration = Duration::from_secs(3);
/// The lease the workers ask for: long beside their heartbeats, so that
/// only a fault can let one expire.
const LEASE: Duration = Duration::from_secs(10);
/// How often a worker heartbeats what it holds.
const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);
/// A worker's and a producer's bound on one unary call: a frozen server
/// is given up on after this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Jobs may be retried this often: faults spend attempts, and no job may
/// end FAILED because of them.
const MAX_ATTEMPTS: u32 = 50;
const QUEUE: &str = "chaos";
const WORKER_CAPACITY: u32 = 4;

/// How much the suite does.
struct Profile {
    name: &'static str,
    /// How long faults are injected (producers enqueue over the same time).
    faults_for: Duration,
    /// The random gap before each fault.
    gap: Range<Duration>,
    jobs: usize,
    producers: usize,
    workers: usize,
    /// How long the queue may take to drain once the faults stop.
    drain: Duration,
    /// At least this many PostgreSQL restarts, spread over the faults.
    pg_restarts: usize,
    /// At least this many server kills, freezes and worker kills, done by
    /// nine tenths of the time (the draw may give more).
    at_least: [usize; 3],
    /// Jobs enqueued on the sled server.
    sled_jobs: usize,
}

fn profile() -> Profile {
    let long = std::env::var("JOBQ_CHAOS_LONG").is_ok_and(|v| !v.is_empty() && v != "0");
    let mut p = if long {
        Profile {
            name: "long",
            faults_for: Duration::from_secs(30 * 60),
            gap: Duration::from_millis(500)..Duration::from_secs(3),
            jobs: 50_000,
            // Each producer enqueues one job at a time: enough of them to
            // keep up with 28 jobs a second on a loaded debug build.
            producers: 16,
            workers: 6,
            drain: Duration::from_secs(300),
            pg_restarts: 5,
            at_least: [100, 20, 200],
            sled_jobs: 3_000,
        }
    } else {
        Profile {
            name: "ci",
            faults_for: Duration::from_secs(90),
            gap: Duration::from_millis(1500)..Duration::from_secs(5),
            jobs: 1_500,
            producers: 3,
            workers: 4,
            drain: Duration::from_secs(90),
            pg_restarts: 1,
            at_least: [3, 2, 5],
            sled_jobs: 300,
        }
    };
    if let Some(secs) = std::env::var("JOBQ_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        p.faults_for = Duration::from_secs(secs);
    }
    p
}

/// A process the suite starts (a worker, a server) dies with the suite,
/// even when the suite crashes or is killed: it gets SIGKILL when the
/// thread that started it ends (the test's own thread, which lives as
/// long as the test: the suite starts processes from its top-level
/// future, never from a spawned task), and ends at once if that happened
/// before it could ask.
fn die_with_suite(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = libc::pid_t::try_from(std::process::id()).expect("pid");
    // SAFETY: prctl, getppid and _exit are async-signal-safe; nothing here
    // allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

fn now_ns() -> u64 {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch");
    u64::try_from(since.as_nanos()).expect("nanoseconds fit u64")
}

fn secs(ns: u64, origin: u64) -> f64 {
    (ns as f64 - origin as f64) / 1e9
}

/// The fault suite's worker process: the suite runs this test binary again
/// with only this test and `JOBQ_CHAOS_WORKER` set. It runs until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the fault suite's worker process, started by the suite itself"]
async fn chaos_worker_process() {
    let id = std::env::var("JOBQ_CHAOS_WORKER")
        .expect("JOBQ_CHAOS_WORKER: this is the fault suite's worker process, started by it");
    let urls: Vec<String> = std::env::var("JOBQ_CHAOS_SERVERS")
        .expect("JOBQ_CHAOS_SERVERS")
        .split(',')
        .map(str::to_owned)
        .collect();
    let path = std::env::var("JOBQ_CHAOS_HISTORY").expect("JOBQ_CHAOS_HISTORY");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("open the history");
    let history = History(Mutex::new(file));
    // A Rust client Worker on one server, or the raw worker on all.
    match std::env::var("JOBQ_CHAOS_SLOT") {
        Ok(slot) => {
            let slot: usize = slot.parse().expect("JOBQ_CHAOS_SLOT is a slot");
            run_client_worker(id, urls[slot].clone(), slot, history).await;
        }
        Err(_) => run_worker(id, urls, history).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_three_servers_under_faults_keep_every_promise() {
    let seed = std::env::var("JOBQ_CHAOS_SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("JOBQ_CHAOS_SEED is a number"))
        .unwrap_or_else(rand::random);
    let p = profile();
    println!(
        "fault suite: JOBQ_CHAOS_SEED={seed}, profile {} ({:?} of faults, {} jobs, {} workers)",
        p.name, p.faults_for, p.jobs, p.workers
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let origin = now_ns();
    let began = Instant::now();

    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::start(dir).await;
    let urls = cluster.urls();
    set_policy(&Client::connect_lazy(urls[0].clone()).expect("a client")).await;
    let pulse_from = create_pulse(&urls, &cluster.db).await;
    let history_dir = cluster.dir.path().to_owned();
    let mut next_worker = 0;
    // Every fourth worker runs the Rust client's Worker, and every fourth
    // the Python client's when JOBQ_CHAOS_PYTHON names an interpreter
    // (scripts/ci-extra.sh), each on one server; the others are raw.
    let python = python();
    let start_worker = |next: &mut usize| {
        let n = *next;
        let id = format!("w{n}");
        *next += 1;
        let runtime = match n % 4 {
            1 => Runtime::Rust(n % 3),
            3 if python.is_some() => Runtime::Python(n % 3),
            _ => Runtime::Raw,
        };
        WorkerProcess::start(&history_dir, &id, &urls, runtime)
    };
    let mut workers: Vec<WorkerProcess> = (0..p.workers)
        .map(|_| start_worker(&mut next_worker))
        .collect();
    let mut gone: Vec<WorkerProcess> = Vec::new();
    let mut killed: HashMap<String, u64> = HashMap::new();

    let enqueued: Enqueued = Arc::default();
    let findings: Arc<Mutex<Vec<String>>> = Arc::default();
    let per_producer = p.jobs / p.producers;
    let every = p.faults_for / u32::try_from(per_producer.max(1)).expect("jobs fit u32");
    let producers: Vec<_> = (0..p.producers)
        .map(|i| {
            tokio::spawn(produce(
                urls.clone(),
                i,
                per_producer,
                every,
                seed,
                Arc::clone(&enqueued),
                Arc::clone(&findings),
            ))
        })
        .collect();

    // The sled part runs beside the faults (in this task: the worker
    // processes it starts die with the thread that started them).
    let sled = sled_run(seed, p.faults_for, p.sled_jobs, p.drain);
    // The faults.
    let faults_began = Instant::now();
    let faults_end = faults_began + p.faults_for;
    let mut exits = Vec::new();
    // PostgreSQL restarts, server kills, freezes, worker kills so far.
    let mut counts = [0usize; 4];
    let faults = async {
        while Instant::now() < faults_end {
            let gap = rng.random_range(p.gap.clone());
            tokio::time::sleep(gap).await;
            let slot = rng.random_range(0..3);
            // The faults the profile asks for at least, spread out: a
            // PostgreSQL restart is owed at every 1/n of the time (from
            // the middle of the first 1/n), the others evenly by nine
            // tenths of it. Otherwise the draw decides (1% restarts).
            let done = faults_began.elapsed().as_secs_f64() / p.faults_for.as_secs_f64();
            let restarts_owed = (done * p.pg_restarts as f64 + 0.5).floor() as usize;
            let owed = |n: usize| ((done / 0.9).min(1.0) * n as f64).floor() as usize;
            let draw = rng.random_range(0..100);
            let draw = if counts[0] < restarts_owed {
                99
            } else if counts[1] < owed(p.at_least[0]) {
                0
            } else if counts[2] < owed(p.at_least[1]) {
                25
            } else if counts[3] < owed(p.at_least[2]) {
                54
            } else {
                draw
            };
            match draw {
                99 => {
                    counts[0] += 1;
                    cluster.restart_postgres().await;
                }
                0..25 => {
                    counts[1] += 1;
                    let down = Duration::from_millis(rng.random_range(100..3000));
                    cluster.kill_server(slot, down).await;
                }
                25..40 => {
                    counts[2] += 1;
                    let frozen =
                        SERVER_TIMEOUT + Duration::from_millis(rng.random_range(500..3000));
                    cluster.freeze_server(slot, frozen).await;
                }
                40..48 => {
                    // Latency: 200 ms to 2 s each way, for 2 to 6 s.
                    let latency = Duration::from_millis(rng.random_range(200..2000));
                    let lasts = Duration::from_millis(rng.random_range(2000..6000));
                    cluster.proxy_fault(Some(latency), lasts).await;
                }
                48..54 => {
                    // A black hole past --server-timeout.
                    let lasts = SERVER_TIMEOUT + Duration::from_millis(rng.random_range(500..3000));
                    cluster.proxy_fault(None, lasts).await;
                }
                54..86 => {
                    counts[3] += 1;
                    let i = rng.random_range(0..workers.len());
                    let mut victim = workers.swap_remove(i);
                    let at = now_ns();
                    victim.kill9();
                    killed.insert(victim.id.clone(), at);
                    cluster.record(format!("SIGKILL worker {}", victim.id), false, None, at);
                    gone.push(victim);
                    workers.push(start_worker(&mut next_worker));
                }
                _ => {
                    let kind = [Some("pool"), Some("heartbeat"), Some("listen"), None]
                        [rng.random_range(0..4)];
                    cluster.terminate_sessions(slot, kind).await;
                }
            }
            cluster.restart_exited(&mut exits);
        }
    };
    let ((), sled) = tokio::join!(faults, sled);
    let pulse_to: SystemTime = cluster
        .db
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .expect("read the database's clock")
        .get(0);
    let faults_done = Instant::now();
    for f in &cluster.faults {
        println!("  {:8.3}s  {}", secs(f.from, origin), f.what);
    }
    let kind = |word: &str| {
        cluster
            .faults
            .iter()
            .filter(|f| f.what.contains(word))
            .count()
    };
    let tally = format!(
        "{} server kills, {} freezes, {} worker kills, {} session cuts, {} PostgreSQL \
         restarts, {} latencies, {} black holes",
        counts[1],
        counts[2],
        counts[3],
        kind("pg_terminate_backend"),
        counts[0],
        kind("proxy delays"),
        kind("proxy black-holes"),
    );

    // Every enqueue acknowledged, then the queue drains.
    for producer in producers {
        tokio::time::timeout(p.drain, producer)
            .await
            .expect("the producers finished")
            .expect("producer task");
    }
    let drain_end = Instant::now() + p.drain;
    let mut stuck = Vec::new();
    loop {
        let rows = cluster
            .db
            .query(
                "SELECT id::text, status, attempts, lease_worker, lease_server FROM jobq_jobs \
                 WHERE queue = $1 AND status IN ('pending', 'running') ORDER BY id LIMIT 20",
                &[&QUEUE],
            )
            .await
            .expect("count what is left");
        if rows.is_empty() {
            break;
        }
        if Instant::now() > drain_end {
            for r in rows {
                stuck.push(format!(
                    "job {} stuck {} (attempts {}, worker {:?}, server {:?}) {:?} after the faults",
                    r.get::<_, String>(0),
                    r.get::<_, String>(1),
                    r.get::<_, i32>(2),
                    r.get::<_, Option<String>>(3),
                    r.get::<_, Option<String>>(4),
                    p.drain
                ));
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drained = faults_done.elapsed();
    cluster.restart_exited(&mut exits);

    // Read the histories and the final state.
    for w in &mut workers {
        w.kill9();
    }
    let mut lines = Vec::new();
    for w in workers.iter().chain(&gone) {
        lines.extend(read_history(&w.id, &w.history));
    }
    let fin = final_state(&cluster.db).await;
    let enqueued = enqueued.lock().unwrap().clone();
    let (mut bad, summary) = check(&enqueued, &lines, &killed, &cluster.faults, &fin, origin);
    let (late, timing) = check_timing(&lines, &killed, &cluster.faults, &fin, origin);
    bad.extend(late);
    let runs: Vec<Run<'_>> = fin
        .attempts
        .iter()
        .map(|a| Run {
            group: &a.group,
            started: a.started,
            ended: a.ended,
        })
        .collect();
    let (over, limited) = check_limits("postgres", &runs, PG_SLACK);
    bad.extend(over);
    let all: Vec<(String, Runtime)> = workers
        .iter()
        .chain(&gone)
        .map(|w| (w.id.clone(), w.runtime))
        .collect();
    let (silent, recorded) = runtimes(&all, &lines);
    bad.extend(silent);
    let (early, ticked) = check_ticks(
        &ticks(&cluster.db).await,
        pulse_from,
        // The last ticks may still be on their way when the ticks are read.
        pulse_to - Duration::from_secs(3),
        &cluster.faults,
        origin,
    );
    bad.extend(early);
    bad.extend(sled.violations);
    bad.extend(stuck);
    bad.extend(exits);
    bad.extend(findings.lock().unwrap().iter().cloned());
    println!(
        "fault suite: {} faults ({tally}) in {:?}, drained in {drained:?}, {:?} in all; {summary}; {timing}; {limited}; recorded by {recorded}; {ticked}; {}",
        cluster.faults.len(),
        p.faults_for,
        began.elapsed(),
        sled.summary
    );
    assert!(
        bad.is_empty(),
        "JOBQ_CHAOS_SEED={seed}: {} violation(s):\n{}",
        bad.len(),
        bad.join("\n")
    );
}
