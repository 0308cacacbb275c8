//! The fault suite's sled part: one `jobq serve` on its own sled data
//! folder beside the PostgreSQL cluster, with a producer and raw workers of
//! its own, under SIGKILL of its workers and SIGKILL and restart of the
//! server (same folder, same port). Checked at the end through the server:
//! every acknowledged enqueue DONE with one acked attempt, nothing left
//! PENDING or RUNNING, and no job acked under two leases by the workers'
//! histories. The leases of a killed sled server persist and a worker that
//! reconnects declares them (docs/src/design.md §3), so attempts are not
//! accounted for here: a take within the last commit round before a kill
//! is undone by design (§5) and delivered again.

#[allow(unused_imports)]
use super::*;

const SLED_WORKERS: usize = 2;

pub(super) struct SledRun {
    pub(super) violations: Vec<String>,
    pub(super) summary: String,
}

fn start_sled(data: &Path, port: u16) -> ServerProcess {
    tokio::task::block_in_place(|| {
        ServerProcess::start_with(
            data,
            &format!("127.0.0.1:{port}"),
            &["--min-lease", "10ms"],
            die_with_suite,
        )
    })
}

/// The sled part of the suite, for `faults_for`, then its drain and its
/// checks.
pub(super) async fn sled_run(
    seed: u64,
    faults_for: Duration,
    jobs: usize,
    drain: Duration,
) -> SledRun {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5_1ed);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("sled");
    let port = free_port();
    let mut server = start_sled(&data, port);
    set_policy(&server.client().await).await;
    let urls = vec![server.url()];
    let mut next = 0;
    let start_worker = |next: &mut usize| {
        let id = format!("sled-w{next}");
        *next += 1;
        WorkerProcess::start(dir.path(), &id, &urls, Runtime::Raw)
    };
    let mut workers: Vec<WorkerProcess> =
        (0..SLED_WORKERS).map(|_| start_worker(&mut next)).collect();
    let mut gone = Vec::new();
    let enqueued: Enqueued = Arc::default();
    let findings: Arc<Mutex<Vec<String>>> = Arc::default();
    let every = faults_for / u32::try_from(jobs.max(1)).expect("jobs fit u32");
    let producer = tokio::spawn(produce(
        urls.clone(),
        // Its keys (`p100-…`) are its own.
        100,
        jobs,
        every,
        seed,
        Arc::clone(&enqueued),
        Arc::clone(&findings),
    ));

    let (mut server_kills, mut worker_kills) = (0, 0);
    let end = Instant::now() + faults_for;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(2000..6000))).await;
        if rng.random_bool(0.5) {
            server.kill9();
            let down = Duration::from_millis(rng.random_range(100..2000));
            tokio::time::sleep(down).await;
            server = start_sled(&data, port);
            server_kills += 1;
        } else {
            let i = rng.random_range(0..workers.len());
            let mut victim = workers.swap_remove(i);
            victim.kill9();
            gone.push(victim);
            workers.push(start_worker(&mut next));
            worker_kills += 1;
        }
    }

    let mut bad = Vec::new();
    match tokio::time::timeout(drain, producer).await {
        Ok(done) => done.expect("the sled producer"),
        Err(_) => bad.push(format!(
            "sled: the producer did not finish within {drain:?}"
        )),
    }
    let client = server.client().await;
    let drained = tokio::time::timeout(drain, async {
        loop {
            if let Ok(stats) = client.stats(Some(QUEUE)).await {
                if stats.iter().all(|q| q.pending == 0 && q.running == 0) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    if drained.is_err() {
        bad.push(format!(
            "sled: jobs left pending or running {drain:?} after the faults"
        ));
    }
    for w in &mut workers {
        w.kill9();
    }

    // Every acknowledged enqueue is DONE with one acked attempt.
    let enqueued = enqueued.lock().unwrap().clone();
    let mut recorded: Vec<(String, u64, u64)> = Vec::new();
    let ns = |t: &Option<prost_types::Timestamp>| {
        t.as_ref().map_or(0, |t| {
            u64::try_from(t.seconds).unwrap_or(0) * 1_000_000_000
                + u64::try_from(t.nanos).unwrap_or(0)
        })
    };
    for (key, id) in &enqueued {
        match client.get_job(id.clone()).await {
            Ok(job) => {
                for a in &job.history {
                    let started = ns(&a.started_at);
                    let ended = a.ended_at.as_ref().map_or(started, |_| ns(&a.ended_at));
                    recorded.push((job.group.clone(), started, ended));
                }
                let acked = job
                    .history
                    .iter()
                    .filter(|a| a.outcome == pb::AttemptOutcome::Acked as i32)
                    .count();
                if job.status != pb::JobStatus::Done as i32 || acked != 1 {
                    bad.push(format!(
                        "sled: job {id} (key {key}) ended {:?} with {acked} acked attempts",
                        pb::JobStatus::try_from(job.status)
                    ));
                }
            }
            Err(e) => bad.push(format!("sled: job {id} (key {key}) is gone: {e}")),
        }
    }
    // No job acked under two leases, by the workers' histories.
    let mut acked: HashMap<String, HashSet<String>> = HashMap::new();
    let mut delivered = 0;
    for w in workers.iter().chain(&gone) {
        for l in read_history(&w.id, &w.history) {
            match l.event.as_str() {
                "acked" => {
                    acked.entry(l.job).or_default().insert(l.lease);
                }
                "leased" => delivered += 1,
                _ => {}
            }
        }
    }
    for (job, leases) in &acked {
        if leases.len() > 1 {
            bad.push(format!(
                "sled: job {job} acked under two leases: {leases:?}"
            ));
        }
    }
    let runs: Vec<Run<'_>> = recorded
        .iter()
        .map(|(group, started, ended)| Run {
            group,
            started: *started,
            ended: *ended,
        })
        .collect();
    let (over, limited) = check_limits("sled", &runs, SLED_SLACK);
    bad.extend(over);
    bad.extend(findings.lock().unwrap().iter().cloned());
    SledRun {
        violations: bad,
        summary: format!(
            "sled: {server_kills} server kills, {worker_kills} worker kills, {} jobs \
             enqueued, {} acked by workers, {delivered} leases delivered; {limited}",
            enqueued.len(),
            acked.len()
        ),
    }
}
