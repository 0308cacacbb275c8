//! Fuzzes the gRPC service with random and hostile requests (docs/src/design.md §2):
//! "Bad input never panics the server and never changes stored state."
//!
//! Each proptest case opens a real sled store in a temp dir, builds the real
//! `JobQueueService` and calls its `JobQueue` trait methods directly (no
//! transport), interleaving hostile requests with valid ones so that there
//! are real jobs and leases to hit. After every call it checks:
//!
//! 1. nothing panicked, on the calling task or on a spawned one (a panic
//!    hook counts every panic in the process);
//! 2. the status code is one §2 allows for that RPC, never INTERNAL or
//!    UNKNOWN;
//! 3. a request this test knows is malformed gets INVALID_ARGUMENT, and a
//!    well-formed one never does;
//! 4. a rejected call (any error code) left the store exactly as it was:
//!    every job (all ListJobs pages) and Stats, before and after;
//! 5. the store is self-consistent: Stats agrees with ListJobs, attempts
//!    never exceed max_attempts, nor snoozes max_snoozes.
//!
//! The runtime is current-thread and the reaper is not running, so between
//! the two snapshots around a call nothing but the call itself can touch
//! the store.
//!
//! A second property (`hostile_auth_headers_…`) runs the service behind
//! its token interceptor with random `authorization` headers: missing,
//! malformed, non-ASCII, unknown secrets, and known tokens used outside
//! their roles and queues. A bad header is always UNAUTHENTICATED, a token
//! outside its scope PERMISSION_DENIED (NOT_FOUND for a job it names by id
//! in a queue it may not read), and neither changes the store. Lease streams are dropped, and their task waited for (see
//! `quiesce`), before the next call.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, LazyLock, Once,
    },
    time::Duration,
};

use jobq::pb::{self, job_queue_server::JobQueue, lease_event::Event};
use jobq_server::{
    auth::{digest_hex, Auth, Caller, Tokens},
    leases::LeaseHub,
    service::JobQueueService,
    store::sled::SledStore,
    validate::{DEFAULT_PAGE_SIZE, MAX_NAME_LEN, MAX_PAGE_SIZE, MAX_QUEUES},
    Config,
};
use proptest::{prelude::*, sample::select, test_runner::TestCaseError};
use tempfile::TempDir;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Status};

type Svc = JobQueueService<SledStore>;
type Checked = Result<(), TestCaseError>;

/// Every panic anywhere in this process, including tokio tasks (whose
/// panics tokio catches and would otherwise only report to a JoinHandle
/// nobody holds).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// A queue no generated job can land in: the quiesce probe dequeues from it.
const PROBE_QUEUE: &str = "zz.fuzz-probe.never-enqueued";

fn config(data: &std::path::Path) -> Config {
    let mut c = Config::with_data(data);
    c.min_lease = Duration::from_millis(10);
    c.cache_bytes = 8 * 1024 * 1024;
    // The limit is checked the same way at any size; payloads at a 1 MiB
    // limit would make every snapshot of a debug build slow.
    c.max_payload = 16 * 1024;
    c.max_metadata_bytes = 256;
    c.max_result_bytes = 1024;
    // One waiter: a live Lease stream makes a waiting Dequeue
    // RESOURCE_EXHAUSTED, which `quiesce` uses to see the stream's task end.
    c.max_waiters = 1;
    // Few, so that runs reach the cap: pausing a third queue is
    // RESOURCE_EXHAUSTED, pausing a paused one stays OK.
    c.max_paused_queues = 2;
    c.max_queue_policies = 2;
    c
}

/// The limits the generators aim at (the same config, minus the folder).
static LIMITS: LazyLock<Config> = LazyLock::new(|| config("unused".as_ref()));

// ---------------------------------------------------------------------------
// What the test expects of a request.

/// Whether a request is well-formed by the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum V {
    Valid,
    Invalid,
}

fn all(vs: impl IntoIterator<Item = V>) -> V {
    vs.into_iter().max().unwrap_or(V::Valid)
}

fn bad_if(cond: bool) -> V {
    if cond {
        V::Invalid
    } else {
        V::Valid
    }
}

/// queue, kind, key, worker id: 1..=`MAX_NAME_LEN` of `[A-Za-z0-9._:-]`.
fn name_v(s: &str) -> V {
    bad_if(
        s.is_empty()
            || s.len() > MAX_NAME_LEN
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')),
    )
}

/// An optional name: empty means none.
fn opt_name_v(s: &str) -> V {
    if s.is_empty() {
        V::Valid
    } else {
        name_v(s)
    }
}

/// A job or lease id: the canonical decimal form of a u64 (no leading
/// zeros, so an id reads back exactly as it was written).
fn id_v(s: &str) -> V {
    let canonical = s == "0" || !s.starts_with('0');
    bad_if(
        s.is_empty()
            || s.len() > 20
            || !canonical
            || !s.bytes().all(|b| b.is_ascii_digit())
            || s.parse::<u64>().is_err(),
    )
}

#[derive(Debug, Clone, Copy)]
enum DurKind {
    Lease,
    Delay,
    Wait,
}

fn dur_v(d: &Option<prost_types::Duration>, kind: DurKind) -> V {
    let Some(d) = d else { return V::Valid };
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return V::Invalid;
    }
    let d = Duration::new(d.seconds as u64, d.nanos as u32);
    let c = &*LIMITS;
    bad_if(match kind {
        DurKind::Lease => d < c.min_lease || d > c.max_lease,
        DurKind::Delay => d > c.max_delay,
        DurKind::Wait => d > c.max_wait,
    })
}

// ---------------------------------------------------------------------------
// Generators: valid values mixed with hostile ones.

const QUEUES: [&str; 3] = ["default", "emails", "a.b:c_d-1"];

const HOSTILE_NAMES: &[&str] = &[
    "",
    " ",
    "with space",
    "émails",
    "\0",
    "q\0",
    "\n",
    "tab\t",
    "q\u{202e}x",
    "🦀",
    "a/b",
    "../../etc/passwd",
    "'; DROP TABLE jobs;--",
    "\u{feff}default",
    "default\u{0301}",
    "ｄｅｆａｕｌｔ",
    "%00",
    "q*",
    "\u{7f}",
    "\u{1b}[31m",
];

const HOSTILE_IDS: &[&str] = &[
    "",
    "0",
    "1",
    "-1",
    "+1",
    " 1",
    "1 ",
    "1\n",
    "0x10",
    "1e3",
    "1.0",
    "١",
    "１",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "00000000000000000001",
    "000000000000000000001",
    "\0",
    "🦀",
];

fn name() -> BoxedStrategy<String> {
    prop_oneof![
        8 => select(&QUEUES[..]).prop_map(String::from),
        1 => Just("n".repeat(MAX_NAME_LEN)),
        1 => Just("n".repeat(129)),
        1 => "[A-Za-z0-9._:-]{1,140}",
        1 => any::<String>(),
        2 => select(HOSTILE_NAMES).prop_map(String::from),
        1 => (129usize..20_000).prop_map(|n| "x".repeat(n)),
    ]
    .boxed()
}

/// A name where empty means "none" (key, ListJobs/Stats filters).
fn opt_name() -> BoxedStrategy<String> {
    prop_oneof![3 => Just(String::new()), 1 => select(&["order-1", "order-2"][..]).prop_map(String::from), 3 => name()].boxed()
}

fn id_literal() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(HOSTILE_IDS).prop_map(String::from),
        1 => "[0-9]{1,25}",
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => (0u64..50).prop_map(|n| n.to_string()),
        1 => any::<String>(),
    ]
    .boxed()
}

fn secs(s: i64, n: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: s,
        nanos: n,
    })
}

fn just_dur(d: Duration) -> Option<prost_types::Duration> {
    secs(d.as_secs() as i64, d.subsec_nanos() as i32)
}

/// Durations for leases, delays and extensions: any value at all.
fn duration() -> BoxedStrategy<Option<prost_types::Duration>> {
    let c = &*LIMITS;
    let plus = |d: Duration| just_dur(d + Duration::from_nanos(1));
    prop_oneof![
        4 => Just(None),
        1 => Just(secs(0, 0)),
        2 => Just(secs(0, 10_000_000)),
        2 => Just(secs(0, 50_000_000)),
        1 => Just(secs(1, 0)),
        1 => Just(secs(-1, 0)),
        1 => Just(secs(0, -1)),
        1 => Just(secs(0, 1_000_000_000)),
        1 => Just(secs(1, i32::MAX)),
        1 => Just(secs(i64::MAX, 0)),
        1 => Just(secs(i64::MAX, 999_999_999)),
        1 => Just(secs(i64::MIN, 0)),
        1 => Just(just_dur(c.min_lease)),
        1 => Just(just_dur(c.min_lease - Duration::from_nanos(1))),
        1 => Just(just_dur(c.max_lease)),
        1 => Just(plus(c.max_lease)),
        1 => Just(just_dur(c.max_delay)),
        1 => Just(plus(c.max_delay)),
        2 => (any::<i64>(), any::<i32>()).prop_map(|(s, n)| secs(s, n)),
        1 => (0i64..100_000, 0i32..1_000_000_000).prop_map(|(s, n)| secs(s, n)),
    ]
    .boxed()
}

/// Dequeue waits: every valid one is at most 5ms, so the test stays fast.
fn wait() -> BoxedStrategy<Option<prost_types::Duration>> {
    let c = &*LIMITS;
    prop_oneof![
        6 => Just(None),
        2 => Just(secs(0, 0)),
        2 => Just(secs(0, 1_000_000)),
        1 => Just(secs(0, 5_000_000)),
        1 => Just(secs(-1, 0)),
        1 => Just(secs(0, -1)),
        1 => Just(secs(0, 1_000_000_000)),
        1 => Just(just_dur(c.max_wait + Duration::from_nanos(1))),
        1 => Just(secs(i64::MAX, 999_999_999)),
        1 => Just(secs(i64::MIN, -1)),
    ]
    .boxed()
}

