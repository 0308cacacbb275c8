//! The fault suite's timing promises, from the workers' histories and the
//! attempts in the database:
//!
//! - a SIGKILLed worker's Lease streams drop with it, and its jobs are due
//!   again at once (docs/src/design.md §3, stream drop): every attempt it
//!   held ends within [`WORKER_GONE_WITHIN`] of the kill;
//! - a dead server's stream leases are reclaimed within `--server-timeout`
//!   plus one heartbeat tick (design.md §5, many servers): every lease a
//!   worker held through a server when it was killed, frozen or cut off
//!   from PostgreSQL ends within [`SERVER_GONE_WITHIN`], unless its worker
//!   declared it on a new stream first (then a live server holds it).
//!
//! A promise is not held where another fault delays what keeps it: a
//! server fault or a PostgreSQL restart (after which no server judges
//! another for a whole timeout) around the time it runs. Those are counted
//! apart.

#[allow(unused_imports)]
use super::*;

/// 1 s, as promised, and 0.5 s of slack: the kill's time is read before
/// SIGKILL is sent, and the server must be scheduled to read the closed
/// connection and commit the reclaim (one fsync) on a 2-core machine
/// that runs the whole suite.
pub(super) const WORKER_GONE_WITHIN: Duration = Duration::from_millis(1500);
/// `--server-timeout` + 1 s (one heartbeat tick, a fifth of the timeout,
/// and the reclaim's transaction), and the same 0.5 s of slack.
pub(super) const SERVER_GONE_WITHIN: Duration =
    Duration::from_millis(SERVER_TIMEOUT.as_millis() as u64 + 1500);

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Whether a fault other than `except` that delays reclaims (a server
/// fault, a PostgreSQL restart) touches `from..=to`.
fn disturbed(faults: &[Fault], except: Option<usize>, from: u64, to: u64) -> bool {
    faults.iter().enumerate().any(|(i, f)| {
        Some(i) != except
            && (f.server || f.pg_restart)
            // A restart silences every server's judgement for a timeout
            // after it.
            && f.from <= to
            && f.to + ns(SERVER_TIMEOUT) + ns(Duration::from_secs(1)) >= from
    })
}

/// The timing promises; the violations and a summary.
pub(super) fn check_timing(
    lines: &[Line],
    killed: &HashMap<String, u64>,
    faults: &[Fault],
    fin: &Final,
    origin: u64,
) -> (Vec<String>, String) {
    let mut bad = Vec::new();

    // A killed worker's attempts.
    let (mut on_time, mut disturbed_kills, mut worst) = (0, 0, 0u64);
    for a in &fin.attempts {
        let Some(&k) = killed.get(&a.worker) else {
            continue;
        };
        if a.outcome == "acked" || a.started > k || (a.ended < k && !a.outcome.is_empty()) {
            continue;
        }
        let within = k + ns(WORKER_GONE_WITHIN);
        if disturbed(faults, None, k.saturating_sub(ns(SERVER_TIMEOUT)), within) {
            disturbed_kills += 1;
            continue;
        }
        worst = worst.max(a.ended.saturating_sub(k));
        if a.outcome.is_empty() || a.ended > within {
            bad.push(format!(
                "job {}: worker {} was killed at {:.3}s, and its attempt under lease {} ended \
                 {} at {:.3}s, not within {WORKER_GONE_WITHIN:?}",
                a.job,
                a.worker,
                secs(k, origin),
                a.lease,
                if a.outcome.is_empty() {
                    "never"
                } else {
                    &a.outcome
                },
                secs(a.ended, origin)
            ));
        } else {
            on_time += 1;
        }
    }

    // What each worker held through which server when a server fault
    // began: walk each worker's history in time order beside the faults.
    let mut by_worker: HashMap<&str, Vec<&Line>> = HashMap::new();
    for l in lines {
        by_worker.entry(&l.worker).or_default().push(l);
    }
    let mut struck: Vec<(usize, &Fault)> = faults
        .iter()
        .enumerate()
        .filter(|(_, f)| f.slot.is_some() && f.server_gone())
        .collect();
    struck.sort_by_key(|(_, f)| f.from);
    let attempt_of: HashMap<(&str, &str), &Attempt> = fin
        .attempts
        .iter()
        .map(|a| ((a.job.as_str(), a.lease.as_str()), a))
        .collect();
    let (mut reclaimed, mut declared, mut disturbed_servers, mut late) = (0, 0, 0, 0u64);
    for (worker, history) in &mut by_worker {
        history.sort_by_key(|l| l.t);
        let streams: Vec<u64> = history
            .iter()
            .filter(|l| l.event == "stream")
            .map(|l| l.t)
            .collect();
        // Job → (lease, the slot of the stream that holds it).
        let mut held: HashMap<&str, (&str, usize)> = HashMap::new();
        let mut next = 0;
        for &(i, f) in &struck {
            while next < history.len() && history[next].t <= f.from {
                let l = history[next];
                next += 1;
                match l.event.as_str() {
                    "leased" => {
                        let slot = l.extra.parse().unwrap_or(usize::MAX);
                        held.insert(&l.job, (&l.lease, slot));
                    }
                    "stream" => {
                        let slot = l.extra.parse().unwrap_or(usize::MAX);
                        for h in held.values_mut() {
                            h.1 = slot;
                        }
                    }
                    "acked" | "ack_refused" | "lost" | "revoked" | "ack_abandoned"
                        if held.get(l.job.as_str()).is_some_and(|h| h.0 == l.lease) =>
                    {
                        held.remove(l.job.as_str());
                    }
                    _ => {}
                }
            }
            let slot = f.slot.expect("a server fault's slot");
            let deadline = f.from + ns(SERVER_GONE_WITHIN);
            if killed.get(*worker).is_some_and(|&k| k <= deadline) {
                continue;
            }
            for (&job, &(lease, s)) in &held {
                if s != slot {
                    continue;
                }
                let Some(a) = attempt_of.get(&(job, lease)) else {
                    continue;
                };
                if !a.outcome.is_empty() && a.ended < f.from {
                    continue;
                }
                if !a.outcome.is_empty() && a.ended <= deadline {
                    reclaimed += 1;
                    late = late.max(a.ended - f.from);
                    continue;
                }
                if streams.iter().any(|&t| t > f.from && t <= deadline) {
                    declared += 1;
                    continue;
                }
                if disturbed(faults, Some(i), f.from, deadline) {
                    disturbed_servers += 1;
                    continue;
                }
                bad.push(format!(
                    "job {job}: lease {lease} of worker {worker} was held through server \
                     {slot} when it began \"{}\" at {:.3}s; it ended {} at {:.3}s, not within \
                     {SERVER_GONE_WITHIN:?}, and the worker opened no stream to declare it",
                    f.what,
                    secs(f.from, origin),
                    if a.outcome.is_empty() {
                        "never"
                    } else {
                        &a.outcome
                    },
                    secs(a.ended, origin)
                ));
            }
        }
    }
    let summary = format!(
        "timing: {on_time} attempts of killed workers ended in time (the slowest {:.3}s after \
         the kill), {disturbed_kills} beside other faults; of the leases held through a \
         stricken server, {reclaimed} ended in time (the slowest {:.3}s after), {declared} \
         declared anew by their worker, {disturbed_servers} beside other faults",
        worst as f64 / 1e9,
        late as f64 / 1e9,
    );
    (bad, summary)
}
