//! Prometheus metrics (text exposition format, `prometheus-client`).
//!
//! Facts are counted where they happen, once: the store publishes every
//! applied change ([`Fact`]) and [`Metrics::observe`] derives the counters
//! from it; nothing is counted in the gRPC glue. The gauges (`jobq_jobs`,
//! the oldest pending age, open streams) are read from the same `Stats`
//! call the gRPC service answers, at scrape time, so they agree with it.
//! Labels are queue names, statuses, reasons and RPC method names — never
//! job ids — so their cardinality stays bounded.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};

use crate::{
    error::Result,
    job::{Job, Outcome, Status},
    store::{Fact, QueueStats},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStatus {
    queue: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueReason {
    queue: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodCode {
    method: String,
    code: String,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 1 ms .. ~65 s.
    exponential_buckets(0.001, 2.0, 17)
}

fn new_seconds_histogram() -> Histogram {
    Histogram::new(seconds_buckets())
}

/// The RPC methods of `jobq.v1.JobQueue`: the only values of the `method`
/// label (anything else is `unknown`), so a client cannot grow it.
const METHODS: &[&str] = &[
    "Enqueue",
    "EnqueueBatch",
    "Dequeue",
    "Ack",
    "Fail",
    "Retry",
    "Lease",
    "Heartbeat",
    "GetJob",
    "WatchJob",
    "ListJobs",
    "Stats",
    "CancelJob",
    "PauseQueue",
    "ResumeQueue",
    "SetQueuePolicy",
    "GetQueuePolicy",
    "DeleteJob",
    "PurgeJobs",
    "CreateSchedule",
    "DeleteSchedule",
    "ListSchedules",
];

/// Every metric of the server.
pub struct Metrics {
    registry: Registry,
    jobs: Family<QueueStatus, Gauge>,
    oldest_pending: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    held: Family<QueueReason, Gauge>,
    enqueued: Family<QueueLabel, Counter>,
    acked: Family<QueueLabel, Counter>,
    failed_attempts: Family<QueueLabel, Counter>,
    snoozed: Family<QueueLabel, Counter>,
    dead_lettered: Family<QueueLabel, Counter>,
    reclaimed: Family<QueueReason, Counter>,
    lease_streams: Gauge,
    rpc_duration: Family<MethodCode, Histogram>,
    commit_duration: Histogram,
    commit_batch: Histogram,
    job_wait: Family<QueueLabel, Histogram>,
    job_run: Family<QueueLabel, Histogram>,
    /// `pg_notification_queue_usage()`, on PostgreSQL only.
    notification_queue: Option<Gauge<f64, AtomicU64>>,
    /// Serializes scrapes: the gauges are cleared and refilled per scrape.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every jobq metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let jobs = Family::<QueueStatus, Gauge>::default();
        let oldest_pending = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
        let held = Family::<QueueReason, Gauge>::default();
        let enqueued = Family::<QueueLabel, Counter>::default();
        let acked = Family::<QueueLabel, Counter>::default();
        let failed_attempts = Family::<QueueLabel, Counter>::default();
        let snoozed = Family::<QueueLabel, Counter>::default();
        let dead_lettered = Family::<QueueLabel, Counter>::default();
        let reclaimed = Family::<QueueReason, Counter>::default();
        let lease_streams = Gauge::default();
        let rpc_duration = Family::<MethodCode, Histogram>::new_with_constructor(
            new_seconds_histogram as fn() -> Histogram,
        );
        let commit_duration = new_seconds_histogram();
        let commit_batch = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        let job_wait = Family::<QueueLabel, Histogram>::new_with_constructor(
            new_seconds_histogram as fn() -> Histogram,
        );
        let job_run = Family::<QueueLabel, Histogram>::new_with_constructor(
            new_seconds_histogram as fn() -> Histogram,
        );
        registry.register(
            "jobq_jobs",
            "Jobs retained, by queue and status (as Stats reports them)",
            jobs.clone(),
        );
        registry.register(
            "jobq_oldest_pending_age_seconds",
            "Age of the oldest due PENDING job, by queue",
            oldest_pending.clone(),
        );
        registry.register(
            "jobq_jobs_held",
            "Due PENDING jobs a queue policy holds back, by queue and reason \
             (max_running, group_max_running, rate, group_rate); queues with a policy only",
            held.clone(),
        );
        registry.register(
            "jobq_enqueued",
            "Jobs created by Enqueue and EnqueueBatch",
            enqueued.clone(),
        );
        registry.register("jobq_acked", "Jobs acknowledged (DONE)", acked.clone());
        registry.register(
            "jobq_failed_attempts",
            "Attempts that ended with a worker's Fail",
            failed_attempts.clone(),
        );
        registry.register(
            "jobq_snoozed",
            "Attempts a worker put back without counting them (a snooze)",
            snoozed.clone(),
        );
        registry.register(
            "jobq_dead_lettered",
            "Jobs that became FAILED (dead letters)",
            dead_lettered.clone(),
        );
        registry.register(
            "jobq_reclaimed",
            "Leases taken back from workers, by reason",
            reclaimed.clone(),
        );
        registry.register(
            "jobq_lease_streams",
            "Open Lease streams",
            lease_streams.clone(),
        );
        registry.register(
            "jobq_rpc_duration_seconds",
            "JobQueue RPCs, from request to response headers, by method and status code",
            rpc_duration.clone(),
        );
        registry.register(
            "jobq_commit_duration_seconds",
            "Group-commit rounds (flush and fsync)",
            commit_duration.clone(),
        );
        registry.register(
            "jobq_commit_batch_size",
            "Durable writes that one group-commit round covered",
            commit_batch.clone(),
        );
        registry.register(
            "jobq_job_wait_seconds",
            "From enqueue to take",
            job_wait.clone(),
        );
        registry.register("jobq_job_run_seconds", "From take to ack", job_run.clone());
        Metrics {
            registry,
            jobs,
            oldest_pending,
            held,
            enqueued,
            acked,
            failed_attempts,
            snoozed,
            dead_lettered,
            reclaimed,
            lease_streams,
            rpc_duration,
            commit_duration,
            commit_batch,
            job_wait,
            job_run,
            notification_queue: None,
            scrape: Mutex::new(()),
        }
    }

    /// Adds the gauge of how full the database's notification queue is
    /// (for a server on PostgreSQL): the LISTEN sessions of every server
    /// share that queue, and one session that stops reading (a frozen
    /// server) fills it until NOTIFY fails, and with it every enqueue.
    #[must_use]
    pub fn with_notification_queue(mut self) -> Metrics {
        let gauge = Gauge::<f64, AtomicU64>::default();
        self.registry.register(
            "jobq_pg_notification_queue_usage",
            "How full PostgreSQL's notification queue is, from 0 to 1 (pg_notification_queue_usage())",
            gauge.clone(),
        );
        self.notification_queue = Some(gauge);
        self
    }

    /// Sets how full the notification queue is (see
    /// [`Metrics::with_notification_queue`]); nothing without that gauge.
    pub fn notification_queue_usage(&self, usage: f64) {
        if let Some(gauge) = &self.notification_queue {
            gauge.set(usage);
        }
    }

    fn queue(job: &Job) -> QueueLabel {
        QueueLabel {
            queue: job.queue.clone(),
        }
    }

    /// Counts what a change of the store means.
    pub fn observe(&self, fact: &Fact<'_>) {
        match *fact {
            Fact::Created(job) => {
                self.enqueued.get_or_create(&Self::queue(job)).inc();
            }
            Fact::Changed { old, new } => self.changed(old, new),
        }
    }

    fn changed(&self, old: &Job, new: &Job) {
        let queue = Self::queue(new);
        if let (Status::Pending, Some(lease)) = (old.status, new.lease.as_ref()) {
            let wait = lease
                .taken_at
                .duration_since(new.enqueued_at)
                .unwrap_or_default();
            self.job_wait
                .get_or_create(&queue)
                .observe(wait.as_secs_f64());
        }
        if let Some(lease) = old.lease.as_ref().filter(|l| new.lease_id() != Some(l.id)) {
            let ended = new.history.iter().rev().find(|a| a.lease_id == lease.id);
            match ended.and_then(|a| a.outcome) {
                Some(Outcome::Acked) => {
                    self.acked.get_or_create(&queue).inc();
                    let run = ended
                        .and_then(|a| a.ended_at)
                        .and_then(|end| end.duration_since(lease.taken_at).ok())
                        .unwrap_or_default();
                    self.job_run
                        .get_or_create(&queue)
                        .observe(run.as_secs_f64());
                }
                Some(Outcome::Failed) => {
                    self.failed_attempts.get_or_create(&queue).inc();
                }
                Some(Outcome::Snoozed) => {
                    self.snoozed.get_or_create(&queue).inc();
                }
                Some(
                    outcome @ (Outcome::LeaseExpired
                    | Outcome::WorkerDisconnected
                    | Outcome::Revoked),
                ) => {
                    let reason = match outcome {
                        Outcome::LeaseExpired => "lease_expired",
                        Outcome::WorkerDisconnected => "worker_disconnected",
                        _ => "revoked",
                    };
                    self.reclaimed
                        .get_or_create(&QueueReason {
                            queue: new.queue.clone(),
                            reason: reason.into(),
                        })
                        .inc();
                }
                // A take undone (never delivered): no attempt, nothing to count.
                None => {}
            }
        }
        if new.status == Status::Failed && old.status != Status::Failed {
            self.dead_lettered.get_or_create(&queue).inc();
        }
    }

    /// Records one JobQueue RPC.
    pub fn rpc(&self, method: &str, code: tonic::Code, took: Duration) {
        let method = known_method(method);
        self.rpc_duration
            .get_or_create(&MethodCode {
                method: method.into(),
                code: jobq::code_name(code).into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records one group-commit round.
    pub fn commit(&self, took: Duration, batch: u64) {
        self.commit_duration.observe(took.as_secs_f64());
        #[allow(clippy::cast_precision_loss)]
        self.commit_batch.observe(batch as f64);
    }

    /// The exposition text, with the gauges refreshed from `stats` (the
    /// same numbers `Stats` returns) and `streams` open Lease streams.
    ///
    /// # Errors
    /// Never in practice; formatting into a string cannot fail.
    pub fn render(&self, stats: &[QueueStats], streams: usize, format: Format) -> Result<String> {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.jobs.clear();
        self.oldest_pending.clear();
        self.held.clear();
        for s in stats {
            if !s.policy.is_empty() {
                for (reason, n) in [
                    ("max_running", s.held_max_running),
                    ("group_max_running", s.held_group_max_running),
                    ("rate", s.held_rate),
                    ("group_rate", s.held_group_rate),
                ] {
                    self.held
                        .get_or_create(&QueueReason {
                            queue: s.queue.clone(),
                            reason: reason.into(),
                        })
                        .set(i64::try_from(n).unwrap_or(i64::MAX));
                }
            }
            for (status, n) in [
                ("pending", s.pending),
                ("running", s.running),
                ("done", s.done),
                ("failed", s.failed),
            ] {
                self.jobs
                    .get_or_create(&QueueStatus {
                        queue: s.queue.clone(),
                        status: status.into(),
                    })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            self.oldest_pending
                .get_or_create(&QueueLabel {
                    queue: s.queue.clone(),
                })
                .set(s.oldest_pending_age.unwrap_or_default().as_secs_f64());
        }
        self.lease_streams
            .set(i64::try_from(streams).unwrap_or(i64::MAX));
        let mut out = String::new();
        encode(&mut out, &self.registry)
            .map_err(|e| crate::Error::Io(format!("encoding metrics: {e}")))?;
        Ok(match format {
            Format::OpenMetrics => out,
            Format::Prometheus => classic_text(&out),
        })
    }
}

/// The two text formats a scraper may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, which Prometheus asks for in its `Accept` header.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4: what `curl` and
    /// `promtool check metrics` read.
    Prometheus,
}

impl Format {
    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// The format an `Accept` header asks for.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }
}

/// OpenMetrics text as classic Prometheus text: a counter family is named
/// with its `_total` suffix in `# HELP`/`# TYPE` (OpenMetrics names the
/// family without it), and the OpenMetrics-only `# UNIT` and `# EOF` lines go.
fn classic_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + 16 * counters.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let total = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                out.push_str(prefix);
                out.push_str(name);
                out.push_str(total);
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// `method` if it is a JobQueue method, else `unknown`: a caller cannot
/// mint label values.
pub fn known_method(method: &str) -> &str {
    if METHODS.contains(&method) {
        method
    } else {
        "unknown"
    }
}

/// Counts enqueues and acks over time for the dashboard's rates: one
/// sample every few seconds, the last ten minutes kept.
pub struct Rates {
    samples: Mutex<std::collections::VecDeque<(Instant, u64, u64)>>,
    enqueued: AtomicU64,
    acked: AtomicU64,
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            samples: Mutex::new(std::collections::VecDeque::new()),
            enqueued: AtomicU64::new(0),
            acked: AtomicU64::new(0),
        }
    }
}

/// Per-minute rates over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rate {
    /// Jobs enqueued per minute.
    pub enqueued: f64,
    /// Jobs acked per minute.
    pub acked: f64,
}

impl Rates {
    const KEEP: Duration = Duration::from_secs(600);

    /// Counts a change (all queues together).
    pub fn observe(&self, fact: &Fact<'_>) {
        match *fact {
            Fact::Created(_) => {
                self.enqueued.fetch_add(1, Ordering::Relaxed);
            }
            Fact::Changed { old, new } => {
                if old.status == Status::Running && new.status == Status::Done {
                    self.acked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Takes a sample now (the server does every few seconds).
    pub fn sample(&self) {
        let now = Instant::now();
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push_back((
            now,
            self.enqueued.load(Ordering::Relaxed),
            self.acked.load(Ordering::Relaxed),
        ));
        while samples
            .front()
            .is_some_and(|(at, _, _)| now.duration_since(*at) > Self::KEEP)
        {
            samples.pop_front();
        }
    }

    /// Rates over the last `window` (or as much of it as was sampled).
    pub fn over(&self, window: Duration) -> Rate {
        let now = Instant::now();
        let (enqueued, acked) = (
            self.enqueued.load(Ordering::Relaxed),
            self.acked.load(Ordering::Relaxed),
        );
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let Some(&(at, e0, a0)) = samples
            .iter()
            .find(|(at, _, _)| now.duration_since(*at) <= window)
        else {
            return Rate::default();
        };
        let minutes = now.duration_since(at).as_secs_f64() / 60.0;
        if minutes <= 0.0 {
            return Rate::default();
        }
        #[allow(clippy::cast_precision_loss)]
        Rate {
            enqueued: (enqueued - e0) as f64 / minutes,
            acked: (acked - a0) as f64 / minutes,
        }
    }
}

/// Seconds since `t`, for display.
pub fn age(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counter_families_with_total_and_drops_eof() {
        let open = "# HELP jobq_acked Jobs acknowledged.\n# TYPE jobq_acked counter\n\
                    jobq_acked_total{queue=\"q\"} 3\n# HELP jobq_lease_streams Open streams.\n\
                    # TYPE jobq_lease_streams gauge\njobq_lease_streams 1\n# EOF\n";
        assert_eq!(
            classic_text(open),
            "# HELP jobq_acked_total Jobs acknowledged.\n# TYPE jobq_acked_total counter\n\
             jobq_acked_total{queue=\"q\"} 3\n# HELP jobq_lease_streams Open streams.\n\
             # TYPE jobq_lease_streams gauge\njobq_lease_streams 1\n"
        );
    }

    #[test]
    fn prometheus_gets_openmetrics_and_curl_gets_classic_text() {
        let prometheus =
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Prometheus);
        assert_eq!(Format::negotiate(None), Format::Prometheus);
    }
}
