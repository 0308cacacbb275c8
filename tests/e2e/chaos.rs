//! The fault suite: three `jobq serve` processes on one PostgreSQL (one of
//! them with its clock 30 s ahead, under libfaketime), producers that
//! enqueue with keys through random servers, and worker processes holding
//! Lease streams that record everything they see. Faults land at random
//! moments drawn from a seed the test prints (`JOBQ_CHAOS_SEED` fixes it):
//! SIGKILL and restart of a server, SIGSTOP of a server for longer than
//! `--server-timeout` then SIGCONT, SIGKILL of a worker (and a new one),
//! and `pg_terminate_backend` of one server's sessions. Then the checker
//! reads the workers' histories and the final database and holds the
//! promises: nothing lost, nothing stuck, no job acked under two leases,
//! no stale lease honoured, no job held by two workers at once, and no
//! attempt spent while its holder heartbeated on time.
//!
//! `JOBQ_CHAOS_LONG=1` runs the long profile (more faults, more jobs);
//! see docs/src/operations/fault-suite.md. PostgreSQL (`JOBQ_TEST_PG`,
//! `scripts/pg-test.sh`) and libfaketime are needed: without them the
//! suite fails, it is never skipped.

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
use jobq_server::store::postgres::testing;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    clocks::{libfaketime, AHEAD},
    harness::{free_port, signal, until, ServerProcess},
};

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

fn now_ns() -> u64 {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch");
    u64::try_from(since.as_nanos()).expect("nanoseconds fit u64")
}

fn secs(ns: u64, origin: u64) -> f64 {
    (ns as f64 - origin as f64) / 1e9
}

// ---------------------------------------------------------------------
// The worker process.
// ---------------------------------------------------------------------

/// What a worker writes, one line per event: `<unix ns>\t<event>\t<job>\t
/// <lease>\t<extra>`. Events: `stream` (a Lease stream opened; extra: the
/// server's slot), `stream_end`, `leased`, `revoked`, `lost` (a heartbeat
/// said the lease is gone), `confirm` (a heartbeat said it is still held;
/// extra: when the heartbeat was sent), `acked` (extra: when the ack was
/// sent), `ack_refused`. Each line is one write(2), so a SIGKILL loses no
/// line that was written.
struct History(Mutex<File>);

impl History {
    fn rec(&self, event: &str, job: &str, lease: &str, extra: &str) {
        let line = format!("{}\t{event}\t{job}\t{lease}\t{extra}\n", now_ns());
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(line.as_bytes())
            .expect("write the history");
    }
}

struct WorkerState {
    id: String,
    /// Unary calls, bounded by `CALL_TIMEOUT`, one per server.
    calls: Vec<Client>,
    /// Lease streams, one per server.
    streams: Vec<Client>,
    /// The slot of the server whose Lease stream is current.
    current: AtomicUsize,
    /// The slot whose heartbeat failed: the stream there is abandoned.
    failed: AtomicUsize,
    reconnect: Notify,
    /// Job id → (lease id, its run's cancellation).
    held: Mutex<HashMap<String, (String, CancellationToken)>>,
    history: History,
}

impl WorkerState {
    fn refs(&self) -> Vec<pb::LeaseRef> {
        self.held
            .lock()
            .unwrap()
            .iter()
            .map(|(job, (lease, _))| pb::LeaseRef {
                job_id: job.clone(),
                lease_id: lease.clone(),
            })
            .collect()
    }

    /// Forgets `lease` of `job` (if it is still the one held) and cancels
    /// its run.
    fn forget(&self, job: &str, lease: &str) {
        let mut held = self.held.lock().unwrap();
        if held.get(job).is_some_and(|(l, _)| l == lease) {
            if let Some((_, cancel)) = held.remove(job) {
                cancel.cancel();
            }
        }
    }
}

