//! Schedules end to end: a `*/1 * * * * *` schedule makes about
//! one job a second, with no tick enqueued twice across a SIGKILL and a
//! restart of the server, and deleting it stops it; bad input is refused.

use std::time::Duration;

use jobq::pb;
use jobq_client::Client;
use tonic::Code;

use crate::harness::{until, ServerProcess};

const QUEUE: &str = "ticks";

/// Every scheduled job of QUEUE as (tick in seconds since the epoch, key),
/// sorted by tick.
async fn ticks(c: &Client) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .list_jobs(pb::ListJobsRequest {
                queue: QUEUE.into(),
                page_size: 1000,
                page_token: page_token.clone(),
                omit_payload: true,
                ..Default::default()
            })
            .await
            .expect("list");
        for job in page.jobs {
            let at = job
                .key
                .strip_prefix("schedule:every-second:")
                .unwrap_or_else(|| panic!("unexpected key {:?}", job.key));
            let tick = chrono::DateTime::parse_from_rfc3339(at)
                .unwrap_or_else(|e| panic!("key {:?}: {e}", job.key));
            assert_eq!(tick.timestamp_subsec_nanos(), 0, "{}", job.key);
            assert_eq!(
                job.metadata.get("jobq-schedule").map(String::as_str),
                Some("every-second")
            );
            out.push((tick.timestamp(), job.key));
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    out.sort();
    out
}

async fn count_at_least(c: &Client, n: usize) -> Vec<(i64, String)> {
    until(
        Duration::from_secs(30),
        &format!("{n} scheduled jobs"),
        || async {
            let t = ticks(c).await;
            (t.len() >= n).then_some(t)
        },
    )
    .await
}

#[tokio::test]
async fn every_second_across_a_sigkill_without_duplicates_and_delete_stops_it() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(data.path(), &[]);
    let c = server.client().await;
    // The typed client's calls (jobq_client::Schedule back).
    let created = c
        .create_schedule(
            "every-second",
            QUEUE,
            "tick",
            b"{}".to_vec(),
            "*/1 * * * * *",
            None,
            2,
        )
        .await
        .expect("create");
    assert_eq!(created.timezone, "UTC");
    let next = created
        .next_run_at
        .expect("next run")
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((now..=now + 2).contains(&next), "next {next}, now {now}");

    let before = count_at_least(&c, 4).await;
    server.kill9();
    let server = ServerProcess::start_at(data.path(), &server.addr.to_string(), &[]);
    let c = server.client().await;
    let after = count_at_least(&c, before.len() + 4).await;

    // Every job is one tick: distinct keys, distinct whole seconds.
    let mut keys: Vec<&String> = after.iter().map(|(_, k)| k).collect();
    keys.dedup();
    assert_eq!(
        keys.len(),
        after.len(),
        "a tick was enqueued twice: {after:?}"
    );
    assert!(after.windows(2).all(|w| w[0].0 < w[1].0), "{after:?}");
    // About one a second: the ticks are consecutive seconds but for the
    // restart (whose missed ticks are skipped but the latest) and, on a
    // loaded machine, a late wake-up or two (which skips the same way).
    let gaps: Vec<i64> = after.windows(2).map(|w| w[1].0 - w[0].0).collect();
    let ones = gaps.iter().filter(|&&g| g == 1).count();
    assert!(
        ones + 3 >= gaps.len(),
        "ticks should be consecutive seconds but for the restart: gaps {gaps:?}"
    );
    let span = after.last().unwrap().0 - after[0].0 + 1;
    assert!(
        after.len() as i64 <= span && after.len() as i64 >= span / 2,
        "{} jobs over {span} s",
        after.len()
    );
    // The jobs carry the schedule's kind, payload and attempts.
    let listed = c.list_schedules().await.expect("list schedules");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].kind.as_str(), listed[0].max_attempts),
        ("tick", 2)
    );
    assert!(listed[0].last_run_at.is_some() && listed[0].next_run_at.is_some());

    c.delete_schedule("every-second").await.expect("delete");
    let at_delete = ticks(&c).await.len();
    // An observation window: once the delete has returned, the deleted
    // schedule makes nothing more, not even a tick the scheduler's pass
    // had read it for.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let later = ticks(&c).await.len();
    assert_eq!(later, at_delete, "jobs after the delete returned");
    assert!(c.list_schedules().await.expect("list").is_empty());
}

#[tokio::test]
async fn bad_schedules_are_invalid_and_unknown_ones_not_found() {
    let data = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(data.path(), &[]);
    let c = server.client().await;
    let ok = pb::CreateScheduleRequest {
        name: "nightly".into(),
        queue: "reports".into(),
        kind: "build-report".into(),
        cron: "0 3 * * *".into(),
        timezone: "Europe/Berlin".into(),
        ..Default::default()
    };
    for bad in [
        pb::CreateScheduleRequest {
            cron: "0 3 * *".into(),
            ..ok.clone()
        },
        pb::CreateScheduleRequest {
            cron: "every day".into(),
            ..ok.clone()
        },
        pb::CreateScheduleRequest {
            timezone: "Europe/Atlantis".into(),
            ..ok.clone()
        },
        pb::CreateScheduleRequest {
            name: "no spaces".into(),
            ..ok.clone()
        },
        pb::CreateScheduleRequest {
            queue: String::new(),
            ..ok.clone()
        },
    ] {
        let err = c
            .inner()
            .create_schedule(bad.clone())
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err}");
    }
    let none = c
        .inner()
        .list_schedules(pb::ListSchedulesRequest {})
        .await
        .unwrap();
    assert!(
        none.into_inner().schedules.is_empty(),
        "bad input stored nothing"
    );
    let err = c
        .inner()
        .delete_schedule(pb::DeleteScheduleRequest {
            name: "nightly".into(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), Code::NotFound);
    let s = c
        .inner()
        .create_schedule(ok)
        .await
        .unwrap()
        .into_inner()
        .schedule
        .unwrap();
    assert_eq!(s.timezone, "Europe/Berlin");
    // 03:00 in Berlin is 01:00 or 02:00 UTC.
    let next = s.next_run_at.unwrap().seconds;
    assert!(
        matches!(next.rem_euclid(86_400), 3_600 | 7_200),
        "next run {next}"
    );
}

/// `--max-schedules` holds when creates race: each one sees the others.
#[tokio::test]
async fn concurrent_creates_stay_within_max_schedules() {
    let data = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(data.path(), &["--max-schedules", "3"]);
    let c = server.client().await;
    let creates = (0..12).map(|i| {
        let mut c = c.inner();
        async move {
            c.create_schedule(pb::CreateScheduleRequest {
                name: format!("nightly-{i}"),
                queue: "reports".into(),
                kind: "build-report".into(),
                cron: "0 3 * * *".into(),
                ..Default::default()
            })
            .await
        }
    });
    let results = futures::future::join_all(creates).await;
    let created = results.iter().filter(|r| r.is_ok()).count();
    let refused: Vec<Code> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(tonic::Status::code))
        .collect();
    assert_eq!(created, 3, "{results:?}");
    assert!(
        refused.iter().all(|&code| code == Code::ResourceExhausted),
        "{refused:?}"
    );
    assert_eq!(c.list_schedules().await.expect("list").len(), 3);
}
