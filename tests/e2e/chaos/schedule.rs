//! The fault suite's schedule: `chaos-pulse` enqueues a job every 2 s into
//! a queue nobody consumes, through all the faults. Every tick is one job
//! (its key names the tick, docs/src/design.md §2), enqueued no earlier
//! than its tick by the database's clock (§5: whatever the clock of the
//! server that enqueued it, one of them 30 s ahead). A tick may be missing
//! only where no server could run the scheduler: around a PostgreSQL
//! restart, after which only the latest missed tick is enqueued.

#[allow(unused_imports)]
use super::*;

pub(super) const TICKS: &str = "chaos-ticks";
const EVERY: Duration = Duration::from_secs(2);

/// A tick's job, as the database holds it.
pub(super) struct Tick {
    pub(super) key: String,
    pub(super) enqueued: SystemTime,
}

/// Creates the schedule through the first server that answers; the
/// database's clock just before.
pub(super) async fn create_pulse(urls: &[String], db: &tokio_postgres::Client) -> SystemTime {
    let created = db
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .expect("read the database's clock")
        .get(0);
    until(Duration::from_secs(30), "CreateSchedule", || async {
        for url in urls {
            let client = Client::connect_lazy(url.clone()).ok()?;
            let made = client
                .create_schedule(
                    "chaos-pulse",
                    TICKS,
                    "tick",
                    Vec::new(),
                    "*/2 * * * * *",
                    None,
                    1,
                )
                .await;
            if made.is_ok() {
                return Some(());
            }
        }
        None
    })
    .await;
    created
}

pub(super) async fn ticks(db: &tokio_postgres::Client) -> Vec<Tick> {
    db.query(
        "SELECT key, enqueued_at FROM jobq_jobs WHERE queue = $1",
        &[&TICKS],
    )
    .await
    .expect("read the ticks")
    .into_iter()
    .map(|r| Tick {
        key: r.get(0),
        enqueued: r.get(1),
    })
    .collect()
}

/// The tick a schedule job's key names (`schedule:<name>:<RFC 3339>`).
fn tick_of(key: &str) -> Option<SystemTime> {
    let at = key.splitn(3, ':').nth(2)?;
    humantime::parse_rfc3339(at).ok()
}

fn unix_ns(t: SystemTime) -> u64 {
    u64::try_from(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    )
    .unwrap_or(0)
}

/// Every tick of `from..to` once, none early, a gap only around a
/// PostgreSQL restart; the violations and a summary.
pub(super) fn check_ticks(
    ticks: &[Tick],
    from: SystemTime,
    to: SystemTime,
    faults: &[Fault],
    origin: u64,
) -> (Vec<String>, String) {
    let mut bad = Vec::new();
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut late = Duration::ZERO;
    for t in ticks {
        let Some(tick) = tick_of(&t.key) else {
            bad.push(format!("schedule: a job of {TICKS} with key {:?}", t.key));
            continue;
        };
        *seen.entry(unix_ns(tick)).or_default() += 1;
        match t.enqueued.duration_since(tick) {
            Ok(after) => late = late.max(after),
            Err(early) => bad.push(format!(
                "schedule: tick {} enqueued {:?} early (by the database's clock)",
                t.key,
                early.duration()
            )),
        }
    }
    for (tick, n) in &seen {
        if *n > 1 {
            bad.push(format!(
                "schedule: the tick at {:.3}s enqueued {n} times",
                secs(*tick, origin)
            ));
        }
    }
    // The ticks due from the first after `from` to `to`.
    let every = EVERY.as_nanos() as u64;
    let outage = (SERVER_TIMEOUT + Duration::from_secs(2)).as_nanos() as u64;
    let (mut expected, mut excused) = (0, 0);
    let mut tick = (unix_ns(from) / every + 1) * every;
    while tick <= unix_ns(to) {
        expected += 1;
        if !seen.contains_key(&tick) {
            let restart = faults
                .iter()
                .any(|f| f.pg_restart && f.from <= tick + every && f.to + outage >= tick);
            if restart {
                excused += 1;
            } else {
                bad.push(format!(
                    "schedule: no job for the tick at {:.3}s, and PostgreSQL was not \
                     restarted around it",
                    secs(tick, origin)
                ));
            }
        }
        tick += every;
    }
    let summary = format!(
        "schedule: {expected} ticks due, {} enqueued, {excused} missed around PostgreSQL \
         restarts, the latest {late:?} after its tick",
        ticks.len()
    );
    (bad, summary)
}

/// The tick checker on made-up ticks: a clean run passes, and an early,
/// a repeated and a missing tick are each reported (a missing one is
/// excused by a PostgreSQL restart around it).
#[test]
fn chaos_tick_checker_reports_each_broken_promise() {
    let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let tick = |s: u64, late_ms: u64| Tick {
        key: format!("schedule:chaos-pulse:{}", humantime::format_rfc3339(at(s))),
        enqueued: at(s) + Duration::from_millis(late_ms),
    };
    // Every 2 s from 1000 s to 1010 s.
    let clean: Vec<Tick> = (0..6).map(|i| tick(1000 + 2 * i, 100)).collect();
    let (bad, _) = check_ticks(&clean, at(999), at(1010), &[], 0);
    assert!(bad.is_empty(), "{bad:?}");

    let mut early: Vec<Tick> = (0..6).map(|i| tick(1000 + 2 * i, 100)).collect();
    early[2].enqueued = at(1004) - Duration::from_millis(1);
    early.push(tick(1006, 300));
    let (bad, _) = check_ticks(&early, at(999), at(1010), &[], 0);
    let all = bad.join("\n");
    assert!(all.contains("enqueued 1ms early"), "{all}");
    assert!(
        all.contains("the tick at 1006.000s enqueued 2 times"),
        "{all}"
    );
    assert_eq!(bad.len(), 2, "{all}");

    let missing: Vec<Tick> = (0..6)
        .filter(|&i| i != 3)
        .map(|i| tick(1000 + 2 * i, 100))
        .collect();
    let (bad, _) = check_ticks(&missing, at(999), at(1010), &[], 0);
    assert!(
        bad.len() == 1 && bad[0].contains("no job for the tick at 1006.000s"),
        "{bad:?}"
    );
    let s = 1_000_000_000;
    let restart = Fault {
        what: "pg_ctl restart -m fast".into(),
        server: false,
        slot: None,
        pg_restart: true,
        from: 1005 * s,
        to: 1006 * s,
    };
    let (bad, _) = check_ticks(&missing, at(999), at(1010), &[restart], 0);
    assert!(bad.is_empty(), "{bad:?}");
}