fn payload() -> BoxedStrategy<Vec<u8>> {
    let max = LIMITS.max_payload;
    prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 0..64),
        1 => Just(vec![0xff; max - 1]),
        1 => Just(vec![0; max]),
        1 => Just(vec![7; max + 1]),
        1 => Just(vec![0; 4 * max]),
    ]
    .boxed()
}

fn result() -> BoxedStrategy<Vec<u8>> {
    let max = LIMITS.max_result_bytes;
    prop_oneof![
        8 => Just(Vec::new()),
        4 => prop::collection::vec(any::<u8>(), 1..64),
        1 => Just(vec![1; max]),
        1 => Just(vec![2; max + 1]),
    ]
    .boxed()
}

/// A snooze allowance: mostly the default or small, sometimes over the limit.
fn max_snoozes() -> BoxedStrategy<Option<u32>> {
    let limit = LIMITS.max_snoozes_limit;
    prop_oneof![
        4 => Just(None),
        2 => (0u32..3).prop_map(Some),
        1 => Just(Some(limit)),
        1 => Just(Some(limit + 1)),
        1 => any::<u32>().prop_map(Some),
    ]
    .boxed()
}

fn max_attempts() -> BoxedStrategy<u32> {
    let limit = LIMITS.max_attempts_limit;
    prop_oneof![
        4 => Just(0u32),
        2 => Just(1u32),
        2 => 2u32..5,
        1 => Just(limit),
        1 => Just(limit + 1),
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ]
    .boxed()
}

fn error_text() -> BoxedStrategy<String> {
    let max = LIMITS.max_error_bytes;
    prop_oneof![
        2 => Just(String::new()),
        2 => Just("smtp down".to_owned()),
        1 => Just("é".repeat(max / 2)),
        1 => Just(format!("a{}", "é".repeat(max / 2))),
        1 => Just("🦀".repeat(max / 4 + 1)),
        1 => Just("x".repeat(100_000)),
        1 => Just("\0\n\r\t\u{1b}[2J\u{202e}".to_owned()),
        2 => any::<String>(),
    ]
    .boxed()
}

fn capacity() -> BoxedStrategy<u32> {
    let max = LIMITS.max_capacity;
    prop_oneof![
        3 => Just(0u32),
        3 => 1u32..4,
        1 => Just(max),
        1 => Just(max + 1),
        1 => Just(u32::MAX),
        1 => any::<u32>(),
    ]
    .boxed()
}

fn status() -> BoxedStrategy<i32> {
    prop_oneof![4 => 0i32..=4, 1 => select(vec![-1, 5, i32::MAX, i32::MIN]), 1 => any::<i32>()]
        .boxed()
}

fn page_size() -> BoxedStrategy<u32> {
    prop_oneof![3 => select(vec![0u32, 1, 2, 1000, 1001, u32::MAX]), 1 => any::<u32>()].boxed()
}

/// The queues of a Dequeue or Lease.
#[derive(Debug, Clone)]
enum QueuesGen {
    List(Vec<String>),
    /// One queue named many times.
    Duplicated(String, usize),
    /// `n` distinct valid names (the limit is `MAX_QUEUES`).
    Many(usize),
}

impl QueuesGen {
    fn build(&self) -> Vec<String> {
        match self {
            QueuesGen::List(qs) => qs.clone(),
            QueuesGen::Duplicated(q, n) => vec![q.clone(); *n],
            QueuesGen::Many(n) => (0..*n)
                .map(|i| QUEUES.get(i).map_or(format!("q{i}"), |q| q.to_string()))
                .collect(),
        }
    }

    fn v(&self) -> V {
        match self {
            QueuesGen::List(qs) => all(std::iter::once(bad_if(
                qs.is_empty() || qs.len() > MAX_QUEUES,
            ))
            .chain(qs.iter().map(|q| name_v(q)))),
            QueuesGen::Duplicated(q, n) => all([name_v(q), bad_if(*n == 0 || *n > MAX_QUEUES)]),
            QueuesGen::Many(n) => bad_if(*n == 0 || *n > MAX_QUEUES),
        }
    }
}

fn queues() -> BoxedStrategy<QueuesGen> {
    prop_oneof![
        6 => prop::collection::vec(select(&QUEUES[..]).prop_map(String::from), 1..4).prop_map(QueuesGen::List),
        3 => prop::collection::vec(name(), 0..4).prop_map(QueuesGen::List),
        1 => (name(), select(vec![2usize, MAX_QUEUES, MAX_QUEUES + 1, 1000])).prop_map(|(q, n)| QueuesGen::Duplicated(q, n)),
        1 => select(vec![0usize, MAX_QUEUES - 1, MAX_QUEUES, MAX_QUEUES + 1, 500]).prop_map(QueuesGen::Many),
    ]
    .boxed()
}

/// A job id: one the server handed out, or a literal.
#[derive(Debug, Clone)]
enum IdGen {
    Real(usize),
    Lit(String),
}

fn id() -> BoxedStrategy<IdGen> {
    prop_oneof![2 => any::<usize>().prop_map(IdGen::Real), 1 => id_literal().prop_map(IdGen::Lit)]
        .boxed()
}

/// A (job, lease) pair for Ack, Fail and Heartbeat.
#[derive(Debug, Clone)]
enum LeaseRefGen {
    /// A lease the server handed out (maybe since acked, failed, expired
    /// or reclaimed).
    Held(usize),
    /// A real job with a real lease id that is off by one.
    OffByOne(usize),
    /// A real job with another job's lease.
    Swapped(usize, usize),
    /// A real job with a literal lease id.
    JobWithLit(usize, String),
    Lits(IdGen, String),
}