/// Runs one leased job: "works" for a little while, then acks through the
/// current server (another one when that fails) until the server answers
/// for good.
async fn run_job(w: Arc<WorkerState>, job: String, lease: String, cancel: CancellationToken) {
    let work = Duration::from_millis(rand::rng().random_range(10..250));
    tokio::select! {
        () = cancel.cancelled() => return,
        () = tokio::time::sleep(work) => {}
    }
    let n = w.calls.len();
    let mut slot = w.current.load(Ordering::SeqCst);
    loop {
        if cancel.is_cancelled() {
            w.history.rec("ack_abandoned", &job, &lease, "");
            return;
        }
        let sent = now_ns();
        match w.calls[slot].ack(job.clone(), lease.clone()).await {
            Ok(_) => {
                w.history.rec("acked", &job, &lease, &sent.to_string());
                w.forget(&job, &lease);
                return;
            }
            Err(e)
                if matches!(
                    e.code(),
                    Some(
                        tonic::Code::Aborted
                            | tonic::Code::FailedPrecondition
                            | tonic::Code::NotFound
                    )
                ) =>
            {
                let why = format!("{:?}: {e}", e.code());
                w.history.rec("ack_refused", &job, &lease, &why);
                w.forget(&job, &lease);
                return;
            }
            Err(_) => {
                slot = (slot + 1) % n;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Heartbeats everything held, through the current stream's server; when
/// that fails, the stream there is abandoned and the heartbeat goes
/// through the next server.
async fn heartbeats(w: Arc<WorkerState>) {
    let n = w.calls.len();
    loop {
        tokio::time::sleep(HEARTBEAT_EVERY).await;
        let refs = w.refs();
        let first = w.current.load(Ordering::SeqCst);
        for k in 0..n {
            let slot = (first + k) % n;
            let sent = now_ns();
            match w.calls[slot]
                .heartbeat(w.id.clone(), refs.clone(), None)
                .await
            {
                Ok(lost) => {
                    let lost: HashSet<(String, String)> =
                        lost.into_iter().map(|r| (r.job_id, r.lease_id)).collect();
                    for r in &refs {
                        if lost.contains(&(r.job_id.clone(), r.lease_id.clone())) {
                            w.history.rec("lost", &r.job_id, &r.lease_id, "");
                            w.forget(&r.job_id, &r.lease_id);
                        } else {
                            w.history
                                .rec("confirm", &r.job_id, &r.lease_id, &sent.to_string());
                        }
                    }
                    break;
                }
                Err(_) if k == 0 => {
                    w.failed.store(slot, Ordering::SeqCst);
                    w.reconnect.notify_one();
                }
                Err(_) => {}
            }
        }
    }
}

fn on_event(w: &Arc<WorkerState>, event: Event, slot: usize) {
    match event {
        Event::Leased(leased) => {
            let job = leased.job.expect("a leased job").id;
            let lease = leased.lease_id;
            w.history.rec("leased", &job, &lease, &slot.to_string());
            let cancel = CancellationToken::new();
            let before = w
                .held
                .lock()
                .unwrap()
                .insert(job.clone(), (lease.clone(), cancel.clone()));
            if let Some((old, old_cancel)) = before {
                old_cancel.cancel();
                w.history.rec("superseded", &job, &old, "");
            }
            tokio::spawn(run_job(Arc::clone(w), job, lease, cancel));
        }
        Event::Revoked(r) => {
            w.history.rec("revoked", &r.job_id, &r.lease_id, &r.reason);
            w.forget(&r.job_id, &r.lease_id);
        }
    }
}

async fn run_worker(id: String, urls: Vec<String>, history: History) {
    let connect = |u: &String| Client::connect_lazy(u.clone()).expect("a client");
    let w = Arc::new(WorkerState {
        id,
        calls: urls
            .iter()
            .map(|u| connect(u).with_timeout(Some(CALL_TIMEOUT)))
            .collect(),
        streams: urls.iter().map(connect).collect(),
        current: AtomicUsize::new(0),
        failed: AtomicUsize::new(usize::MAX),
        reconnect: Notify::new(),
        held: Mutex::new(HashMap::new()),
        history,
    });
    tokio::spawn(heartbeats(Arc::clone(&w)));
    let n = urls.len();
    let mut slot = rand::rng().random_range(0..n);
    // A stream given up on stays open until the next one is (so the leases
    // it declares move there rather than going back to the queue).
    let mut abandoned = None;
    loop {
        let opening = w.streams[slot].lease_with_token(
            [QUEUE],
            w.id.clone(),
            WORKER_CAPACITY,
            Some(LEASE),
            w.refs(),
        );
        if let Ok(Ok((mut stream, _))) = tokio::time::timeout(2 * CALL_TIMEOUT, opening).await {
            w.current.store(slot, Ordering::SeqCst);
            w.history.rec("stream", "", "", &slot.to_string());
            drop(abandoned.take());
            loop {
                tokio::select! {
                    message = stream.message() => match message {
                        Ok(Some(pb::LeaseEvent { event: Some(event) })) => on_event(&w, event, slot),
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            w.history.rec("stream_end", "", "", &slot.to_string());
                            break;
                        }
                        Err(e) => {
                            w.history.rec("stream_end", "", "", &format!("{slot} {:?}", e.code()));
                            break;
                        }
                    },
                    () = w.reconnect.notified() => {
                        if w.failed.load(Ordering::SeqCst) == slot {
                            w.history.rec("stream_end", "", "", &format!("{slot} abandoned"));
                            abandoned = Some(stream);
                            break;
                        }
                    }
                }
            }
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        slot = (slot + 1) % n;
    }
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
    run_worker(id, urls, History(Mutex::new(file))).await;
}

/// A running worker process. Killed on drop.
struct WorkerProcess {
    id: String,
    child: Child,
    history: PathBuf,
}

impl WorkerProcess {
    fn start(dir: &Path, id: &str, urls: &[String]) -> WorkerProcess {
        let history = dir.join(format!("{id}.history"));
        let log = File::create(dir.join(format!("{id}.log"))).expect("worker log");
        let child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "chaos::chaos_worker_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env("JOBQ_CHAOS_WORKER", id)
            .env("JOBQ_CHAOS_SERVERS", urls.join(","))
            .env("JOBQ_CHAOS_HISTORY", &history)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn a worker process");
        WorkerProcess {
            id: id.to_owned(),
            child,
            history,
        }
    }

    fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the worker");
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------
// The servers and the faults.
// ---------------------------------------------------------------------

/// One of the three servers: it comes back on the same port after a kill.
struct Slot {
    port: u16,
    data: PathBuf,
    skewed: bool,
    process: Option<ServerProcess>,
}

#[derive(Debug, Clone)]
struct Fault {
    what: String,
    /// A server kill, freeze or exit: attempts spent meanwhile are
    /// explained by it.
    server: bool,
    from: u64,
    to: u64,
}

struct Cluster {
    url: String,
    db: tokio_postgres::Client,
    slots: Vec<Slot>,
    faults: Vec<Fault>,
    dir: tempfile::TempDir,
}

fn start_server(slot: &Slot, url: &str) -> ServerProcess {
    let timeout = humantime::format_duration(SERVER_TIMEOUT).to_string();
    let args = [
        "--store",
        url,
        "--server-timeout",
        &timeout,
        "--min-lease",
        "10ms",
    ];
    let listen = format!("127.0.0.1:{}", slot.port);
    let skewed = slot.skewed.then(libfaketime);
    tokio::task::block_in_place(|| {
        ServerProcess::start_with(&slot.data, &listen, &args, |c| {
            if let Some(lib) = skewed {
                c.env("LD_PRELOAD", lib)
                    .env("FAKETIME", format!("+{}s", AHEAD.as_secs()))
                    .env("DONT_FAKE_MONOTONIC", "1");
            }
        })
    })
}

/// The local TCP ports of `pid`'s sockets (its connections to PostgreSQL
/// among them), from /proc.
fn local_ports(pid: u32) -> HashSet<i32> {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                {
                    inodes.insert(inode.to_owned());
                }
            }
        }
    }
    let mut ports = HashSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && inodes.contains(cols[9]) {
                if let Some(port) = cols[1].rsplit(':').next() {
                    if let Ok(port) = i32::from_str_radix(port, 16) {
                        ports.insert(port);
                    }
                }
            }
        }
    }
    ports
}

