//! The fault suite's worker: a process that holds Lease streams, heartbeats,
//! acks, moves to another server when its own fails, and records all it
//! sees in a history file.

#[allow(unused_imports)]
use super::*;

/// What a worker writes, one line per event: `<unix ns>\t<event>\t<job>\t
/// <lease>\t<extra>`. Events: `stream` (a Lease stream opened; extra: the
/// server's slot), `stream_end`, `leased`, `revoked`, `lost` (a heartbeat
/// said the lease is gone), `confirm` (a heartbeat said it is still held;
/// extra: when the heartbeat was sent), `acked` (extra: when the ack was
/// sent), `ack_refused`. Each line is one write(2), so a SIGKILL loses no
/// line that was written.
pub(super) struct History(pub(super) Mutex<File>);

impl History {
    pub(super) fn rec(&self, event: &str, job: &str, lease: &str, extra: &str) {
        let line = format!("{}\t{event}\t{job}\t{lease}\t{extra}\n", now_ns());
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(line.as_bytes())
            .expect("write the history");
    }
}

pub(super) struct WorkerState {
    pub(super) id: String,
    /// Unary calls, bounded by `CALL_TIMEOUT`, one per server.
    pub(super) calls: Vec<Client>,
    /// Lease streams, one per server.
    pub(super) streams: Vec<Client>,
    /// The slot of the server whose Lease stream is current.
    pub(super) current: AtomicUsize,
    /// The slot whose heartbeat failed: the stream there is abandoned.
    pub(super) failed: AtomicUsize,
    pub(super) reconnect: Notify,
    /// Job id → (lease id, its run's cancellation).
    pub(super) held: Mutex<HashMap<String, (String, CancellationToken)>>,
    pub(super) history: History,
}

impl WorkerState {
    pub(super) fn refs(&self) -> Vec<pb::LeaseRef> {
        self.held
            .lock()
            .unwrap()
            .iter()
            .map(|(job, (lease, _))| pb::LeaseRef {
                job_id: job.clone(),
                lease_id: lease.clone(),
                progress: None,
            })
            .collect()
    }