fn lease_ref() -> BoxedStrategy<LeaseRefGen> {
    prop_oneof![
        5 => any::<usize>().prop_map(LeaseRefGen::Held),
        1 => any::<usize>().prop_map(LeaseRefGen::OffByOne),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| LeaseRefGen::Swapped(a, b)),
        1 => (any::<usize>(), id_literal()).prop_map(|(i, l)| LeaseRefGen::JobWithLit(i, l)),
        1 => (id(), id_literal()).prop_map(|(j, l)| LeaseRefGen::Lits(j, l)),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
struct EnqGen {
    queue: String,
    kind: String,
    payload: Vec<u8>,
    key: String,
    max_attempts: u32,
    delay: Option<prost_types::Duration>,
    metadata: std::collections::HashMap<String, String>,
    priority: i32,
    group: String,
    max_snoozes: Option<u32>,
    /// key_scope, on_conflict, unique_for.
    unique: (i32, i32, Option<prost_types::Duration>),
}

impl EnqGen {
    fn build(&self) -> (pb::EnqueueRequest, V) {
        let v = all([
            name_v(&self.queue),
            name_v(&self.kind),
            opt_name_v(&self.key),
            opt_name_v(&self.group),
            bad_if(self.payload.len() > LIMITS.max_payload),
            bad_if(self.max_attempts > LIMITS.max_attempts_limit),
            bad_if(self.max_snoozes > Some(LIMITS.max_snoozes_limit)),
            bad_if(!(0..=2).contains(&self.unique.0) || !(0..=2).contains(&self.unique.1)),
            dur_v(&self.unique.2, DurKind::Delay),
            bad_if(self.unique.2 == secs(0, 0)),
            bad_if(
                self.key.is_empty()
                    && (self.unique.0 == 2 || self.unique.1 == 2 || self.unique.2.is_some()),
            ),
            dur_v(&self.delay, DurKind::Delay),
            bad_if(!(-100..=100).contains(&self.priority)),
            all(self.metadata.keys().map(|k| name_v(k))),
            bad_if(self.metadata.values().any(|v| v.contains('\0'))),
            bad_if(
                self.metadata
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
                    > LIMITS.max_metadata_bytes,
            ),
        ]);
        let req = pb::EnqueueRequest {
            queue: self.queue.clone(),
            kind: self.kind.clone(),
            payload: self.payload.clone(),
            key: self.key.clone(),
            max_attempts: self.max_attempts,
            delay: self.delay,
            metadata: self.metadata.clone(),
            priority: self.priority,
            group: self.group.clone(),
            max_snoozes: self.max_snoozes,
            key_scope: self.unique.0,
            on_conflict: self.unique.1,
            unique_for: self.unique.2,
        };
        (req, v)
    }
}

fn enq() -> BoxedStrategy<EnqGen> {
    (
        name(),
        name(),
        payload(),
        opt_name(),
        max_attempts(),
        duration(),
        metadata(),
        priority(),
        opt_name(),
        max_snoozes(),
        (
            key_rule(),
            key_rule(),
            prop_oneof![3 => Just(None), 1 => duration()],
        ),
    )
        .prop_map(
            |(
                queue,
                kind,
                payload,
                key,
                max_attempts,
                delay,
                metadata,
                priority,
                group,
                max_snoozes,
                unique,
            )| EnqGen {
                queue,
                kind,
                payload,
                key,
                max_attempts,
                delay,
                metadata,
                priority,
                group,
                max_snoozes,
                unique,
            },
        )
        .boxed()
}

/// Entries of one key in a batch must agree on its scope and window: a
/// valid entry that differs from the first valid one of its key is not.
fn agree_on_keys(entries: Vec<(pb::EnqueueRequest, V)>) -> Vec<(pb::EnqueueRequest, V)> {
    let mut first: std::collections::HashMap<
        (String, String),
        (bool, Option<prost_types::Duration>),
    > = std::collections::HashMap::new();
    entries
        .into_iter()
        .map(|(req, v)| {
            if v != V::Valid || req.key.is_empty() {
                return (req, v);
            }
            let rule = (req.key_scope == 2, req.unique_for);
            let agreed = *first
                .entry((req.queue.clone(), req.key.clone()))
                .or_insert(rule)
                == rule;
            (req, if agreed { v } else { V::Invalid })
        })
        .collect()
}

/// A key_scope or on_conflict value: mostly unset, sometimes each known
/// value, sometimes none known.
fn key_rule() -> BoxedStrategy<i32> {
    prop_oneof![6 => Just(0), 1 => Just(1), 2 => Just(2), 1 => Just(3), 1 => any::<i32>()].boxed()
}

/// A valid enqueue, due now, to a queue the valid dequeues read.
fn good_enq() -> BoxedStrategy<EnqGen> {
    (
        select(&QUEUES[..]),
        prop_oneof![4 => Just(""), 1 => Just("order-1"), 1 => Just("order-2")],
        prop_oneof![3 => Just(0u32), 1 => Just(1u32), 1 => Just(2u32)],
        prop_oneof![2 => Just(""), 1 => Just("tenant-1"), 1 => Just("tenant-2")],
        prop_oneof![3 => Just(None), 1 => Just(Some(1u32)), 1 => Just(Some(0u32))],
        prop_oneof![
            4 => Just((0, 0, None)),
            1 => Just((2, 0, None)),
            1 => Just((0, 2, None)),
            1 => Just((2, 2, None)),
            1 => Just((0, 0, secs(0, 50_000_000))),
        ],
    )
        .prop_map(
            |(queue, key, max_attempts, group, max_snoozes, unique)| EnqGen {
                queue: queue.into(),
                kind: "send-email".into(),
                payload: b"order-4711".to_vec(),
                key: key.into(),
                max_attempts,
                delay: None,
                metadata: Default::default(),
                priority: 0,
                group: group.into(),
                max_snoozes,
                // The rules of a key, for a job with one.
                unique: if key.is_empty() { (0, 0, None) } else { unique },
            },
        )
        .boxed()
}

/// A policy's limit: mostly none or small, sometimes out of range.
fn limit() -> BoxedStrategy<u32> {
    prop_oneof![
        3 => Just(0u32),
        3 => 1..=3u32,
        1 => Just(jobq_server::policy::MOST_RUNNING),
        1 => prop_oneof![Just(jobq_server::policy::MOST_RUNNING + 1), Just(u32::MAX)],
    ]
    .boxed()
}

/// A generated rate limit's validity.
fn rate_v(rate: &Option<(u32, Option<prost_types::Duration>, u32)>) -> V {
    let tokens = jobq_server::policy::MOST_TOKENS;
    match rate {
        Some((limit, per, burst)) if *limit > 0 => {
            let (shortest, longest) = jobq_server::policy::PERIODS;
            let per_ok = per
                .and_then(|d| Duration::try_from(d).ok())
                .is_some_and(|d| d >= shortest && d <= longest);
            all([
                bad_if(*limit > tokens),
                bad_if(!per_ok),
                bad_if(*burst > tokens),
            ])
        }
        _ => V::Valid,
    }
}

/// A generated rate limit on the wire.
fn rate_pb((limit, per, burst): (u32, Option<prost_types::Duration>, u32)) -> pb::RateLimit {
    pb::RateLimit { limit, per, burst }
}

/// A policy's rate limit (limit, per, burst): mostly none, sometimes out
/// of range.
fn rate() -> BoxedStrategy<Option<(u32, Option<prost_types::Duration>, u32)>> {
    let per = prop_oneof![
        1 => Just(None),
        3 => Just(Some(prost_types::Duration { seconds: 1, nanos: 0 })),
        1 => Just(Some(prost_types::Duration { seconds: 0, nanos: 1_000_000 })),
        1 => Just(Some(prost_types::Duration { seconds: 0, nanos: 0 })),
        1 => Just(Some(prost_types::Duration { seconds: 2 * 86_400, nanos: 0 })),
        1 => Just(Some(prost_types::Duration { seconds: -1, nanos: 0 })),
    ];
    let most = jobq_server::policy::MOST_TOKENS;
    prop_oneof![
        3 => Just(None),
        2 => (prop_oneof![Just(0u32), Just(1), Just(100), Just(most), Just(most + 1)], per, prop_oneof![Just(0u32), Just(5), Just(most + 1)])
            .prop_map(Some),
    ]
    .boxed()
}

/// Enqueue priority: mostly 0, often in range, sometimes out of it.
fn priority() -> BoxedStrategy<i32> {
    prop_oneof![
        3 => Just(0),
        2 => -100..=100i32,
        1 => prop_oneof![Just(-101), Just(101), Just(i32::MIN), Just(i32::MAX)],
    ]
    .boxed()
}

/// Enqueue metadata: mostly none or small, sometimes bad keys, sometimes
/// over `--max-metadata-bytes`.
fn metadata() -> BoxedStrategy<std::collections::HashMap<String, String>> {
    prop_oneof![
        3 => Just(std::collections::HashMap::new()),
        2 => prop::collection::hash_map(name(), "[ -~]{0,40}", 1..4),
        1 => prop::collection::hash_map(name(), "[a-z]{0,4}\0[ -~]{0,4}", 1..3),
        1 => prop::collection::hash_map(name(), "[a-z]{100,200}", 1..4),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
enum BatchGen {
    Jobs(Vec<EnqGen>),
    /// `--max-batch` + 1 valid jobs.
    OverLimit,
}

#[derive(Debug, Clone)]
enum Op {
    Enqueue(EnqGen),
    EnqueueBatch(BatchGen),
    Dequeue {
        queues: QueuesGen,
        worker: String,
        lease: Option<prost_types::Duration>,
        wait: Option<prost_types::Duration>,
    },
    Ack {
        target: LeaseRefGen,
        result: Vec<u8>,
    },
    Fail {
        target: LeaseRefGen,
        error: String,
        retry_delay: Option<prost_types::Duration>,
        fatal: bool,
        snooze: Option<prost_types::Duration>,
    },
    Retry(IdGen),
    Heartbeat {
        worker: String,
        leases: Vec<LeaseRefGen>,
        /// Pad the list to `--max-capacity` (+1 when `true`) entries.
        pad: Option<bool>,
        extend_by: Option<prost_types::Duration>,
        draining: bool,
        /// A report (percent, message bytes) on the first lease.
        progress: Option<(u32, usize)>,
    },
    GetJob(IdGen),
    ListJobs {
        queue: String,
        status: i32,
        key: String,
        page_size: u32,
        page_token: Option<IdGen>,
    },
    Stats(String),
    Lease {
        queues: QueuesGen,
        worker: String,
        capacity: u32,
        lease: Option<prost_types::Duration>,
        reads: usize,
        /// While the stream is open: ack the first job it pushed.
        ack_first: bool,
        /// While the stream is open: a waiting Dequeue, over --max-waiters.
        crowd: bool,
    },
    Cancel {
        id: IdGen,
        reason: String,
    },
    Pause(String),
    Resume(String),
    SetPolicy {
        queue: String,
        max_running: u32,
        group_max_running: u32,
        rate: Option<(u32, Option<prost_types::Duration>, u32)>,
        group_rate: Option<(u32, Option<prost_types::Duration>, u32)>,
    },
    Delete(IdGen),
    Purge {
        queue: String,
        status: i32,
        finished_before: Option<prost_types::Timestamp>,
    },
    CreateSchedule(SchedGen),
    DeleteSchedule(String),
    ListSchedules,
}

#[derive(Debug, Clone)]
struct SchedGen {
    name: String,
    queue: String,
    kind: String,
    /// (expression, valid)
    cron: (&'static str, bool),
    /// (IANA name, valid)
    timezone: (&'static str, bool),
    max_attempts: u32,
}

const CRONS: &[(&str, bool)] = &[
    ("0 3 * * *", true),
    ("*/10 * * * * *", true),
    ("0 0 1 1 *", true),
    ("", false),
    ("* * *", false),
    ("0 25 * * *", false),
    ("every night", false),
];

const TIMEZONES: &[(&str, bool)] = &[
    ("", true),
    ("UTC", true),
    ("Europe/Berlin", true),
    ("America/New_York", true),
    ("Mars/Olympus", false),
    ("utc+1", false),
];

fn sched() -> BoxedStrategy<SchedGen> {
    (
        prop_oneof![3 => select(vec!["nightly", "hourly", "s.1"]).prop_map(String::from), 1 => name()],
        prop_oneof![3 => select(&QUEUES[..]).prop_map(String::from), 1 => name()],
        name(),
        select(CRONS),
        select(TIMEZONES),
        max_attempts(),
    )
        .prop_map(|(name, queue, kind, cron, timezone, max_attempts)| SchedGen {
            name,
            queue,
            kind,
            cron,
            timezone,
            max_attempts,
        })
        .boxed()
}

fn finished_before() -> BoxedStrategy<Option<prost_types::Timestamp>> {
    prop_oneof![
        2 => Just(None),
        2 => Just(Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 })),
        1 => Just(Some(prost_types::Timestamp { seconds: 4_000_000_000, nanos: 5 })),
        1 => Just(Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: -1 })),
        1 => Just(Some(prost_types::Timestamp { seconds: 0, nanos: 1_000_000_000 })),
        1 => Just(Some(prost_types::Timestamp { seconds: i64::MAX, nanos: 0 })),
        1 => Just(Some(prost_types::Timestamp { seconds: -62_135_596_801, nanos: 0 })),
        1 => Just(Some(prost_types::Timestamp { seconds: 253_402_300_799, nanos: 999_999_999 })),
    ]
    .boxed()
}

fn op() -> impl Strategy<Value = Op> {
    let good_lease = prop_oneof![
        3 => Just(None),
        1 => Just(secs(0, 10_000_000)),
        1 => Just(secs(0, 200_000_000)),
    ];
    prop_oneof![
        6 => enq().prop_map(Op::Enqueue),
        5 => good_enq().prop_map(Op::Enqueue),
        1 => prop::collection::vec(prop_oneof![good_enq(), enq()], 0..5)
            .prop_map(|jobs| Op::EnqueueBatch(BatchGen::Jobs(jobs))),
        1 => Just(Op::EnqueueBatch(BatchGen::OverLimit)),
        3 => (queues(), name(), duration(), wait()).prop_map(|(queues, worker, lease, wait)| Op::Dequeue { queues, worker, lease, wait }),
        5 => (prop::collection::vec(select(&QUEUES[..]).prop_map(String::from), 1..4), good_lease)
            .prop_map(|(qs, lease)| Op::Dequeue { queues: QueuesGen::List(qs), worker: "worker-1".into(), lease, wait: None }),
        4 => (lease_ref(), result()).prop_map(|(target, result)| Op::Ack { target, result }),
        4 => (lease_ref(), error_text(), duration(), any::<bool>(), prop_oneof![3 => Just(None), 1 => duration()])
            .prop_map(|(target, error, retry_delay, fatal, snooze)| Op::Fail { target, error, retry_delay, fatal, snooze }),
        3 => (any::<usize>(), prop_oneof![Just(None), Just(secs(0, 0))], any::<bool>(), prop_oneof![3 => Just(None), 1 => Just(secs(0, 0))])
            .prop_map(|(i, retry_delay, fatal, snooze)| Op::Fail { target: LeaseRefGen::Held(i), error: "boom".into(), retry_delay, fatal, snooze }),
        2 => id().prop_map(Op::Retry),
        2 => (name(), prop::collection::vec(lease_ref(), 0..4), prop_oneof![8 => Just(None), 1 => Just(Some(false)), 1 => Just(Some(true))], duration(), any::<bool>(),
              prop::option::of((prop_oneof![3 => 0..=100u32, 1 => 101..200u32], prop_oneof![3 => 0..=256usize, 1 => 257..300usize])))
            .prop_map(|(worker, leases, pad, extend_by, draining, progress)| Op::Heartbeat { worker, leases, pad, extend_by, draining, progress }),
        2 => id().prop_map(Op::GetJob),
        2 => (opt_name(), status(), opt_name(), page_size(), prop::option::of(id()))
            .prop_map(|(queue, status, key, page_size, page_token)| Op::ListJobs { queue, status, key, page_size, page_token }),
        1 => opt_name().prop_map(Op::Stats),
        2 => (queues(), name(), capacity(), duration(), 0usize..4, any::<bool>(), any::<bool>())
            .prop_map(|(queues, worker, capacity, lease, reads, ack_first, crowd)| Op::Lease { queues, worker, capacity, lease, reads, ack_first, crowd }),
        2 => (prop::collection::vec(select(&QUEUES[..]).prop_map(String::from), 1..4), 0u32..4, prop_oneof![Just(None), Just(secs(0, 200_000_000))], 1usize..4, any::<bool>())
            .prop_map(|(qs, capacity, lease, reads, ack_first)| Op::Lease {
                queues: QueuesGen::List(qs), worker: "worker-2".into(), capacity, lease, reads, ack_first, crowd: false,
            }),
        2 => (id(), error_text()).prop_map(|(id, reason)| Op::Cancel { id, reason }),
        2 => prop_oneof![3 => select(&QUEUES[..]).prop_map(String::from), 1 => opt_name()].prop_map(Op::Pause),
        2 => prop_oneof![3 => select(&QUEUES[..]).prop_map(String::from), 1 => opt_name()].prop_map(Op::Resume),
        2 => (prop_oneof![3 => select(&QUEUES[..]).prop_map(String::from), 1 => opt_name()], limit(), limit())
            .prop_flat_map(|(queue, max_running, group_max_running)| (rate(), rate()).prop_map(move |(rate, group_rate)| Op::SetPolicy { queue: queue.clone(), max_running, group_max_running, rate, group_rate })),
        1 => id().prop_map(Op::Delete),
        1 => (prop_oneof![3 => select(&QUEUES[..]).prop_map(String::from), 1 => opt_name()], status(), finished_before())
            .prop_map(|(queue, status, finished_before)| Op::Purge { queue, status, finished_before }),
        // A purge of a queue's PENDING jobs, as an operator sends it.
        1 => select(&QUEUES[..]).prop_map(|q| Op::Purge { queue: q.into(), status: 1, finished_before: None }),
        2 => sched().prop_map(Op::CreateSchedule),
        1 => prop_oneof![3 => select(vec!["nightly", "hourly", "s.1"]).prop_map(String::from), 1 => opt_name()].prop_map(Op::DeleteSchedule),
        1 => Just(Op::ListSchedules),
    ]
}

// ---------------------------------------------------------------------------
// The harness.

const ENQ: &[Code] = &[Code::Ok, Code::InvalidArgument, Code::ResourceExhausted];
const TAKE: &[Code] = &[Code::Ok, Code::InvalidArgument, Code::ResourceExhausted];
const SETTLE: &[Code] = &[
    Code::Ok,
    Code::InvalidArgument,
    Code::NotFound,
    Code::FailedPrecondition,
    Code::Aborted,
];
const RETRY: &[Code] = &[
    Code::Ok,
    Code::InvalidArgument,
    Code::NotFound,
    Code::FailedPrecondition,
];
const HEARTBEAT: &[Code] = &[Code::Ok, Code::InvalidArgument, Code::ResourceExhausted];
const GET: &[Code] = &[Code::Ok, Code::InvalidArgument, Code::NotFound];
const OPERATE: &[Code] = &[
    Code::Ok,
    Code::InvalidArgument,
    Code::NotFound,
    Code::FailedPrecondition,
];
const SCHEDULE: &[Code] = &[Code::Ok, Code::InvalidArgument, Code::ResourceExhausted];
const PAUSE: &[Code] = &[Code::Ok, Code::InvalidArgument, Code::ResourceExhausted];
const READ: &[Code] = &[Code::Ok, Code::InvalidArgument];

/// Everything a client can see of the store.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    jobs: Vec<pb::Job>,
    stats: Vec<pb::QueueStats>,
    schedules: Vec<pb::Schedule>,
}