impl Cluster {
    async fn start(dir: tempfile::TempDir) -> Cluster {
        let url = testing::fresh_database("jobq_chaos").await;
        let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test database");
        tokio::spawn(connection);
        let mut slots: Vec<Slot> = (0..3)
            .map(|i| Slot {
                port: free_port(),
                data: dir.path().join(format!("s{i}")),
                // The third server's clock runs ahead of everyone else's.
                skewed: i == 2,
                process: None,
            })
            .collect();
        for slot in &mut slots {
            slot.process = Some(start_server(slot, &url));
        }
        let cluster = Cluster {
            url,
            db,
            slots,
            faults: Vec::new(),
            dir,
        };
        // The skew took: the server logs its own clock, 30 s ahead.
        let skewed = cluster.slots[2].process.as_ref().expect("running");
        let line = until(Duration::from_secs(10), "the serving line", || async {
            skewed.first_logged("jobq serving")
        })
        .await;
        let dated = line
            .split_whitespace()
            .next()
            .and_then(|t| humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok())
            .unwrap_or_else(|| panic!("no timestamp first on {line:?}"));
        let ahead = dated
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        assert!(
            ahead > AHEAD - Duration::from_secs(10),
            "libfaketime did not move the third server's clock ahead (it logged {line:?})"
        );
        cluster
    }

