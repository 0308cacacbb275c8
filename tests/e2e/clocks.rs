//! A server whose clock runs 30 s ahead of the database's (libfaketime),
//! beside one whose clock is right, on one real PostgreSQL: every decision
//! reads the database's clock, so the skewed server enqueues no schedule
//! tick early, dates a schedule it creates by the database, and purges no
//! job younger than the retention.
//!
//! libfaketime is needed (Debian's `faketime` package; `.ci/run` installs
//! it): without it these tests fail, they are never skipped.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, SystemTime},
};

use jobq::pb;
use jobq_client::{Client, EnqueueOptions};
use jobq_server::store::postgres::testing;

use crate::harness::{until, ServerProcess};

/// How far ahead the skewed server's clock runs.
pub(crate) const AHEAD: Duration = Duration::from_secs(30);

/// Where Debian and others put libfaketime; `JOBQ_LIBFAKETIME` names
/// another.
const LIBFAKETIME: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
];

pub(crate) fn libfaketime() -> PathBuf {
    if let Some(given) = std::env::var_os("JOBQ_LIBFAKETIME") {
        return PathBuf::from(given);
    }
    LIBFAKETIME
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime is needed for the clock tests and was not found in {LIBFAKETIME:?}: \
                 install it with `apt-get install faketime` (.ci/run does), or name it in \
                 JOBQ_LIBFAKETIME"
            )
        })
}

/// `jobq serve` on `url` with its wall clock `AHEAD` of everyone else's
/// (its monotonic clock, which only measures intervals, is left alone).
async fn skewed_server(dir: &std::path::Path, url: &str, extra: &[&str]) -> ServerProcess {
    let lib = libfaketime();
    let mut args = vec!["--store", url, "--server-timeout", "2s"];
    args.extend_from_slice(extra);
    let server = ServerProcess::start_with(&dir.join("skewed"), "127.0.0.1:0", &args, |c| {
        c.env("LD_PRELOAD", &lib)
            .env("FAKETIME", format!("+{}s", AHEAD.as_secs()))
            .env("DONT_FAKE_MONOTONIC", "1");
    });
    assert_clock_ahead(&server).await;
    server
}

/// The skew took: `server`'s own log lines are dated about `AHEAD` ahead.
pub(crate) async fn assert_clock_ahead(server: &ServerProcess) {
    let line = until(Duration::from_secs(10), "the serving line", || async {
        server.first_logged("jobq serving")
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
        "libfaketime did not move the server's clock ahead (it logged {line:?})"
    );
}

fn plain_server(dir: &std::path::Path, url: &str, extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--store", url, "--server-timeout", "2s"];
    args.extend_from_slice(extra);
    ServerProcess::start(&dir.join("plain"), &args)
}

async fn database(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(connection);
    client
}

/// The database's clock.
async fn db_now(db: &tokio_postgres::Client) -> SystemTime {
    db.query_one("SELECT clock_timestamp()", &[])
        .await
        .expect("read the database's clock")
        .get(0)
}

fn time(t: Option<prost_types::Timestamp>) -> SystemTime {
    SystemTime::try_from(t.expect("a timestamp")).expect("a valid timestamp")
}

/// The tick a schedule job's key names (`schedule:<name>:<RFC 3339>`).
fn tick_of(job: &pb::Job) -> SystemTime {
    let at = job.key.rsplit(':').take(3).collect::<Vec<_>>();
    let at = format!("{}:{}:{}", at[2], at[1], at[0]);
    humantime::parse_rfc3339(&at).unwrap_or_else(|e| panic!("key {:?}: {e}", job.key))
}

async fn ticks(c: &Client) -> Vec<pb::Job> {
    c.list_jobs(pb::ListJobsRequest {
        queue: "ticks".into(),
        page_size: 1000,
        omit_payload: true,
        ..Default::default()
    })
    .await
    .expect("list")
    .jobs
}

/// Creates the schedule `pulse` (every 2 s, into queue `ticks`) through
/// `c`; returns it as answered, and the database's clock just before and
/// just after the call.
async fn create_pulse(
    c: &Client,
    db: &tokio_postgres::Client,
) -> (pb::Schedule, SystemTime, SystemTime) {
    let before = db_now(db).await;
    let created = c
        .inner()
        .create_schedule(pb::CreateScheduleRequest {
            name: "pulse".into(),
            queue: "ticks".into(),
            kind: "tick".into(),
            cron: "*/2 * * * * *".into(),
            ..Default::default()
        })
        .await
        .expect("create")
        .into_inner()
        .schedule
        .expect("the schedule");
    (created, before, db_now(db).await)
}

/// The first tick of `pulse` (every 2 s) after `t`.
fn first_tick_after(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs();
    SystemTime::UNIX_EPOCH + Duration::from_secs((secs / 2 + 1) * 2)
}

/// Waits until `n` ticks of `pulse` after `after` have their jobs (or one
/// job was enqueued before its tick), checks that every job was enqueued
/// once its tick was due by the database's clock, and returns the ticks
/// enqueued.
async fn expect_ticks_on_time(c: &Client, after: SystemTime, n: usize) -> Vec<SystemTime> {
    let first = first_tick_after(after);
    let jobs = until(Duration::from_secs(30), "ticks enqueued", || async {
        let jobs = ticks(c).await;
        // An early tick fails at once rather than after the wait.
        let early = jobs.iter().any(|j| time(j.enqueued_at) < tick_of(j));
        let since = jobs.iter().filter(|j| tick_of(j) >= first).count();
        (early || since >= n).then_some(jobs)
    })
    .await;
    for job in &jobs {
        let (tick, enqueued) = (tick_of(job), time(job.enqueued_at));
        assert!(
            enqueued >= tick,
            "tick {:?} was enqueued {:?} early (by the database's clock)",
            job.key,
            tick.duration_since(enqueued).unwrap_or_default()
        );
    }
    jobs.iter().map(tick_of).collect()
}

/// Both servers run the scheduler of a schedule created through the right
/// one: neither enqueues a tick before the database's clock reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_clock_runs_ahead_enqueues_no_tick_early() {
    let url = testing::fresh_database("jobq_clocks").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = plain_server(dir.path(), &url, &[]);
    let _skewed = skewed_server(dir.path(), &url, &[]).await;
    let db = database(&url).await;
    let c = plain.client().await;
    let (_, _, after) = create_pulse(&c, &db).await;
    expect_ticks_on_time(&c, after, 4).await;
}

