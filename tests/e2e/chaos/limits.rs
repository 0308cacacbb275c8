//! The fault suite's queue policy: its queue runs at most [`MAX_RUNNING`]
//! jobs at once, over every server, and at most [`GROUP_MAX_RUNNING`] of
//! one group (docs/src/design.md §1 rule 7). Judged from the attempts the
//! store recorded (on PostgreSQL stamped by the database's clock, one
//! clock for the three servers; on sled by its one server's), through
//! kills, freezes and restarts: at no instant did more run.
//!
//! On sled, a take that a server kill cuts short before it was durable is
//! undone (docs/src/design.md §5): its worker may still run the job while
//! the restarted server counts it PENDING. Such a run is not in the
//! record, so this judges what the store promised, not every run.

#[allow(unused_imports)]
use super::*;

/// The policy of the suite's queue.
pub(super) const MAX_RUNNING: u32 = 6;
pub(super) const GROUP_MAX_RUNNING: u32 = 2;
/// The groups the producers spread their jobs over.
pub(super) const GROUPS: usize = 7;

/// Two changes applied in turn may carry stamps a little out of that
/// order (a clock read before a lock, on a loaded 2-core machine): an
/// overlap shorter than this is that, not two runs at once.
const STAMP_SLACK: u64 = 100_000_000;

/// Sets the suite's policy on `queue` through `client`, trying for a while
/// (a server may still be starting).
pub(super) async fn set_policy(client: &Client) {
    let policy = jobq_client::QueuePolicy::new()
        .max_running(MAX_RUNNING)
        .group_max_running(GROUP_MAX_RUNNING);
    for _ in 0..50 {
        if client.set_queue_policy(QUEUE, policy).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("cannot set the queue's policy");
}

/// One recorded run: its group, start and end (ns).
pub(super) struct Run<'a> {
    pub(super) group: &'a str,
    pub(super) started: u64,
    pub(super) ended: u64,
}

/// The most runs at one instant, counting a run from its start (plus the
/// slack) to its end.
fn most_at_once<'a>(runs: impl Iterator<Item = &'a Run<'a>>) -> usize {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for r in runs {
        let start = r.started + STAMP_SLACK;
        if start < r.ended {
            edges.push((start, 1));
            edges.push((r.ended, -1));
        }
    }
    // An end and a start at one instant: the end first.
    edges.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// The violations of the policy in `runs` (`what` names the store), and a
/// summary.
pub(super) fn check_limits(what: &str, runs: &[Run<'_>]) -> (Vec<String>, String) {
    let mut bad = Vec::new();
    let most = most_at_once(runs.iter());
    if most > MAX_RUNNING as usize {
        bad.push(format!(
            "{what}: {most} jobs ran at once; max_running is {MAX_RUNNING}"
        ));
    }
    let mut groups: BTreeMap<&str, Vec<&Run<'_>>> = BTreeMap::new();
    for r in runs {
        groups.entry(r.group).or_default().push(r);
    }
    let mut most_of_one = 0;
    for (group, runs) in &groups {
        let n = most_at_once(runs.iter().copied());
        most_of_one = most_of_one.max(n);
        if n > GROUP_MAX_RUNNING as usize {
            bad.push(format!(
                "{what}: {n} jobs of group {group} ran at once; group_max_running is {GROUP_MAX_RUNNING}"
            ));
        }
    }
    (
        bad,
        format!(
            "{what}: at most {most} ran at once (max_running {MAX_RUNNING}), {most_of_one} of one group ({GROUP_MAX_RUNNING})"
        ),
    )
}