    fn urls(&self) -> Vec<String> {
        self.slots
            .iter()
            .map(|s| format!("http://127.0.0.1:{}", s.port))
            .collect()
    }

    fn process(&mut self, slot: usize) -> &mut ServerProcess {
        self.slots[slot].process.as_mut().expect("running")
    }

    /// The id a running server registered under (`jobq <id> <kind>` names
    /// its sessions), found through the ports of its connections.
    async fn server_id(&self, slot: usize) -> String {
        let pid = self.slots[slot]
            .process
            .as_ref()
            .expect("running")
            .child
            .id();
        until(
            Duration::from_secs(20),
            "the server's sessions",
            || async move {
                let ports: Vec<i32> = local_ports(pid).into_iter().collect();
                let rows = self
                .db
                .query(
                    "SELECT DISTINCT split_part(application_name, ' ', 2) FROM pg_stat_activity \
                     WHERE client_port = ANY($1) AND application_name LIKE 'jobq %'",
                    &[&ports],
                )
                .await
                .ok()?;
                match rows.as_slice() {
                    [one] => Some(one.get::<_, String>(0)),
                    _ => None,
                }
            },
        )
        .await
    }

    fn record(&mut self, what: String, server: bool, from: u64) {
        self.faults.push(Fault {
            what,
            server,
            from,
            to: now_ns(),
        });
    }

    async fn kill_server(&mut self, slot: usize, down: Duration) {
        let from = now_ns();
        self.process(slot).kill9();
        tokio::time::sleep(down).await;
        let restarted = start_server(&self.slots[slot], &self.url);
        self.slots[slot].process = Some(restarted);
        self.record(
            format!("SIGKILL server {slot}, restarted after {down:?}"),
            true,
            from,
        );
    }

    async fn freeze_server(&mut self, slot: usize, frozen: Duration) {
        let from = now_ns();
        signal(&self.process(slot).child, libc::SIGSTOP);
        tokio::time::sleep(frozen).await;
        signal(&self.process(slot).child, libc::SIGCONT);
        self.record(
            format!("SIGSTOP server {slot} for {frozen:?}, then SIGCONT"),
            true,
            from,
        );
    }

    /// Ends the server's sessions of one kind (`pool`, `heartbeat`,
    /// `listen`; every kind when `None`).
    async fn terminate_sessions(&mut self, slot: usize, kind: Option<&str>) {
        let from = now_ns();
        let id = self.server_id(slot).await;
        let pattern = match kind {
            Some(kind) => format!("jobq {id} {kind}%"),
            None => format!("jobq {id} %"),
        };
        let ended: i64 = self
            .db
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name LIKE $1",
                &[&pattern],
            )
            .await
            .expect("pg_terminate_backend")
            .get(0);
        self.record(
            format!(
                "pg_terminate_backend of server {slot}'s {} sessions ({ended})",
                kind.unwrap_or("every")
            ),
            false,
            from,
        );
    }

    /// A server that exited by itself is a finding; it is restarted so the
    /// run goes on, and its exit explains the attempts spent meanwhile.
    fn restart_exited(&mut self, findings: &mut Vec<String>) {
        for slot in 0..self.slots.len() {
            let exited = self.process(slot).child.try_wait().expect("try_wait");
            if let Some(status) = exited {
                let from = now_ns();
                findings.push(format!("server {slot} exited by itself: {status}"));
                let restarted = start_server(&self.slots[slot], &self.url);
                self.slots[slot].process = Some(restarted);
                self.record(format!("server {slot} exited ({status})"), true, from);
            }
        }
    }
}

// ---------------------------------------------------------------------
// Producers.
// ---------------------------------------------------------------------

/// Key → job id of every acknowledged enqueue.
type Enqueued = Arc<Mutex<BTreeMap<String, String>>>;