    /// Forgets `lease` of `job` (if it is still the one held) and cancels
    /// its run.
    pub(super) fn forget(&self, job: &str, lease: &str) {
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
pub(super) async fn run_job(
    w: Arc<WorkerState>,
    job: String,
    lease: String,
    cancel: CancellationToken,
) {
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
pub(super) async fn heartbeats(w: Arc<WorkerState>) {
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

pub(super) fn on_event(w: &Arc<WorkerState>, event: Event, slot: usize) {
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

pub(super) async fn run_worker(id: String, urls: Vec<String>, history: History) {
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
    // A stream given up on stays open until the next one is, and has taken
    // over the leases it declares (so they move there rather than going
    // back to the queue).
    let mut abandoned = None;
    loop {
        let declared = w.refs();
        let opening = w.streams[slot].lease_with_token(
            [QUEUE],
            w.id.clone(),
            WORKER_CAPACITY,
            Some(LEASE),
            declared.clone(),
        );
        if let Ok(Ok((mut stream, _))) = tokio::time::timeout(2 * CALL_TIMEOUT, opening).await {
            w.current.store(slot, Ordering::SeqCst);
            w.history.rec("stream", "", "", &slot.to_string());
            if let Some(old) = abandoned.take() {
                let leases = declared.into_iter().map(|r| r.lease_id).collect();
                tokio::spawn(release(old, leases));
            }
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

/// Closes a stream given up on once the new stream has taken over
/// `leases` from it: the server answers the Lease call before the new
/// stream's declaration is stored, and a stream closed before then has its
/// leases reclaimed (docs/src/design.md §3, takeover: the old stream is
/// sent `revoked` for each). Gives up when the old stream ends, or after
/// `--server-timeout` and 2 s (its server may be frozen or dead). Jobs
/// pushed to it meanwhile are dropped unrecorded: the checker counts their
/// attempts as on leases the worker never read.
async fn release(mut old: tonic::Streaming<pb::LeaseEvent>, mut leases: HashSet<String>) {
    let give_up = tokio::time::sleep(SERVER_TIMEOUT + Duration::from_secs(2));
    tokio::pin!(give_up);
    while !leases.is_empty() {
        tokio::select! {
            () = &mut give_up => return,
            message = old.message() => match message {
                Ok(Some(pb::LeaseEvent { event: Some(Event::Revoked(r)) })) => {
                    leases.remove(&r.lease_id);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            },
        }
    }
}

/// A running worker process. Killed on drop.
pub(super) struct WorkerProcess {
    pub(super) id: String,
    pub(super) runtime: Runtime,
    pub(super) child: Child,
    pub(super) history: PathBuf,
}

/// Which worker a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Runtime {
    /// This module's worker, on every server (a raw Lease stream).
    Raw,
    /// `jobq_client::Worker` on the server of this slot.
    Rust(usize),
    /// The Python client's Worker (`chaos/worker.py`) on the server of
    /// this slot, run by the interpreter that `JOBQ_CHAOS_PYTHON` names.
    Python(usize),
}

/// The Python worker's script.
const PY_WORKER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/e2e/chaos/worker.py"
);

/// The interpreter of `JOBQ_CHAOS_PYTHON`, checked: it must import the
/// client (`jobq`). None when the variable is unset or empty.
pub(super) fn python() -> Option<String> {
    let python = std::env::var("JOBQ_CHAOS_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())?;
    let out = Command::new(&python)
        .args(["-c", "import jobq"])
        .output()
        .unwrap_or_else(|e| panic!("JOBQ_CHAOS_PYTHON={python}: {e}"));
    assert!(
        out.status.success(),
        "JOBQ_CHAOS_PYTHON={python} cannot import the Python client (scripts/ci-extra.sh \
         installs it in target/py-client-venv): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(python)
}

impl WorkerProcess {
    pub(super) fn start(dir: &Path, id: &str, urls: &[String], runtime: Runtime) -> WorkerProcess {
        let history = dir.join(format!("{id}.history"));
        let log = File::create(dir.join(format!("{id}.log"))).expect("worker log");
        let mut command = match runtime {
            Runtime::Python(slot) => {
                let mut c = Command::new(python().expect("JOBQ_CHAOS_PYTHON"));
                c.arg(PY_WORKER)
                    .env("JOBQ_CHAOS_SERVER", &urls[slot])
                    .env("JOBQ_CHAOS_SLOT", slot.to_string())
                    .env("JOBQ_CHAOS_LEASE_S", LEASE.as_secs_f64().to_string())
                    .env(
                        "JOBQ_CHAOS_HEARTBEAT_S",
                        HEARTBEAT_EVERY.as_secs_f64().to_string(),
                    )
                    .env("JOBQ_CHAOS_CAPACITY", WORKER_CAPACITY.to_string());
                c
            }
            Runtime::Raw | Runtime::Rust(_) => {
                let mut c = Command::new(std::env::current_exe().expect("the test binary"));
                c.args([
                    "chaos::chaos_worker_process",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                    "-q",
                ])
                .env("JOBQ_CHAOS_SERVERS", urls.join(","));
                if let Runtime::Rust(slot) = runtime {
                    c.env("JOBQ_CHAOS_SLOT", slot.to_string());
                }
                c
            }
        };
        die_with_suite(&mut command);
        let child = command
            .env("JOBQ_CHAOS_WORKER", id)
            .env("JOBQ_CHAOS_HISTORY", &history)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn a worker process");
        WorkerProcess {
            id: id.to_owned(),
            runtime,
            child,
            history,
        }
    }

    pub(super) fn kill9(&mut self) {
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

/// Per runtime (raw, Rust, Python): the leases and acks its workers
/// recorded. A runtime that ran and recorded none is a violation: its
/// history would be checked for nothing.
pub(super) fn runtimes(workers: &[(String, Runtime)], lines: &[Line]) -> (Vec<String>, String) {
    let name = |r: Runtime| match r {
        Runtime::Raw => "raw",
        Runtime::Rust(_) => "Rust Worker",
        Runtime::Python(_) => "Python Worker",
    };
    let of: HashMap<&str, &str> = workers
        .iter()
        .map(|(id, runtime)| (id.as_str(), name(*runtime)))
        .collect();
    let mut counts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (_, runtime) in workers {
        counts.entry(name(*runtime)).or_default();
    }
    for l in lines {
        if let Some(c) = of.get(l.worker.as_str()).and_then(|r| counts.get_mut(r)) {
            match l.event.as_str() {
                "leased" => c.0 += 1,
                "acked" => c.1 += 1,
                _ => {}
            }
        }
    }
    let mut bad = Vec::new();
    let mut summary = Vec::new();
    for (runtime, (leased, acked)) in counts {
        if leased == 0 || acked == 0 {
            bad.push(format!(
                "the {runtime} workers recorded {leased} leases and {acked} acks"
            ));
        }
        summary.push(format!("{runtime}: {leased} leases, {acked} acks"));
    }
    (bad, summary.join(", "))
}