struct Harness {
    svc: Svc,
    /// With tokens on: the admin caller the snapshots read as.
    root: Option<Caller>,
    hub: Arc<LeaseHub<SledStore>>,
    /// Job ids the server returned.
    jobs: Vec<String>,
    /// (job id, lease id) pairs the server handed out.
    leases: Vec<(String, String)>,
    /// The queues paused, as the replies said.
    paused: std::collections::BTreeSet<String>,
    /// Queues with a policy, as the replies said.
    policies: std::collections::BTreeSet<String>,
    _dir: TempDir,
}

fn code_of<T>(r: &Result<T, Status>) -> Code {
    r.as_ref().map_or_else(Status::code, |_| Code::Ok)
}

fn pick<T: Clone>(xs: &[T], i: usize) -> Option<T> {
    (!xs.is_empty()).then(|| xs[i % xs.len()].clone())
}

impl Harness {
    fn new() -> Harness {
        let dir = TempDir::new().expect("temp dir");
        let config = Arc::new(config(dir.path()));
        let store = Arc::new(SledStore::open(&config).expect("open the store"));
        let shutdown = CancellationToken::new();
        let hub = LeaseHub::new(Arc::clone(&store), Arc::clone(&config), shutdown.clone());
        let svc = JobQueueService::new(store, Arc::clone(&hub), config, shutdown);
        Harness {
            svc,
            root: None,
            hub,
            jobs: Vec::new(),
            leases: Vec::new(),
            paused: std::collections::BTreeSet::new(),
            policies: std::collections::BTreeSet::new(),
            _dir: dir,
        }
    }

    /// A request as the snapshot's reader (root when tokens are on).
    fn as_root<T>(&self, msg: T) -> Request<T> {
        let mut req = Request::new(msg);
        if let Some(root) = &self.root {
            req.extensions_mut().insert(root.clone());
        }
        req
    }

    async fn snapshot(&self) -> Result<Snapshot, TestCaseError> {
        let mut jobs = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = self
                .svc
                .list_jobs(self.as_root(pb::ListJobsRequest {
                    page_size: MAX_PAGE_SIZE as u32,
                    page_token: page_token.clone(),
                    ..Default::default()
                }))
                .await
                .map_err(|s| TestCaseError::fail(format!("snapshot ListJobs: {s:?}")))?
                .into_inner();
            jobs.extend(page.jobs);
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let mut stats = self
            .svc
            .stats(self.as_root(pb::StatsRequest::default()))
            .await
            .map_err(|s| TestCaseError::fail(format!("snapshot Stats: {s:?}")))?
            .into_inner()
            .queues;
        for q in &mut stats {
            // Grows with the clock, not with the store.
            q.oldest_pending_age = None;
        }
        let mut schedules = self
            .svc
            .list_schedules(self.as_root(pb::ListSchedulesRequest {}))
            .await
            .map_err(|s| TestCaseError::fail(format!("snapshot ListSchedules: {s:?}")))?
            .into_inner()
            .schedules;
        for s in &mut schedules {
            // Moves with the clock.
            s.next_run_at = None;
        }
        let snap = Snapshot {
            jobs,
            stats,
            schedules,
        };
        snap.check()?;
        Ok(snap)
    }

    fn id(&self, g: &IdGen) -> String {
        match g {
            IdGen::Real(i) => pick(&self.jobs, *i).unwrap_or_else(|| "1".into()),
            IdGen::Lit(s) => s.clone(),
        }
    }

