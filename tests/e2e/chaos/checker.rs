//! The fault suite's checker: the workers' histories and the final
//! database against the promises.

#[allow(unused_imports)]
use super::*;

#[derive(Debug, Clone)]
pub(super) struct Line {
    pub(super) t: u64,
    pub(super) worker: String,
    pub(super) event: String,
    pub(super) job: String,
    pub(super) lease: String,
    pub(super) extra: String,
}

pub(super) fn read_history(worker: &str, path: &Path) -> Vec<Line> {
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

pub(super) struct Attempt {
    pub(super) job: String,
    pub(super) lease: String,
    pub(super) worker: String,
    pub(super) started: u64,
    pub(super) ended: u64,
    pub(super) outcome: String,
    /// The job's group.
    pub(super) group: String,
}

pub(super) struct Final {
    /// Job id → status.
    pub(super) status: HashMap<String, String>,
    pub(super) attempts: Vec<Attempt>,
}

pub(super) async fn final_state(db: &tokio_postgres::Client) -> Final {
    let status = db
        .query(
            "SELECT id::text, status FROM jobq_jobs WHERE queue = $1",
            &[&QUEUE],
        )
        .await
        .expect("read the jobs")
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let attempts = db
        .query(
            "SELECT a.job_id::text, a.lease_id, a.worker_id, \
                    (extract(epoch FROM a.started_at) * 1e6)::int8, \
                    (extract(epoch FROM coalesce(a.ended_at, a.started_at)) * 1e6)::int8, \
                    coalesce(a.outcome, ''), coalesce(j.grp, '') \
             FROM jobq_attempts a JOIN jobq_jobs j ON j.id = a.job_id WHERE j.queue = $1",
            &[&QUEUE],
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
            group: r.get(6),
        })
        .collect();
    Final { status, attempts }
}

/// Every promise, checked against the histories and the final database;
/// returns the violations and a summary.
pub(super) fn check(
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
