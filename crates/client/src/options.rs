//! Per-call options: [`EnqueueOptions`] (a builder) and [`FailOptions`].

use std::{collections::BTreeMap, time::Duration};

use jobq::pb;

use crate::{client::pb_duration, model::KeyScope, trace};

/// The optional parts of an enqueue: domain key, attempt limit, delay and
/// metadata.
///
/// ```
/// use std::time::Duration;
/// use jobq_client::EnqueueOptions;
///
/// let opts = EnqueueOptions::new()
///     .key("order-4711")
///     .max_attempts(5)
///     .delay(Duration::from_secs(30));
/// assert_eq!(opts.get_key(), Some("order-4711"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnqueueOptions {
    key: Option<String>,
    max_attempts: Option<u32>,
    delay: Option<Duration>,
    priority: i32,
    metadata: BTreeMap<String, String>,
    group: Option<String>,
    max_snoozes: Option<u32>,
    key_scope: KeyScope,
    replace: bool,
    unique_for: Option<Duration>,
}

impl EnqueueOptions {
    /// No key, the server's default attempt limit, due at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the domain key (e.g. `order-4711`). At most one retained job per
    /// (queue, key) exists: enqueueing again returns the existing job with
    /// `created == false`, which makes producer retries safe.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets how many attempts the job gets before it is dead-lettered
    /// (FAILED). Unset means the server default.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Which jobs hold the key against this enqueue: every retained job
    /// (the default), or with [`KeyScope::Active`] only PENDING and
    /// RUNNING ones ("unique until finished"); a job that no longer holds
    /// it loses it to this enqueue's new job. Needs a [`key`](Self::key).
    pub fn key_scope(mut self, scope: KeyScope) -> Self {
        self.key_scope = scope;
        self
    }

    /// Debounce: a PENDING job that holds the key takes this enqueue's
    /// payload and metadata and is due after its delay
    /// ([`EnqueueOutcome::Replaced`](crate::EnqueueOutcome::Replaced)); a
    /// RUNNING one gets a successor, a new job that takes the key over
    /// ([`EnqueueOutcome::Created`](crate::EnqueueOutcome::Created)); a
    /// finished one is returned unchanged. Needs a [`key`](Self::key).
    pub fn replace(mut self) -> Self {
        self.replace = true;
        self
    }

    /// Throttle: the key is held this long after its job's enqueue,
    /// whatever the job's state, and no longer. Needs a [`key`](Self::key).
    pub fn unique_for(mut self, window: Duration) -> Self {
        self.unique_for = Some(window);
        self
    }

    /// Sets how many times the job's handlers may snooze it
    /// ([`FailOptions::snooze`]) before a snooze counts as a failed
    /// attempt (0: none, every snooze counts). Unset means 100.
    pub fn max_snoozes(mut self, max_snoozes: u32) -> Self {
        self.max_snoozes = Some(max_snoozes);
        self
    }

    /// The snooze allowance set with [`max_snoozes`](Self::max_snoozes),
    /// if any.
    pub fn get_max_snoozes(&self) -> Option<u32> {
        self.max_snoozes
    }

    /// Makes the job due no earlier than `delay` from now.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Puts the job in a group (a tenant, a customer id; the key's name
    /// rules): a queue policy's `group_max_running` limits how many jobs
    /// of one group run at once, and with 1 they run one at a time, in
    /// enqueue order.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The group, if one is set.
    pub fn get_group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Sets the delivery priority, -100..=100 (default 0): among the due
    /// jobs of a queue, higher goes first.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Attaches a metadata entry (a request id, a tenant tag), stored with
    /// the job and returned as `Job.metadata`. The W3C `traceparent` and
    /// `tracestate` of the current span are added on their own when the
    /// application uses `tracing-opentelemetry`.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The metadata set with [`metadata`](Self::metadata).
    pub fn get_metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The key set with [`key`](Self::key), if any.
    pub fn get_key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The attempt limit set with [`max_attempts`](Self::max_attempts), if any.
    pub fn get_max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The delay set with [`delay`](Self::delay), if any.
    pub fn get_delay(&self) -> Option<Duration> {
        self.delay
    }

    /// Builds the wire request these options describe; handy for
    /// [`Client::enqueue_batch`](crate::Client::enqueue_batch). The current
    /// span's trace context goes into the metadata.
    pub fn into_request(
        self,
        queue: impl Into<String>,
        kind: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> pb::EnqueueRequest {
        let mut metadata = self.metadata.into_iter().collect();
        trace::inject_metadata(&mut metadata);
        pb::EnqueueRequest {
            queue: queue.into(),
            kind: kind.into(),
            payload: payload.into(),
            key: self.key.unwrap_or_default(),
            max_attempts: self.max_attempts.unwrap_or(0),
            delay: self.delay.map(pb_duration),
            metadata,
            priority: self.priority,
            group: self.group.unwrap_or_default(),
            max_snoozes: self.max_snoozes,
            key_scope: match self.key_scope {
                KeyScope::Retained => pb::KeyScope::Unspecified,
                KeyScope::Active => pb::KeyScope::Active,
            } as i32,
            on_conflict: if self.replace {
                pb::OnConflict::Replace
            } else {
                pb::OnConflict::Unspecified
            } as i32,
            unique_for: self.unique_for.map(pb_duration),
        }
    }
}

/// How a failed attempt should be retried.
///
/// The default leaves the delay to the server's exponential backoff and
/// allows a retry if attempts are left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailOptions {
    /// Wait this long before the next attempt instead of the server's
    /// backoff; `Some(Duration::ZERO)` makes the job due at once.
    pub retry_delay: Option<Duration>,
    /// Do not retry: the job becomes FAILED (a dead letter) at once.
    pub fatal: bool,
    /// Not a failure: put the job back, due after this delay, without
    /// counting the attempt (its history says SNOOZED).
    pub snooze: Option<Duration>,
}

impl FailOptions {
    /// Retry after the server's backoff (same as `default()`).
    pub fn retry() -> Self {
        Self::default()
    }

    /// Retry after exactly `delay`.
    pub fn retry_after(delay: Duration) -> Self {
        Self {
            retry_delay: Some(delay),
            ..Self::default()
        }
    }

    /// Do not retry.
    pub fn fatal() -> Self {
        Self {
            fatal: true,
            ..Self::default()
        }
    }

    /// Put the job back, due after `delay`, without counting the attempt.
    pub fn snooze(delay: Duration) -> Self {
        Self {
            snooze: Some(delay),
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_map_to_the_wire_defaults() {
        let req = EnqueueOptions::new().into_request("q", "k", b"p".to_vec());
        assert_eq!(req.key, "");
        assert_eq!(req.max_attempts, 0);
        assert_eq!(req.delay, None);
        assert_eq!(req.payload, b"p");
    }

    #[test]
    fn builder_fields_reach_the_request() {
        let req = EnqueueOptions::new()
            .key("order-1")
            .max_attempts(5)
            .delay(Duration::from_millis(1500))
            .into_request("emails", "send-email", "{}");
        assert_eq!(req.key, "order-1");
        assert_eq!(req.max_attempts, 5);
        assert_eq!(
            req.delay,
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
    }
}