    fn lease_ref(&self, g: &LeaseRefGen) -> (pb::LeaseRef, V) {
        let (job_id, lease_id) = match g {
            LeaseRefGen::Held(i) => {
                pick(&self.leases, *i).unwrap_or_else(|| ("1".into(), "1".into()))
            }
            LeaseRefGen::OffByOne(i) => {
                let (job, lease) =
                    pick(&self.leases, *i).unwrap_or_else(|| ("1".into(), "1".into()));
                let lease: u64 = lease.parse().expect("server lease ids are numbers");
                (job, lease.wrapping_add(1).to_string())
            }
            LeaseRefGen::Swapped(a, b) => {
                let (job, _) = pick(&self.leases, *a).unwrap_or_else(|| ("1".into(), "1".into()));
                let (_, lease) = pick(&self.leases, *b).unwrap_or_else(|| ("2".into(), "2".into()));
                (job, lease)
            }
            LeaseRefGen::JobWithLit(i, lease) => (
                pick(&self.jobs, *i).unwrap_or_else(|| "1".into()),
                lease.clone(),
            ),
            LeaseRefGen::Lits(job, lease) => (self.id(job), lease.clone()),
        };
        let v = all([id_v(&job_id), id_v(&lease_id)]);
        (
            pb::LeaseRef {
                job_id,
                lease_id,
                progress: None,
            },
            v,
        )
    }

    fn leased(&mut self, l: &pb::LeasedJob) -> Checked {
        let job = l
            .job
            .as_ref()
            .ok_or_else(|| TestCaseError::fail("leased without a job"))?;
        prop_assert_eq!(
            job.status,
            pb::JobStatus::Running as i32,
            "a leased job is RUNNING: {:?}",
            job
        );
        prop_assert_eq!(id_v(&l.lease_id), V::Valid, "lease id {:?}", l.lease_id);
        self.leases.push((job.id.clone(), l.lease_id.clone()));
        Ok(())
    }