/// A schedule created through the skewed server is dated by the
/// database's clock (stored and answered), and its first ticks after the
/// creation get their jobs, on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_clock_runs_ahead_dates_a_schedule_by_the_database() {
    let url = testing::fresh_database("jobq_clocks").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let _plain = plain_server(dir.path(), &url, &[]);
    let skewed = skewed_server(dir.path(), &url, &[]).await;
    let db = database(&url).await;
    let c = skewed.client().await;
    let (created, before, after) = create_pulse(&c, &db).await;
    let stored: SystemTime = db
        .query_one(
            "SELECT created_at FROM jobq_schedules WHERE name = 'pulse'",
            &[],
        )
        .await
        .expect("the stored schedule")
        .get(0);
    let slack = Duration::from_secs(1);
    for (what, at) in [("stored", stored), ("answered", time(created.created_at))] {
        assert!(
            at + slack >= before && at <= after + slack,
            "{what} created_at {at:?} is not within the database's clock during the call \
             ({before:?} .. {after:?})"
        );
    }
    // The first tick after the creation is not skipped as older than it.
    let enqueued = expect_ticks_on_time(&c, after, 2).await;
    let first = first_tick_after(after);
    assert!(
        enqueued.contains(&first),
        "the first tick after the creation, {first:?}, got no job: {enqueued:?}"
    );
}

/// DONE jobs finished 44 s and 100 s ago by the database's clock; the
/// skewed server starts with a retention of 60 s and purges at startup:
/// the 100 s one goes, the 44 s one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_clock_runs_ahead_purges_no_job_younger_than_the_retention() {
    let url = testing::fresh_database("jobq_clocks").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = plain_server(dir.path(), &url, &[]);
    let c = plain.client().await;
    let mut done = Vec::new();
    for age in [44, 100] {
        let (job, _) = c
            .enqueue("q", "k", vec![], EnqueueOptions::new())
            .await
            .expect("enqueue");
        let leased = c
            .dequeue(["q"], "w", None, None)
            .await
            .expect("dequeue")
            .expect("due");
        c.ack(&job.id, leased.lease_id).await.expect("ack");
        done.push((job.id, age));
    }
    let db = database(&url).await;
    for (id, age) in &done {
        let id: i64 = id.parse().expect("a numeric job id");
        let age = f64::from(*age);
        let n = db
            .execute(
                "UPDATE jobq_jobs SET \
                 enqueued_at = now() - make_interval(secs => $2::float8 + 1), \
                 run_at = now() - make_interval(secs => $2::float8 + 1), \
                 finished_at = now() - make_interval(secs => $2::float8) WHERE id = $1",
                &[&id, &age],
            )
            .await
            .expect("date the job back");
        assert_eq!(n, 1);
    }

    let _skewed = skewed_server(dir.path(), &url, &["--retain-done", "60s"]).await;
    let (young, old) = (done[0].0.clone(), done[1].0.clone());
    until(
        Duration::from_secs(30),
        "the job finished 100 s ago purged",
        || {
            let (c, old) = (c.clone(), old.clone());
            async move {
                let gone = c.get_job(old).await.err()?;
                assert_eq!(gone.code(), Some(tonic::Code::NotFound), "{gone}");
                Some(())
            }
        },
    )
    .await;
    let kept = c
        .get_job(young)
        .await
        .expect("the job finished 44 s ago, under a 60 s retention, is kept");
    assert_eq!(kept.status, pb::JobStatus::Done as i32);
}

/// libfaketime is what these tests stand on: it must work here.
#[test]
fn libfaketime_moves_a_processs_clock() {
    let out = Command::new("date")
        .arg("+%s")
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", "+1d")
        .output()
        .expect("run date");
    let faked: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("date +%s");
    let real = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs();
    assert!(faked > real + 80_000, "faked {faked}, real {real}");
}
