//! The Worker's own Prometheus metrics, behind the `metrics` cargo feature:
//!
//! - `jobq_worker_jobs_total{kind,outcome}`: handler runs by how they ended
//!   (`acked`, `failed`, `fatal`, `snoozed` when the handler asked for a
//!   snooze, `given_back` when the drain deadline cut it off and the job
//!   went back without spending an attempt, `abandoned` when the lease was
//!   lost or the give-back did not get through, `rejected` when the server
//!   refused the ack or fail because the lease had moved on);
//! - `jobq_worker_handler_duration_seconds{kind}`: how long handlers ran;
//! - `jobq_worker_leases_lost_total{reason}`: `heartbeat` (the server said
//!   lost), `revoked` (on the stream), `deadline` (no heartbeat got through
//!   before the lease ran out), `aborted` (the ack or fail was refused).
//!
//! `kind` is a kind with its own handler, or `other`: job data cannot mint
//! label values. Without the feature the recorder is a no-op.

/// How a handler run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum Outcome {
    Acked,
    Failed,
    Fatal,
    Snoozed,
    GivenBack,
    Abandoned,
    Rejected,
}

/// Why the worker lost a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum Lost {
    Heartbeat,
    Revoked,
    Deadline,
    Aborted,
}

#[cfg(feature = "metrics")]
mod imp {
    use std::{sync::Arc, time::Duration};

    use prometheus_client::{
        encoding::EncodeLabelSet,
        metrics::{
            counter::Counter,
            family::Family,
            histogram::{exponential_buckets, Histogram},
        },
        registry::Registry,
    };

    use super::{Lost, Outcome};

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct KindOutcome {
        kind: String,
        outcome: &'static str,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct KindLabel {
        kind: String,
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Reason {
        reason: &'static str,
    }

    #[derive(Debug)]
    struct Inner {
        jobs: Family<KindOutcome, Counter>,
        duration: Family<KindLabel, Histogram>,
        lost: Family<Reason, Counter>,
    }

    /// Records into the registry given to `WorkerBuilder::metrics`.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Recorder(Option<Arc<Inner>>);

    fn seconds() -> Histogram {
        Histogram::new(exponential_buckets(0.001, 2.0, 20))
    }

    impl Recorder {
        pub(crate) fn register(registry: &mut Registry) -> Recorder {
            let inner = Inner {
                jobs: Family::default(),
                duration: Family::new_with_constructor(seconds as fn() -> Histogram),
                lost: Family::default(),
            };
            registry.register(
                "jobq_worker_jobs",
                "Handler runs by kind and how they ended",
                inner.jobs.clone(),
            );
            registry.register(
                "jobq_worker_handler_duration_seconds",
                "How long handlers ran, by kind",
                inner.duration.clone(),
            );
            registry.register(
                "jobq_worker_leases_lost",
                "Leases this worker lost, by reason",
                inner.lost.clone(),
            );
            Recorder(Some(Arc::new(inner)))
        }

        pub(crate) fn job(&self, kind: &str, outcome: Outcome) {
            if let Some(m) = &self.0 {
                let outcome = match outcome {
                    Outcome::Acked => "acked",
                    Outcome::Failed => "failed",
                    Outcome::Fatal => "fatal",
                    Outcome::Snoozed => "snoozed",
                    Outcome::GivenBack => "given_back",
                    Outcome::Abandoned => "abandoned",
                    Outcome::Rejected => "rejected",
                };
                m.jobs
                    .get_or_create(&KindOutcome {
                        kind: kind.to_owned(),
                        outcome,
                    })
                    .inc();
            }
        }

        pub(crate) fn handler_ran(&self, kind: &str, took: Duration) {
            if let Some(m) = &self.0 {
                m.duration
                    .get_or_create(&KindLabel {
                        kind: kind.to_owned(),
                    })
                    .observe(took.as_secs_f64());
            }
        }

        pub(crate) fn lease_lost(&self, why: Lost) {
            if let Some(m) = &self.0 {
                let reason = match why {
                    Lost::Heartbeat => "heartbeat",
                    Lost::Revoked => "revoked",
                    Lost::Deadline => "deadline",
                    Lost::Aborted => "aborted",
                };
                m.lost.get_or_create(&Reason { reason }).inc();
            }
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use std::time::Duration;

    use super::{Lost, Outcome};

    /// Without the `metrics` feature: records nothing.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Recorder;

    impl Recorder {
        pub(crate) fn job(&self, _kind: &str, _outcome: Outcome) {}
        pub(crate) fn handler_ran(&self, _kind: &str, _took: Duration) {}
        pub(crate) fn lease_lost(&self, _why: Lost) {}
    }
}

pub(crate) use imp::Recorder;
