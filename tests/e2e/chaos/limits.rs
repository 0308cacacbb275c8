//! The fault suite's queue policy: its queue runs at most
//! [`max_running`] jobs at once (6; 12 in the long profile, whose
//! producers enqueue 1.7 times as fast), over every server, and at most [`GROUP_MAX_RUNNING`] of
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

/// The policy of the suite's queue: `max_running`, room for the profile's
/// pace beside its faults, below its workers' slots (16 in CI, 24 in the
/// long profile) so that it binds.
pub(super) fn max_running() -> u32 {
    if profile().name == "long" {
        12
    } else {
        6
    }
}
pub(super) const GROUP_MAX_RUNNING: u32 = 2;
/// The groups the producers spread their jobs over.
pub(super) const GROUPS: usize = 7;

/// Two changes applied in turn may carry stamps a little out of that
/// order: an ack's end stamped after the take it made room for began. On
/// PostgreSQL a take of a limited queue is stamped when it counted the
/// running jobs under the policy lock, and an ack with its transaction's
/// start (before it committed, so before that count saw it), so an end is
/// never late; allow 10 ms. sled reads its clock before its lock, so a take that
/// waited for the lock is stamped before the ack that went first; allow
/// 50 ms.
pub(super) const PG_SLACK: u64 = 10_000_000;
pub(super) const SLED_SLACK: u64 = 50_000_000;

/// Sets the suite's policy on `queue` through `client`, trying for a while
/// (a server may still be starting).
pub(super) async fn set_policy(client: &Client) {
    let policy = jobq_client::QueuePolicy::new()
        .max_running(max_running())
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

/// The most runs at one instant, and the first instant with that many: at
/// each run's start, that run and every other begun by then and still
/// running `slack` later (so a run of any length counts, and an end
/// stamped up to `slack` late does not).
fn most_at_once(runs: &[&Run<'_>], slack: u64) -> (usize, u64) {
    use std::{cmp::Reverse, collections::BinaryHeap};
    let mut by_start: Vec<&Run<'_>> = runs.to_vec();
    by_start.sort_by_key(|r| r.started);
    // The ends of the runs begun so far that are still open `slack` after
    // the current start (an end gone by one start is gone by every later
    // one).
    let mut open: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    let (mut most, mut when) = (0, 0);
    for same in by_start.chunk_by(|a, b| a.started == b.started) {
        let at = same[0].started + slack;
        open.extend(same.iter().map(|r| Reverse(r.ended)));
        while open.peek().is_some_and(|&Reverse(end)| end <= at) {
            open.pop();
        }
        // A run starting here counts itself even if it ends within the
        // slack.
        let short = same.iter().any(|r| r.ended <= at);
        let now = open.len() + usize::from(short);
        if now > most {
            (most, when) = (now, same[0].started);
        }
    }
    (most, when)
}

/// The violations of the policy in `runs` (`what` names the store), and a
/// summary.
pub(super) fn check_limits(what: &str, runs: &[Run<'_>], slack: u64) -> (Vec<String>, String) {
    let mut bad = Vec::new();
    let all: Vec<&Run<'_>> = runs.iter().collect();
    let (most, when) = most_at_once(&all, slack);
    let max_running = max_running();
    if most > max_running as usize {
        bad.push(format!(
            "{what}: {most} jobs ran at once (at {when} ns past the epoch); max_running is {max_running}"
        ));
    }
    let mut groups: BTreeMap<&str, Vec<&Run<'_>>> = BTreeMap::new();
    for r in runs {
        groups.entry(r.group).or_default().push(r);
    }
    let mut most_of_one = 0;
    for (group, runs) in &groups {
        let (n, when) = most_at_once(runs, slack);
        most_of_one = most_of_one.max(n);
        if n > GROUP_MAX_RUNNING as usize {
            bad.push(format!(
                "{what}: {n} jobs of group {group} ran at once (at {when} ns past the epoch); \
                 group_max_running is {GROUP_MAX_RUNNING}"
            ));
        }
    }
    (
        bad,
        format!(
            "{what}: at most {most} ran at once (max_running {max_running}), {most_of_one} of one group ({GROUP_MAX_RUNNING})"
        ),
    )
}