/// Enqueues `jobs` jobs with keys, one every `every`, each through a random
/// server and retried (same key) through others until acknowledged.
async fn produce(
    urls: Vec<String>,
    producer: usize,
    jobs: usize,
    every: Duration,
    seed: u64,
    enqueued: Enqueued,
    findings: Arc<Mutex<Vec<String>>>,
) {
    let clients: Vec<Client> = urls
        .iter()
        .map(|u| {
            Client::connect_lazy(u.clone())
                .expect("a client")
                .with_timeout(Some(2 * CALL_TIMEOUT))
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed ^ (producer as u64 + 1).wrapping_mul(0x9e37_79b9));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..jobs {
        tick.tick().await;
        let key = format!("p{producer}-{i}");
        loop {
            let c = &clients[rng.random_range(0..clients.len())];
            let opts = EnqueueOptions::new()
                .key(key.clone())
                .max_attempts(MAX_ATTEMPTS);
            match c
                .enqueue(QUEUE, "chaos", key.clone().into_bytes(), opts)
                .await
            {
                Ok((job, _)) => {
                    let mut enqueued = enqueued.lock().unwrap();
                    if let Some(before) = enqueued.insert(key.clone(), job.id.clone()) {
                        if before != job.id {
                            findings.lock().unwrap().push(format!(
                                "key {key} enqueued as job {before} and then as {}",
                                job.id
                            ));
                        }
                    }
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

// ---------------------------------------------------------------------
// The checker.
// ---------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Line {
    t: u64,
    worker: String,
    event: String,
    job: String,
    lease: String,
    extra: String,
}

fn read_history(worker: &str, path: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut cols = l.splitn(5, '\t');
            Some(Line {
                t: cols.next()?.parse().ok()?,
                event: cols.next()?.to_owned(),
                job: cols.next()?.to_owned(),
                lease: cols.next()?.to_owned(),
                extra: cols.next().unwrap_or_default().to_owned(),
                worker: worker.to_owned(),
            })
        })
        .collect()
}

struct Attempt {
    job: String,
    lease: String,
    worker: String,
    started: u64,
    ended: u64,
    outcome: String,
}

struct Final {
    /// Job id → status.
    status: HashMap<String, String>,
    attempts: Vec<Attempt>,
}

async fn final_state(db: &tokio_postgres::Client) -> Final {
    let status = db
        .query("SELECT id::text, status FROM jobq_jobs", &[])
        .await
        .expect("read the jobs")
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let attempts = db
        .query(
            "SELECT job_id::text, lease_id, worker_id, \
                    (extract(epoch FROM started_at) * 1e6)::int8, \
                    (extract(epoch FROM coalesce(ended_at, started_at)) * 1e6)::int8, \
                    coalesce(outcome, '') \
             FROM jobq_attempts",
            &[],
        )
        .await
        .expect("read the attempts")
        .into_iter()
        .map(|r| Attempt {
            job: r.get(0),
            // A lease id is a u64, kept in a bigint by its bits.
            lease: (r.get::<_, i64>(1) as u64).to_string(),
            worker: r.get(2),
            started: u64::try_from(r.get::<_, i64>(3)).unwrap_or(0) * 1000,
            ended: u64::try_from(r.get::<_, i64>(4)).unwrap_or(0) * 1000,
            outcome: r.get(5),
        })
        .collect();
    Final { status, attempts }
}

/// Every promise, checked against the histories and the final database;
/// returns the violations and a summary.
fn check(
    enqueued: &BTreeMap<String, String>,
    lines: &[Line],
    killed: &HashMap<String, u64>,
    faults: &[Fault],
    fin: &Final,
    origin: u64,
) -> (Vec<String>, String) {
    let mut bad = Vec::new();

    // 0 lost: every acknowledged enqueue ends DONE. 0 stuck, 0 dead.
    let mut lost = 0;
    for (key, id) in enqueued {
        let status = fin.status.get(id).map_or("missing", String::as_str);
        if status != "done" {
            lost += 1;
            if lost <= 20 {
                bad.push(format!("job {id} (key {key}) ended {status}, not done"));
            }
        }
    }
    if lost > 20 {
        bad.push(format!(
            "... {lost} acknowledged jobs in all did not end done"
        ));
    }
    let ids: HashSet<&String> = enqueued.values().collect();
    for (id, status) in &fin.status {
        if status != "done" && !ids.contains(id) {
            bad.push(format!("job {id} is {status} at the end"));
        }
    }

    // Per job: the leases received (lease, worker, when), and the server's
    // answers that a lease was still held (lease, worker, when the call
    // was sent, what).
    let mut received: HashMap<&str, Vec<(&str, &str, u64)>> = HashMap::new();
    let mut held_after: HashMap<&str, Vec<(&str, &str, u64, &str)>> = HashMap::new();
    let mut acked: HashMap<&str, Vec<(&str, &str, u64)>> = HashMap::new();
    for l in lines {
        match l.event.as_str() {
            "leased" => received
                .entry(&l.job)
                .or_default()
                .push((&l.lease, &l.worker, l.t)),
            "confirm" | "acked" => {
                let sent = l.extra.parse().unwrap_or(l.t);
                held_after
                    .entry(&l.job)
                    .or_default()
                    .push((&l.lease, &l.worker, sent, &l.event));
                if l.event == "acked" {
                    acked
                        .entry(&l.job)
                        .or_default()
                        .push((&l.lease, &l.worker, l.t));
                }
            }
            _ => {}
        }
    }

    // No job acked under two leases.
    for (job, acks) in &acked {
        let leases: HashSet<&str> = acks.iter().map(|a| a.0).collect();
        if leases.len() > 1 {
            bad.push(format!("job {job} acked under two leases: {acks:?}"));
        }
    }
    let mut acked_attempts: HashMap<&str, usize> = HashMap::new();
    for a in fin.attempts.iter().filter(|a| a.outcome == "acked") {
        *acked_attempts.entry(&a.job).or_default() += 1;
    }
    for (job, status) in &fin.status {
        let n = acked_attempts.get(job.as_str()).copied().unwrap_or(0);
        if status == "done" && n != 1 {
            bad.push(format!("job {job} is done with {n} acked attempts"));
        }
    }

    // No stale lease honoured and no job held by two workers at once: once
    // a lease of a job has reached a worker, the server never again says
    // that an older lease of it is held (a heartbeat's answer, an ack),
    // for a call sent after that newer lease arrived.
    for (job, got) in &received {
        let Some(answers) = held_after.get(job) else {
            continue;
        };
        for &(newer, newer_worker, arrived) in got {
            for &(older, older_worker, sent, what) in answers {
                let older_arrived = got
                    .iter()
                    .filter(|g| g.0 == older)
                    .map(|g| g.2)
                    .min()
                    .unwrap_or(0);
                if older != newer && older_arrived < arrived && sent > arrived {
                    bad.push(format!(
                        "job {job}: lease {newer} reached {newer_worker} at {:.3}s, and the \
                         older lease {older} of {older_worker} was still honoured ({what}) \
                         for a call sent at {:.3}s",
                        secs(arrived, origin),
                        secs(sent, origin)
                    ));
                }
            }
        }
        // Nothing leased after an ack.
        if let Some(acks) = acked.get(job) {
            let done_at = acks.iter().map(|a| a.2).min().unwrap_or(u64::MAX);
            let done_lease = acks[0].0;
            for &(lease, worker, at) in got {
                if lease != done_lease && at > done_at {
                    bad.push(format!(
                        "job {job}: lease {lease} reached {worker} at {:.3}s, after the job \
                         was acked under {done_lease} at {:.3}s",
                        secs(at, origin),
                        secs(done_at, origin)
                    ));
                }
            }
        }
    }

    // Every lease that reached a worker is an attempt in the database (a
    // lease that comes back without an attempt never left its server), and
    // none reached a worker after its attempt had ended (a stale `leased`
    // event: two workers would run the job at once).
    let stale_after = Duration::from_secs(2).as_nanos() as u64;
    let attempt_of: HashMap<(&str, &str), &Attempt> = fin
        .attempts
        .iter()
        .map(|a| ((a.job.as_str(), a.lease.as_str()), a))
        .collect();
    for l in lines.iter().filter(|l| l.event == "leased") {
        match attempt_of.get(&(l.job.as_str(), l.lease.as_str())) {
            None => bad.push(format!(
                "job {}: lease {} reached {} at {:.3}s, and the database has no attempt for it",
                l.job,
                l.lease,
                l.worker,
                secs(l.t, origin)
            )),
            Some(a) if l.t > a.ended + stale_after => bad.push(format!(
                "job {}: lease {} reached {} at {:.3}s, after its attempt ended {} at {:.3}s",
                l.job,
                l.lease,
                l.worker,
                secs(l.t, origin),
                a.outcome,
                secs(a.ended, origin)
            )),
            Some(_) => {}
        }
    }

    // No attempt spent while its holder heartbeated on time: an attempt
    // that ended otherwise than acked, held by a worker that was never
    // killed, on a lease the worker had received, is explained only by a
    // server fault (kill, freeze, exit) around it.
    let seen: HashSet<(&str, &str)> = lines
        .iter()
        .filter(|l| l.event == "leased")
        .map(|l| (l.job.as_str(), l.lease.as_str()))
        .collect();
    let margin = Duration::from_secs(2).as_nanos() as u64;
    let after = (SERVER_TIMEOUT + Duration::from_secs(2)).as_nanos() as u64;
    let (mut spent, mut by_kill, mut by_fault, mut unread) = (0, 0, 0, 0);
    for a in &fin.attempts {
        if a.outcome == "acked" || a.outcome.is_empty() {
            continue;
        }
        spent += 1;
        if killed.contains_key(&a.worker) {
            by_kill += 1;
            continue;
        }
        if !seen.contains(&(a.job.as_str(), a.lease.as_str())) {
            // Sent to a stream the worker had just given up on (it could
            // not declare a lease it never read).
            unread += 1;
            continue;
        }
        let explained = faults
            .iter()
            .any(|f| f.server && a.started <= f.to + after && a.ended + margin >= f.from);
        if explained {
            by_fault += 1;
            continue;
        }
        bad.push(format!(
            "job {}: an attempt under lease {} of worker {} ended {} at {:.3}s (started at \
             {:.3}s) with no kill or freeze to explain it",
            a.job,
            a.lease,
            a.worker,
            a.outcome,
            secs(a.ended, origin),
            secs(a.started, origin)
        ));
    }
    let delivered = lines.iter().filter(|l| l.event == "leased").count();
    let matched = fin
        .attempts
        .iter()
        .filter(|a| seen.contains(&(a.job.as_str(), a.lease.as_str())))
        .count();
    // The histories and the database name leases alike (or the attempt
    // check above would pass for the wrong reason).
    if matched * 10 < fin.attempts.len() * 9 {
        bad.push(format!(
            "only {matched} of {} attempts in the database have a lease a worker recorded",
            fin.attempts.len()
        ));
    }
    let summary = format!(
        "{} jobs enqueued, {} acked by workers, {delivered} leases delivered, {} attempts \
         ({matched} on leases the workers recorded); {spent} attempts spent: {by_kill} by \
         worker kills, {by_fault} around server faults, {unread} on leases the worker never read",
        enqueued.len(),
        acked.len(),
        fin.attempts.len(),
    );
    (bad, summary)
}

// ---------------------------------------------------------------------
// The suite.
// ---------------------------------------------------------------------

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
    let history_dir = cluster.dir.path().to_owned();
    let mut next_worker = 0;
    let start_worker = |next: &mut usize| {
        let id = format!("w{next}");
        *next += 1;
        WorkerProcess::start(&history_dir, &id, &urls)
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

    // The faults.
    let faults_end = Instant::now() + p.faults_for;
    let mut exits = Vec::new();
    while Instant::now() < faults_end {
        let gap = rng.random_range(p.gap.clone());
        tokio::time::sleep(gap).await;
        let slot = rng.random_range(0..3);
        match rng.random_range(0..100) {
            0..25 => {
                let down = Duration::from_millis(rng.random_range(100..3000));
                cluster.kill_server(slot, down).await;
            }
            25..40 => {
                let frozen = SERVER_TIMEOUT + Duration::from_millis(rng.random_range(500..3000));
                cluster.freeze_server(slot, frozen).await;
            }
            40..70 => {
                let i = rng.random_range(0..workers.len());
                let mut victim = workers.swap_remove(i);
                victim.kill9();
                killed.insert(victim.id.clone(), now_ns());
                cluster.record(format!("SIGKILL worker {}", victim.id), false, now_ns());
                gone.push(victim);
                workers.push(start_worker(&mut next_worker));
            }
            _ => {
                let kind =
                    [Some("pool"), Some("heartbeat"), Some("listen"), None][rng.random_range(0..4)];
                cluster.terminate_sessions(slot, kind).await;
            }
        }
        cluster.restart_exited(&mut exits);
    }
    let faults_done = Instant::now();
    for f in &cluster.faults {
        println!("  {:8.3}s  {}", secs(f.from, origin), f.what);
    }

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
                 WHERE status IN ('pending', 'running') ORDER BY id LIMIT 20",
                &[],
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
    bad.extend(stuck);
    bad.extend(exits);
    bad.extend(findings.lock().unwrap().iter().cloned());
    println!(
        "fault suite: {} faults in {:?}, drained in {drained:?}, {:?} in all; {summary}",
        cluster.faults.len(),
        p.faults_for,
        began.elapsed()
    );
    assert!(
        bad.is_empty(),
        "JOBQ_CHAOS_SEED={seed}: {} violation(s):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The checker itself, on made-up histories: a clean run passes, and each
/// broken promise is reported (so a passing suite means something).
#[test]
fn chaos_checker_reports_each_broken_promise() {
    let line = |t: u64, worker: &str, event: &str, job: &str, lease: &str, extra: &str| Line {
        t,
        worker: worker.into(),
        event: event.into(),
        job: job.into(),
        lease: lease.into(),
        extra: extra.into(),
    };
    let attempt = |job: &str, lease: &str, worker: &str, started, ended, outcome: &str| Attempt {
        job: job.into(),
        lease: lease.into(),
        worker: worker.into(),
        started,
        ended,
        outcome: outcome.into(),
    };
    let enqueued: BTreeMap<String, String> = [("k1".into(), "1".into())].into();
    let s = 1_000_000_000;
    // Worker a's lease 10 is lost to a server kill; worker b gets lease 11
    // and acks it.
    let clean = vec![
        line(s, "a", "leased", "1", "10", "0"),
        line(2 * s, "a", "confirm", "1", "10", &(2 * s - 1).to_string()),
        line(8 * s, "b", "leased", "1", "11", "1"),
        line(9 * s, "a", "lost", "1", "10", ""),
        line(9 * s, "b", "acked", "1", "11", &(9 * s - 5).to_string()),
    ];
    let server_kill = Fault {
        what: "SIGKILL server 0".into(),
        server: true,
        from: 3 * s,
        to: 4 * s,
    };
    let fin = |outcome_10: &str| Final {
        status: [("1".into(), "done".into())].into(),
        attempts: vec![
            attempt("1", "10", "a", s, 7 * s, outcome_10),
            attempt("1", "11", "b", 8 * s, 9 * s, "acked"),
        ],
    };
    let none = HashMap::new();
    let faults = [server_kill.clone()];
    let (bad, _) = check(
        &enqueued,
        &clean,
        &none,
        &faults,
        &fin("worker_disconnected"),
        0,
    );
    assert!(bad.is_empty(), "{bad:?}");

    // Without the server kill, the spent attempt is unexplained.
    let (bad, _) = check(&enqueued, &clean, &none, &[], &fin("lease_expired"), 0);
    assert!(
        bad.len() == 1 && bad[0].contains("no kill or freeze"),
        "{bad:?}"
    );
    // A killed worker explains it.
    let killed = [("a".to_owned(), 3 * s)].into();
    let (bad, _) = check(&enqueued, &clean, &killed, &[], &fin("lease_expired"), 0);
    assert!(bad.is_empty(), "{bad:?}");

    // Lease 10 still honoured after lease 11 reached worker b; and acked.
    let mut stale = clean.clone();
    stale.push(line(
        10 * s,
        "a",
        "acked",
        "1",
        "10",
        &(8 * s + 1).to_string(),
    ));
    let (bad, _) = check(&enqueued, &stale, &none, &faults, &fin("acked"), 0);
    let all = bad.join("\n");
    assert!(all.contains("acked under two leases"), "{all}");
    assert!(all.contains("still honoured (acked)"), "{all}");
    assert!(all.contains("done with 2 acked attempts"), "{all}");

    // A lease delivered after the ack (and after its own attempt ended), a
    // lease without an attempt; a job that is not done; an unknown job
    // left pending.
    let mut late = clean.clone();
    late.push(line(12 * s, "c", "leased", "1", "12", "2"));
    late.push(line(12 * s, "c", "leased", "1", "10", "2"));
    let mut lost = fin("worker_disconnected");
    lost.status.insert("1".into(), "running".into());
    lost.status.insert("2".into(), "pending".into());
    let (bad, _) = check(&enqueued, &late, &none, &faults, &lost, 0);
    let all = bad.join("\n");
    assert!(all.contains("after the job was acked"), "{all}");
    assert!(
        all.contains("lease 12 reached c at 12.000s, and the database has no attempt"),
        "{all}"
    );
    assert!(
        all.contains("lease 10 reached c at 12.000s, after its attempt ended"),
        "{all}"
    );
    assert!(all.contains("job 1 (key k1) ended running"), "{all}");
    assert!(all.contains("job 2 is pending at the end"), "{all}");
}