    /// Waits until no Lease stream task is left (its reclaims included):
    /// with --max-waiters 1, a waiting Dequeue is refused while one lives,
    /// and its give-backs and reclaims end with its task.
    async fn quiesce(&self) -> Checked {
        for _ in 0..2000 {
            let probe = self
                .svc
                .dequeue(Request::new(pb::DequeueRequest {
                    queues: vec![PROBE_QUEUE.into()],
                    worker_id: "probe".into(),
                    lease_duration: None,
                    wait: secs(0, 1),
                }))
                .await;
            match probe {
                Ok(r) => {
                    prop_assert!(r.into_inner().leased.is_none(), "the probe queue is empty");
                    prop_assert_eq!(self.hub.open_streams(), 0);
                    // A closed stream frees its place before it gives back
                    // and reclaims its jobs: wait for those too.
                    if self.hub.stream_tasks() == 0 {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(s) if s.code() == Code::ResourceExhausted => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(s) => return Err(TestCaseError::fail(format!("quiesce probe: {s:?}"))),
            }
        }
        Err(TestCaseError::fail(
            "a dropped Lease stream's task never ended",
        ))
    }

    /// Runs one op and checks what its reply says. Returns the RPC, the
    /// codes §2 allows for it, what this test expects of the request, and
    /// the code it got; `run_case` judges those.
    async fn run(
        &mut self,
        op: &Op,
    ) -> Result<(&'static str, &'static [Code], V, Code), TestCaseError> {
        Ok(match op {
            Op::Enqueue(g) => {
                let (req, v) = g.build();
                let r = self.svc.enqueue(Request::new(req.clone())).await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let r = r.into_inner();
                    let outcome = pb::EnqueueOutcome::try_from(r.outcome);
                    prop_assert_eq!(r.created, outcome == Ok(pb::EnqueueOutcome::Created));
                    prop_assert!(outcome.is_ok_and(|o| o != pb::EnqueueOutcome::Unspecified));
                    if outcome == Ok(pb::EnqueueOutcome::Replaced) {
                        prop_assert_eq!(req.on_conflict, pb::OnConflict::Replace as i32);
                    }
                    let job = r
                        .job
                        .ok_or_else(|| TestCaseError::fail("enqueue without a job"))?;
                    prop_assert_eq!(&job.queue, &req.queue);
                    if !req.key.is_empty() {
                        prop_assert_eq!(&job.key, &req.key);
                    } else {
                        prop_assert_eq!(&job.kind, &req.kind);
                    }
                    // A write's reply never echoes the payload.
                    prop_assert!(job.payload.is_empty());
                    self.jobs.push(job.id);
                }
                ("Enqueue", ENQ, v, code)
            }
            Op::EnqueueBatch(g) => {
                let entries: Vec<(pb::EnqueueRequest, V)> = match g {
                    BatchGen::Jobs(jobs) => agree_on_keys(jobs.iter().map(EnqGen::build).collect()),
                    BatchGen::OverLimit => {
                        let one = pb::EnqueueRequest {
                            queue: "default".into(),
                            kind: "k".into(),
                            ..Default::default()
                        };
                        vec![(one, V::Valid); LIMITS.max_batch + 1]
                    }
                };
                let v = bad_if(entries.is_empty() || entries.len() > LIMITS.max_batch);
                let before = self.snapshot().await?;
                let r = self
                    .svc
                    .enqueue_batch(Request::new(pb::EnqueueBatchRequest {
                        jobs: entries.iter().map(|(r, _)| r.clone()).collect(),
                    }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let results = r.into_inner().results;
                    prop_assert_eq!(results.len(), entries.len());
                    for ((req, ev), res) in entries.iter().zip(&results) {
                        let entry_code = Code::from_i32(res.error_code);
                        prop_assert!(
                            [Code::Ok, Code::InvalidArgument, Code::ResourceExhausted]
                                .contains(&entry_code),
                            "batch entry code {:?} ({}) for {:?}",
                            entry_code,
                            res.error_message,
                            req.queue
                        );
                        match ev {
                            V::Invalid => prop_assert_eq!(
                                entry_code,
                                Code::InvalidArgument,
                                "bad entry accepted: {:?}",
                                res
                            ),
                            V::Valid => prop_assert_eq!(
                                entry_code,
                                Code::Ok,
                                "good entry refused: {}",
                                res.error_message
                            ),
                        }
                        prop_assert_eq!(res.job.is_some(), entry_code == Code::Ok);
                        if let Some(job) = &res.job {
                            prop_assert_eq!(&job.queue, &req.queue);
                            self.jobs.push(job.id.clone());
                        }
                    }
                    if results.iter().all(|r| r.job.is_none()) {
                        let after = self.snapshot().await?;
                        prop_assert_eq!(
                            before,
                            after,
                            "a batch that stored nothing changed the store"
                        );
                    }
                }
                ("EnqueueBatch", ENQ, v, code)
            }
            Op::Dequeue {
                queues,
                worker,
                lease,
                wait,
            } => {
                let v = all([
                    queues.v(),
                    name_v(worker),
                    dur_v(lease, DurKind::Lease),
                    dur_v(wait, DurKind::Wait),
                ]);
                let r = self
                    .svc
                    .dequeue(Request::new(pb::DequeueRequest {
                        queues: queues.build(),
                        worker_id: worker.clone(),
                        lease_duration: *lease,
                        wait: *wait,
                    }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    if let Some(l) = r.into_inner().leased {
                        self.leased(&l)?;
                    }
                }
                ("Dequeue", TAKE, v, code)
            }
            Op::Ack { target, result } => {
                let (lr, v) = self.lease_ref(target);
                let v = all([v, bad_if(result.len() > LIMITS.max_result_bytes)]);
                let job_id = lr.job_id.clone();
                let r = self
                    .svc
                    .ack(Request::new(pb::AckRequest {
                        job_id: lr.job_id,
                        lease_id: lr.lease_id,
                        result: result.clone(),
                    }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let job = r
                        .into_inner()
                        .job
                        .ok_or_else(|| TestCaseError::fail("ack without a job"))?;
                    prop_assert_eq!(job.status, pb::JobStatus::Done as i32);
                    prop_assert!(job.result.is_empty(), "an ack's reply echoes its result");
                    // Stored as sent, read back by GetJob alone.
                    let got = self
                        .svc
                        .get_job(Request::new(pb::GetJobRequest { id: job_id }))
                        .await
                        .map_err(|s| TestCaseError::fail(format!("get after ack: {s}")))?
                        .into_inner();
                    prop_assert_eq!(&got.result, result);
                }
                ("Ack", SETTLE, v, code)
            }
            Op::Fail {
                target,
                error,
                retry_delay,
                fatal,
                snooze,
            } => {
                let (lr, v) = self.lease_ref(target);
                let v = all([
                    v,
                    dur_v(retry_delay, DurKind::Delay),
                    dur_v(snooze, DurKind::Delay),
                    bad_if(snooze.is_some() && (*fatal || retry_delay.is_some())),
                ]);
                let r = self
                    .svc
                    .fail(Request::new(pb::FailRequest {
                        job_id: lr.job_id,
                        lease_id: lr.lease_id,
                        error: error.clone(),
                        retry_delay: *retry_delay,
                        fatal: *fatal,
                        snooze: *snooze,
                    }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let job = r
                        .into_inner()
                        .job
                        .ok_or_else(|| TestCaseError::fail("fail without a job"))?;
                    prop_assert!(
                        [pb::JobStatus::Pending as i32, pb::JobStatus::Failed as i32]
                            .contains(&job.status),
                        "after Fail: {:?}",
                        job.status
                    );
                    // A snooze fails nothing: its reason is the attempt's.
                    // Past the job's max_snoozes it is a failure.
                    let text = match snooze {
                        None => job.last_error.clone(),
                        Some(_) => {
                            let last = job.history.last().ok_or_else(|| {
                                TestCaseError::fail("a snoozed job without its attempt")
                            })?;
                            prop_assert!(job.snoozes <= job.max_snoozes);
                            if last.outcome == pb::AttemptOutcome::Snoozed as i32 {
                                prop_assert_eq!(job.status, pb::JobStatus::Pending as i32);
                                prop_assert!(job.snoozes > 0);
                            } else {
                                prop_assert_eq!(last.outcome, pb::AttemptOutcome::Failed as i32);
                                prop_assert_eq!(job.snoozes, job.max_snoozes);
                                prop_assert!(last.error.contains("max_snoozes"), "{}", last.error);
                            }
                            last.error.clone()
                        }
                    };
                    prop_assert!(!text.is_empty());
                    prop_assert!(text.len() <= LIMITS.max_error_bytes);
                    prop_assert!(!text.contains('\0'), "a NUL is stored");
                }
                ("Fail", SETTLE, v, code)
            }
            Op::Retry(id) => {
                let job_id = self.id(id);
                let v = id_v(&job_id);
                let r = self
                    .svc
                    .retry(Request::new(pb::RetryRequest { job_id }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let job = r
                        .into_inner()
                        .job
                        .ok_or_else(|| TestCaseError::fail("retry without a job"))?;
                    prop_assert_eq!(job.status, pb::JobStatus::Pending as i32);
                    prop_assert_eq!(job.attempts, 0);
                    prop_assert_eq!(job.snoozes, 0);
                }
                ("Retry", RETRY, v, code)
            }
            Op::Heartbeat {
                worker,
                leases,
                pad,
                extend_by,
                draining,
                progress,
            } => {
                let mut refs: Vec<(pb::LeaseRef, V)> =
                    leases.iter().map(|g| self.lease_ref(g)).collect();
                let mut report_v = V::Valid;
                if let (Some((percent, bytes)), Some((first, _))) = (progress, refs.first_mut()) {
                    first.progress = Some(pb::Progress {
                        percent: *percent,
                        message: "é".repeat(bytes / 2) + &"\0".repeat(bytes % 2),
                        reported_at: None,
                    });
                    // A long message is cut, never refused.
                    report_v = bad_if(*percent > 100);
                }
                if let Some(over) = pad {
                    let n = jobq::MAX_HEARTBEAT_LEASES + usize::from(*over);
                    let filler = self.lease_ref(&LeaseRefGen::Held(0));
                    refs.resize(n, filler);
                }
                let v = all([
                    name_v(worker),
                    bad_if(refs.len() > jobq::MAX_HEARTBEAT_LEASES),
                    dur_v(extend_by, DurKind::Lease),
                    report_v,
                ]
                .into_iter()
                .chain(refs.iter().map(|(_, v)| *v)));
                let sent: Vec<pb::LeaseRef> = refs.into_iter().map(|(r, _)| r).collect();
                let r = self
                    .svc
                    .heartbeat(Request::new(pb::HeartbeatRequest {
                        worker_id: worker.clone(),
                        leases: sent.clone(),
                        extend_by: *extend_by,
                        draining: *draining,
                        stream_token: String::new(),
                    }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let lost = r.into_inner().lost;
                    prop_assert!(lost.len() <= sent.len());
                    // By value: the reply spells ids canonically ("7" for
                    // a sent "007").
                    let num = |l: &pb::LeaseRef| {
                        (l.job_id.parse::<u64>().ok(), l.lease_id.parse::<u64>().ok())
                    };
                    let asked: Vec<_> = sent.iter().map(num).collect();
                    for l in &lost {
                        prop_assert!(asked.contains(&num(l)), "lost {:?} was not asked about", l);
                    }
                }
                ("Heartbeat", HEARTBEAT, v, code)
            }
            Op::GetJob(id) => {
                let id = self.id(id);
                let v = id_v(&id);
                let r = self
                    .svc
                    .get_job(Request::new(pb::GetJobRequest { id: id.clone() }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    prop_assert_eq!(
                        r.into_inner().id.parse::<u64>().ok(),
                        id.parse::<u64>().ok()
                    );
                }
                ("GetJob", GET, v, code)
            }
            Op::ListJobs {
                queue,
                status,
                key,
                page_size,
                page_token,
            } => {
                let page_token = page_token.as_ref().map(|g| self.id(g)).unwrap_or_default();
                let v = all([
                    opt_name_v(queue),
                    opt_name_v(key),
                    bad_if(!(0..=4).contains(status)),
                    if page_token.is_empty() {
                        V::Valid
                    } else {
                        id_v(&page_token)
                    },
                ]);
                let r = self
                    .svc
                    .list_jobs(Request::new(pb::ListJobsRequest {
                        queue: queue.clone(),
                        status: *status,
                        key: key.clone(),
                        page_size: *page_size,
                        page_token,
                        omit_payload: *page_size % 2 == 1,
                    }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let page = r.into_inner();
                    let limit = match *page_size as usize {
                        0 => DEFAULT_PAGE_SIZE,
                        n => n.min(MAX_PAGE_SIZE),
                    };
                    prop_assert!(page.jobs.len() <= limit);
                    for job in &page.jobs {
                        if !queue.is_empty() {
                            prop_assert_eq!(&job.queue, queue);
                        }
                        if *status != 0 {
                            prop_assert_eq!(job.status, *status);
                        }
                    }
                }
                ("ListJobs", READ, v, code)
            }
            Op::Stats(queue) => {
                let v = opt_name_v(queue);
                let r = self
                    .svc
                    .stats(Request::new(pb::StatsRequest {
                        queue: queue.clone(),
                    }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    for q in r.into_inner().queues {
                        if !queue.is_empty() {
                            prop_assert_eq!(&q.queue, queue);
                        }
                    }
                }
                ("Stats", READ, v, code)
            }
            Op::Lease {
                queues,
                worker,
                capacity,
                lease,
                reads,
                ack_first,
                crowd,
            } => {
                let v = all([
                    queues.v(),
                    name_v(worker),
                    bad_if(*capacity > LIMITS.max_capacity),
                    dur_v(lease, DurKind::Lease),
                ]);
                let r = self
                    .svc
                    .lease(Request::new(pb::LeaseRequest {
                        queues: queues.build(),
                        worker_id: worker.clone(),
                        capacity: *capacity,
                        lease_duration: *lease,
                        held: vec![],
                    }))
                    .await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let mut stream = r.into_inner();
                    if *crowd {
                        // No yield between the snapshots: the stream's task
                        // cannot run, so only the call could change anything.
                        let before = self.snapshot().await?;
                        let r = self
                            .svc
                            .dequeue(Request::new(pb::DequeueRequest {
                                queues: vec!["default".into()],
                                worker_id: "crowd".into(),
                                lease_duration: None,
                                wait: secs(0, 1_000_000),
                            }))
                            .await;
                        prop_assert_eq!(
                            code_of(&r),
                            Code::ResourceExhausted,
                            "max_waiters is 1 and a stream is open"
                        );
                        prop_assert_eq!(before, self.snapshot().await?);
                    }
                    let mut first = true;
                    for _ in 0..*reads {
                        match tokio::time::timeout(Duration::from_millis(5), stream.next()).await {
                            Ok(Some(Ok(event))) => match event.event {
                                Some(Event::Leased(l)) => {
                                    self.leased(&l)?;
                                    if std::mem::take(&mut first) && *ack_first {
                                        let r = self
                                            .svc
                                            .ack(Request::new(pb::AckRequest {
                                                result: Vec::new(),
                                                job_id: l.job.map(|j| j.id).unwrap_or_default(),
                                                lease_id: l.lease_id,
                                            }))
                                            .await;
                                        // The lease may be 10ms and have expired.
                                        let code = code_of(&r);
                                        prop_assert!(
                                            [Code::Ok, Code::Aborted].contains(&code),
                                            "ack of a pushed lease: {:?}",
                                            r.err()
                                        );
                                    }
                                }
                                Some(Event::Revoked(_)) => {}
                                None => return Err(TestCaseError::fail("an empty LeaseEvent")),
                            },
                            Ok(Some(Err(s))) => {
                                prop_assert!(
                                    ![Code::Internal, Code::Unknown].contains(&s.code()),
                                    "Lease stream error {:?}",
                                    s
                                );
                            }
                            Ok(None) => break,
                            Err(_elapsed) => break,
                        }
                    }
                    drop(stream);
                    self.quiesce().await?;
                }
                ("Lease", TAKE, v, code)
            }
            Op::Cancel { id, reason } => {
                let id = self.id(id);
                // The reason is never refused for its text (the rule of a
                // Fail's error): cut and mended, as the job keeps it.
                let v = id_v(&id);
                let req = pb::CancelJobRequest {
                    id,
                    reason: reason.clone(),
                };
                let r = self.svc.cancel_job(Request::new(req)).await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let job = r.into_inner().job.expect("cancel returns the job");
                    prop_assert_eq!(job.status, pb::JobStatus::Failed as i32);
                    prop_assert!(job.last_error.starts_with("cancelled"));
                    prop_assert!(job.last_error.len() <= LIMITS.max_error_bytes);
                    prop_assert!(!job.last_error.contains('\0'), "a NUL is stored");
                }
                ("CancelJob", OPERATE, v, code)
            }
            Op::Pause(queue) => {
                let v = name_v(queue);
                let req = pb::PauseQueueRequest {
                    queue: queue.clone(),
                };
                let code = code_of(&self.svc.pause_queue(Request::new(req)).await);
                if v == V::Valid {
                    let full = self.paused.len() >= LIMITS.max_paused_queues;
                    let expected = match self.paused.contains(queue) || !full {
                        true => Code::Ok,
                        false => Code::ResourceExhausted,
                    };
                    prop_assert_eq!(
                        code,
                        expected,
                        "pause {:?} with {:?} paused",
                        queue,
                        &self.paused
                    );
                    if code == Code::Ok {
                        self.paused.insert(queue.clone());
                    }
                }
                ("PauseQueue", PAUSE, v, code)
            }
            Op::Resume(queue) => {
                let v = name_v(queue);
                let req = pb::ResumeQueueRequest {
                    queue: queue.clone(),
                };
                let code = code_of(&self.svc.resume_queue(Request::new(req)).await);
                if code == Code::Ok {
                    self.paused.remove(queue);
                }
                ("ResumeQueue", READ, v, code)
            }
            Op::SetPolicy {
                queue,
                max_running,
                group_max_running,
                rate,
                group_rate,
            } => {
                let most = jobq_server::policy::MOST_RUNNING;
                let v = all([
                    name_v(queue),
                    bad_if(*max_running > most),
                    bad_if(*group_max_running > most),
                    rate_v(rate),
                    rate_v(group_rate),
                ]);
                let req = pb::SetQueuePolicyRequest {
                    queue: queue.clone(),
                    policy: Some(pb::QueuePolicy {
                        max_running: *max_running,
                        group_max_running: *group_max_running,
                        rate: rate.map(rate_pb),
                        group_rate: group_rate.map(rate_pb),
                    }),
                };
                let code = code_of(&self.svc.set_queue_policy(Request::new(req)).await);
                let rated = rate.is_some_and(|(limit, _, _)| limit > 0)
                    || group_rate.is_some_and(|(limit, _, _)| limit > 0);
                let clears = *max_running == 0 && *group_max_running == 0 && !rated;
                if v == V::Valid {
                    let full = self.policies.len() >= LIMITS.max_queue_policies;
                    let expected = match clears || self.policies.contains(queue) || !full {
                        true => Code::Ok,
                        false => Code::ResourceExhausted,
                    };
                    prop_assert_eq!(
                        code,
                        expected,
                        "policy of {:?} with {:?}",
                        queue,
                        &self.policies
                    );
                }
                if code == Code::Ok {
                    if clears {
                        self.policies.remove(queue);
                    } else {
                        self.policies.insert(queue.clone());
                    }
                    let got = self
                        .svc
                        .get_queue_policy(Request::new(pb::GetQueuePolicyRequest {
                            queue: queue.clone(),
                        }))
                        .await
                        .map_err(|s| TestCaseError::fail(format!("GetQueuePolicy: {s}")))?
                        .into_inner()
                        .policy
                        .unwrap_or_default();
                    prop_assert_eq!(
                        (got.max_running, got.group_max_running),
                        (*max_running, *group_max_running)
                    );
                }
                ("SetQueuePolicy", PAUSE, v, code)
            }
            Op::Delete(id) => {
                let id = self.id(id);
                let v = id_v(&id);
                let r = self
                    .svc
                    .delete_job(Request::new(pb::DeleteJobRequest { id }))
                    .await;
                ("DeleteJob", OPERATE, v, code_of(&r))
            }
            Op::Purge {
                queue,
                status,
                finished_before,
            } => {
                let nanos_ok = finished_before.is_none_or(|t| (0..=999_999_999).contains(&t.nanos));
                // timestamp.proto's range: 0001-01-01 to 9999-12-31.
                let seconds_ok = finished_before
                    .is_none_or(|t| (-62_135_596_800..=253_402_300_799).contains(&t.seconds));
                let v = all([
                    name_v(queue),
                    // PENDING, DONE, FAILED or both finished; RUNNING never.
                    bad_if(![0, 1, 3, 4].contains(status)),
                    // A PENDING job has not finished.
                    bad_if(*status == 1 && finished_before.is_some()),
                    bad_if(!nanos_ok),
                    bad_if(!seconds_ok),
                ]);
                let req = pb::PurgeJobsRequest {
                    queue: queue.clone(),
                    status: *status,
                    finished_before: *finished_before,
                };
                let r = self.svc.purge_jobs(Request::new(req)).await;
                ("PurgeJobs", READ, v, code_of(&r))
            }
            Op::CreateSchedule(g) => {
                let v = all([
                    name_v(&g.name),
                    bad_if(g.name.len() > 64),
                    name_v(&g.queue),
                    name_v(&g.kind),
                    bad_if(!g.cron.1),
                    bad_if(!g.timezone.1),
                    bad_if(g.max_attempts > LIMITS.max_attempts_limit),
                ]);
                let req = pb::CreateScheduleRequest {
                    name: g.name.clone(),
                    queue: g.queue.clone(),
                    kind: g.kind.clone(),
                    payload: Vec::new(),
                    cron: g.cron.0.into(),
                    timezone: g.timezone.0.into(),
                    max_attempts: g.max_attempts,
                };
                let r = self.svc.create_schedule(Request::new(req)).await;
                let code = code_of(&r);
                if let Ok(r) = r {
                    let s = r
                        .into_inner()
                        .schedule
                        .expect("create returns the schedule");
                    prop_assert_eq!(&s.name, &g.name);
                    prop_assert!(s.next_run_at.is_some(), "every generated cron ticks again");
                }
                ("CreateSchedule", SCHEDULE, v, code)
            }
            Op::DeleteSchedule(name) => {
                let v = all([name_v(name), bad_if(name.len() > 64)]);
                let req = pb::DeleteScheduleRequest { name: name.clone() };
                let r = self.svc.delete_schedule(Request::new(req)).await;
                ("DeleteSchedule", GET, v, code_of(&r))
            }
            Op::ListSchedules => {
                let r = self
                    .svc
                    .list_schedules(Request::new(pb::ListSchedulesRequest {}))
                    .await;
                ("ListSchedules", READ, V::Valid, code_of(&r))
            }
        })
    }
}

impl Snapshot {
    /// What must hold of any store, whatever was sent to it.
    fn check(&self) -> Checked {
        let mut counts: BTreeMap<&str, [u64; 4]> = BTreeMap::new();
        let mut ids = std::collections::HashSet::new();
        for job in &self.jobs {
            prop_assert!(ids.insert(&job.id), "job {} listed twice", job.id);
            prop_assert!(
                job.attempts <= job.max_attempts,
                "attempts over max_attempts: {:?}",
                job
            );
            prop_assert!(
                job.snoozes <= job.max_snoozes,
                "snoozes over max_snoozes: {:?}",
                job
            );
            prop_assert!((1..=4).contains(&job.status), "status {}", job.status);
            prop_assert_eq!(name_v(&job.queue), V::Valid, "stored queue {:?}", job.queue);
            prop_assert!(job.payload.len() <= LIMITS.max_payload);
            let running = job.status == pb::JobStatus::Running as i32;
            prop_assert_eq!(
                running,
                job.lease_expires_at.is_some(),
                "lease_expires_at iff RUNNING: {:?}",
                job
            );
            counts.entry(&job.queue).or_default()[(job.status - 1) as usize] += 1;
        }
        let stats: BTreeMap<&str, [u64; 4]> = self
            .stats
            .iter()
            .map(|q| (q.queue.as_str(), [q.pending, q.running, q.done, q.failed]))
            .filter(|(_, c)| c.iter().any(|n| *n > 0))
            .collect();
        prop_assert_eq!(stats, counts, "Stats disagrees with ListJobs");
        Ok(())
    }
}

async fn run_case(ops: &[Op]) -> Checked {
    let mut h = Harness::new();
    for (step, op) in ops.iter().enumerate() {
        let panics = PANICS.load(Ordering::SeqCst);
        let before = h.snapshot().await?;
        let (rpc, allowed, verdict, code) = h.run(op).await?;
        let ctx = || format!("step {step}: {rpc} -> {code:?}, expected {verdict:?}");
        prop_assert!(
            !matches!(code, Code::Internal | Code::Unknown),
            "{}: bad input must never be a server error",
            ctx()
        );
        prop_assert!(
            allowed.contains(&code),
            "{}: not a code §2 allows for {}",
            ctx(),
            rpc
        );
        match verdict {
            V::Invalid => prop_assert_eq!(
                code,
                Code::InvalidArgument,
                "{}: malformed request accepted",
                ctx()
            ),
            V::Valid => prop_assert_ne!(
                code,
                Code::InvalidArgument,
                "{}: well-formed request refused",
                ctx()
            ),
        }
        if code != Code::Ok {
            let after = h.snapshot().await?;
            prop_assert_eq!(
                before,
                after,
                "{}: a rejected request changed the store",
                ctx()
            );
        }
        prop_assert_eq!(
            PANICS.load(Ordering::SeqCst),
            panics,
            "{}: something panicked",
            ctx()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn hostile_requests_never_panic_err_internally_or_change_state(ops in prop::collection::vec(op(), 20..40)) {
        count_panics();
        let panics = PANICS.load(Ordering::SeqCst);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(run_case(&ops))?;
        // Tasks still alive (none should be) are dropped here.
        drop(runtime);
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), panics, "something panicked");
    }
}

// ---------------------------------------------------------------------------
// Auth headers.

/// The tokens of the auth property: `root` may do everything; `narrow`
/// produces, consumes and reads `emails` only.
const ROOT_SECRET: &str = "root-secret-0123456789";
const NARROW_SECRET: &str = "narrow-secret-0123456789";

fn fuzz_tokens() -> Auth {
    let text = format!(
        "[[token]]\nname='root'\nsha256='{}'\nqueues=['*']\nroles=['admin']\n\
         [[token]]\nname='narrow'\nsha256='{}'\nqueues=['emails']\nroles=['produce','consume','read']\n",
        digest_hex(ROOT_SECRET),
        digest_hex(NARROW_SECRET)
    );
    Auth::from_tokens(Tokens::parse(&text).expect("tokens"))
}

/// An `authorization` header, as a client might send it.
#[derive(Debug, Clone)]
enum HeaderGen {
    /// No header.
    Missing,
    /// Arbitrary bytes (those a header value can carry at all).
    Raw(Vec<u8>),
    /// `<scheme> <secret>` with a made-up secret.
    Unknown(String, String),
    /// A known secret under a scheme spelled some way.
    Known { narrow: bool, scheme: String },
}

impl HeaderGen {
    /// Whether the header names a known token: `Some(narrow)`.
    fn token(&self) -> Option<bool> {
        match self {
            HeaderGen::Known { narrow, scheme } if scheme.eq_ignore_ascii_case("bearer") => {
                Some(*narrow)
            }
            _ => None,
        }
    }
}

fn header() -> BoxedStrategy<HeaderGen> {
    prop_oneof![
        1 => Just(HeaderGen::Missing),
        2 => prop::collection::vec(any::<u8>(), 0..80).prop_map(HeaderGen::Raw),
        2 => (prop_oneof![Just("Bearer".to_owned()), Just("bearer".to_owned()), "[A-Za-z]{0,8}"], "[ -~]{0,70}")
            .prop_map(|(scheme, secret)| HeaderGen::Unknown(scheme, secret)),
        4 => (any::<bool>(), prop_oneof![3 => Just("Bearer".to_owned()), 1 => Just("BEARER".to_owned()), 1 => Just("Basic".to_owned()), 1 => Just(String::new())])
            .prop_map(|(narrow, scheme)| HeaderGen::Known { narrow, scheme }),
    ]
    .boxed()
}

/// What the call does: (rpc, queue it touches when known up front).
#[derive(Debug, Clone)]
enum AuthCall {
    Enqueue(&'static str),
    Dequeue(&'static str),
    Stats(&'static str),
    ListAll,
    GetJob(usize),
    Ack(usize),
    Retry(usize),
}

fn auth_call() -> BoxedStrategy<AuthCall> {
    let queue = select(&QUEUES[..2]);
    prop_oneof![
        3 => queue.clone().prop_map(AuthCall::Enqueue),
        2 => queue.clone().prop_map(AuthCall::Dequeue),
        1 => queue.prop_map(AuthCall::Stats),
        1 => Just(AuthCall::ListAll),
        1 => any::<usize>().prop_map(AuthCall::GetJob),
        2 => any::<usize>().prop_map(AuthCall::Ack),
        1 => any::<usize>().prop_map(AuthCall::Retry),
    ]
    .boxed()
}

/// Runs `msg` through the interceptor with `header`, then `call` on it.
fn intercepted<T>(auth: &Auth, header: &HeaderGen, msg: T) -> Result<Request<T>, Status> {
    use tonic::service::Interceptor;
    let mut req = Request::new(());
    let value: Option<Vec<u8>> = match header {
        HeaderGen::Missing => None,
        HeaderGen::Raw(bytes) => Some(bytes.clone()),
        HeaderGen::Unknown(scheme, secret) => Some(format!("{scheme} {secret}").into_bytes()),
        HeaderGen::Known { narrow, scheme } => {
            let secret = if *narrow { NARROW_SECRET } else { ROOT_SECRET };
            Some(format!("{scheme} {secret}").into_bytes())
        }
    };
    if let Some(bytes) = value {
        // Bytes no header can carry never reach the server.
        if let Ok(v) = tonic::metadata::AsciiMetadataValue::try_from(bytes.as_slice()) {
            req.metadata_mut().insert("authorization", v);
        }
    }
    let (metadata, extensions, ()) = auth.clone().call(req)?.into_parts();
    Ok(Request::from_parts(metadata, extensions, msg))
}

async fn run_auth_case(calls: &[(HeaderGen, AuthCall)]) -> Checked {
    let auth = fuzz_tokens();
    let mut h = Harness::new();
    h.svc = {
        let dir = h._dir.path().join("auth");
        let config = Arc::new(config(&dir));
        let store = Arc::new(SledStore::open(&config).expect("open the store"));
        let shutdown = CancellationToken::new();
        h.hub = LeaseHub::new(Arc::clone(&store), Arc::clone(&config), shutdown.clone());
        JobQueueService::new(store, Arc::clone(&h.hub), config, shutdown).with_auth(auth.clone())
    };
    h.root = auth.authenticate_secret(Some(ROOT_SECRET)).expect("root");
    let mut queue_of: BTreeMap<String, &'static str> = BTreeMap::new();
    // Which token took each lease: Some(narrow).
    let mut taker: BTreeMap<(String, String), bool> = BTreeMap::new();
    for (step, (header, call)) in calls.iter().enumerate() {
        let panics = PANICS.load(Ordering::SeqCst);
        let before = h.snapshot().await?;
        let job = |i: usize| pick(&h.jobs, i).unwrap_or_else(|| "1".into());
        let lease = |i: usize| pick(&h.leases, i).unwrap_or_else(|| ("1".into(), "1".into()));
        // The queue the call touches, when the test can know it.
        let (code, queue) = match call {
            AuthCall::Enqueue(q) => {
                let msg = pb::EnqueueRequest {
                    queue: (*q).into(),
                    kind: "k".into(),
                    ..Default::default()
                };
                let r = match intercepted(&auth, header, msg) {
                    Ok(req) => h.svc.enqueue(req).await,
                    Err(s) => Err(s),
                };
                if let Ok(resp) = &r {
                    let id = resp
                        .get_ref()
                        .job
                        .as_ref()
                        .map(|j| j.id.clone())
                        .unwrap_or_default();
                    queue_of.insert(id.clone(), q);
                    h.jobs.push(id);
                }
                (code_of(&r), Some(*q))
            }
            AuthCall::Dequeue(q) => {
                let msg = pb::DequeueRequest {
                    queues: vec![(*q).into()],
                    worker_id: "w".into(),
                    ..Default::default()
                };
                let r = match intercepted(&auth, header, msg) {
                    Ok(req) => h.svc.dequeue(req).await,
                    Err(s) => Err(s),
                };
                if let Ok(resp) = &r {
                    if let Some(l) = &resp.get_ref().leased {
                        let id = l.job.as_ref().map(|j| j.id.clone()).unwrap_or_default();
                        if let Some(narrow) = header.token() {
                            taker.insert((id.clone(), l.lease_id.clone()), narrow);
                        }
                        h.leases.push((id, l.lease_id.clone()));
                    }
                }
                (code_of(&r), Some(*q))
            }
            AuthCall::Stats(q) => {
                let r = match intercepted(&auth, header, pb::StatsRequest { queue: (*q).into() }) {
                    Ok(req) => h.svc.stats(req).await,
                    Err(s) => Err(s),
                };
                (code_of(&r), Some(*q))
            }
            AuthCall::ListAll => {
                let r = match intercepted(&auth, header, pb::ListJobsRequest::default()) {
                    Ok(req) => h.svc.list_jobs(req).await,
                    Err(s) => Err(s),
                };
                // Across queues: needs read on every queue, so the narrow
                // token is outside (its page tokens would name other
                // queues' jobs).
                (code_of(&r), Some("every-queue"))
            }
            AuthCall::GetJob(i) => {
                let id = job(*i);
                let q = queue_of.get(&id).copied();
                let r = match intercepted(&auth, header, pb::GetJobRequest { id }) {
                    Ok(req) => h.svc.get_job(req).await,
                    Err(s) => Err(s),
                };
                (code_of(&r), q)
            }
            AuthCall::Ack(i) => {
                let (job_id, lease_id) = lease(*i);
                let q = queue_of.get(&job_id).copied();
                let other = taker
                    .get(&(job_id.clone(), lease_id.clone()))
                    .is_some_and(|&narrow| Some(narrow) != header.token());
                let r = match intercepted(
                    &auth,
                    header,
                    pb::AckRequest {
                        result: Vec::new(),
                        job_id,
                        lease_id,
                    },
                ) {
                    Ok(req) => h.svc.ack(req).await,
                    Err(s) => Err(s),
                };
                let code = code_of(&r);
                // Another token's lease is never acked (PERMISSION_DENIED
                // while it is held; ABORTED or FAILED_PRECONDITION after).
                prop_assert!(
                    !(other && code == Code::Ok),
                    "step {step}: a token acked another token's lease"
                );
                if other && header.token().is_some() {
                    // Scope checks below do not apply: the owner check may
                    // answer PERMISSION_DENIED for an in-scope token.
                    if code == Code::PermissionDenied {
                        prop_assert_eq!(
                            &before,
                            &h.snapshot().await?,
                            "step {}: denied ack changed the store",
                            step
                        );
                    }
                    continue;
                }
                (code, q)
            }
            AuthCall::Retry(i) => {
                let job_id = job(*i);
                let r = match intercepted(&auth, header, pb::RetryRequest { job_id }) {
                    Ok(req) => h.svc.retry(req).await,
                    Err(s) => Err(s),
                };
                // Retry is admin-only: narrow is always outside, whether
                // or not the id names a job (a token with no admin role
                // anywhere cannot probe which ids exist).
                (code_of(&r), Some("admin-only"))
            }
        };
        let ctx = || format!("step {step}: {call:?} with {header:?} -> {code:?}");
        prop_assert!(!matches!(code, Code::Internal | Code::Unknown), "{}", ctx());
        match header.token() {
            None => prop_assert_eq!(code, Code::Unauthenticated, "{}", ctx()),
            Some(narrow) => {
                prop_assert_ne!(code, Code::Unauthenticated, "{}", ctx());
                let outside = narrow && queue.is_some_and(|q| q != "emails");
                // A job named by id in a queue the token may not read is,
                // to it, a job that does not exist.
                let by_id = matches!(call, AuthCall::GetJob(_) | AuthCall::Ack(_));
                if outside && by_id {
                    prop_assert_eq!(code, Code::NotFound, "{}", ctx());
                } else if outside {
                    prop_assert_eq!(code, Code::PermissionDenied, "{}", ctx());
                } else {
                    prop_assert_ne!(code, Code::PermissionDenied, "{}", ctx());
                }
            }
        }
        if code != Code::Ok {
            let after = h.snapshot().await?;
            prop_assert_eq!(
                before,
                after,
                "{}: a rejected call changed the store",
                ctx()
            );
        }
        prop_assert_eq!(
            PANICS.load(Ordering::SeqCst),
            panics,
            "{}: something panicked",
            ctx()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, max_shrink_iters: 1000, ..ProptestConfig::default() })]

    #[test]
    fn hostile_auth_headers_are_unauthenticated_and_scopes_hold(
        calls in prop::collection::vec((header(), auth_call()), 10..30)
    ) {
        count_panics();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(run_auth_case(&calls))?;
    }
}
