//! Turns wire requests into validated domain values.
//!
//! Every limit of docs/src/design.md §2 is checked here, before anything touches the
//! store, so bad input changes nothing and always gets INVALID_ARGUMENT with
//! a message that names the field.

use std::time::Duration;

use jobq::pb;

use crate::{
    auth::Caller,
    config::{duration_text, Config},
    error::{Error, Result},
    job::{
        JobId, KeyScope, LeaseId, NewJob, Report, Status, Uniqueness, DEFAULT_MAX_SNOOZES,
        PRIORITY_MAX, PRIORITY_MIN,
    },
    store::{FailReport, ListFilter},
};

/// Longest queue, kind, key or worker name.
pub const MAX_NAME_LEN: usize = 128;
/// Most queues one Dequeue or Lease may list.
pub const MAX_QUEUES: usize = 32;
/// Default ListJobs page size.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest ListJobs page size.
pub const MAX_PAGE_SIZE: usize = 1000;
/// The most bytes kept of a snooze's reason (less when `--max-error-bytes`
/// is less).
pub const MAX_SNOOZE_REASON_BYTES: usize = 256;

mod operator;
mod schedule;

pub use operator::*;
pub use schedule::*;

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// A name (queue, kind, key, worker id): 1..=128 characters of
/// `[A-Za-z0-9._:-]`.
pub fn name(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(invalid(format!("{field} must not be empty")));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(invalid(format!(
            "{field} is {} characters long; the limit is {MAX_NAME_LEN}",
            value.len()
        )));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(invalid(format!(
            "{field} contains {c:?}; allowed are A-Z a-z 0-9 . _ : -"
        )));
    }
    Ok(())
}

/// The jobs of a WatchJob call: 1 to `--max-watch-ids` ids, each once.
pub fn watch(req: pb::WatchJobRequest, config: &Config) -> Result<Vec<JobId>> {
    if req.ids.is_empty() {
        return Err(invalid("ids must name at least one job"));
    }
    let mut ids = Vec::with_capacity(req.ids.len().min(config.max_watch_ids));
    for id in &req.ids {
        let id = job_id("ids", id)?;
        if !ids.contains(&id) {
            ids.push(id);
        }
        if ids.len() > config.max_watch_ids {
            return Err(invalid(format!(
                "ids name more than {} jobs (--max-watch-ids)",
                config.max_watch_ids
            )));
        }
    }
    Ok(ids)
}

/// A job id in its decimal wire form.
pub fn job_id(field: &str, value: &str) -> Result<JobId> {
    value.parse().map_err(|e| invalid(format!("{field}: {e}")))
}

/// A lease id in its decimal wire form.
pub fn lease_id(value: &str) -> Result<LeaseId> {
    value.parse().map_err(|e| invalid(format!("lease_id: {e}")))
}

/// Largest `nanos` of a protobuf `Duration` (google/protobuf/duration.proto).
const MAX_NANOS: i32 = 999_999_999;

/// A non-negative protobuf duration as a std one. A `nanos` outside
/// `0..=999_999_999` is malformed, and is named as such: it is not a
/// negative duration.
fn duration(field: &str, value: Option<prost_types::Duration>) -> Result<Option<Duration>> {
    value
        .map(|d| {
            if !(-MAX_NANOS..=MAX_NANOS).contains(&d.nanos) {
                return Err(invalid(format!(
                    "{field}.nanos {} is out of range -{MAX_NANOS}..={MAX_NANOS}",
                    d.nanos
                )));
            }
            if d.seconds < 0 || d.nanos < 0 {
                return Err(invalid(format!("{field} must be a non-negative duration")));
            }
            Duration::try_from(d).map_err(|_| invalid(format!("{field} is not a valid duration")))
        })
        .transpose()
}

/// A delay (enqueue delay, retry delay), bounded by `--max-delay`.
fn delay(
    field: &str,
    value: Option<prost_types::Duration>,
    config: &Config,
) -> Result<Option<Duration>> {
    let d = duration(field, value)?;
    if let Some(d) = d {
        if d > config.max_delay {
            return Err(invalid(format!(
                "{field} {} is over the limit of {} (--max-delay)",
                duration_text(d),
                duration_text(config.max_delay)
            )));
        }
    }
    Ok(d)
}

/// A lease length: unset means the server default; otherwise within
/// `--min-lease..=--max-lease`.
pub fn lease(
    field: &str,
    value: Option<prost_types::Duration>,
    config: &Config,
) -> Result<Duration> {
    let Some(d) = duration(field, value)? else {
        return Ok(config.default_lease);
    };
    if d < config.min_lease || d > config.max_lease {
        return Err(invalid(format!(
            "{field} {} is out of range {}..={} (--min-lease, --max-lease)",
            duration_text(d),
            duration_text(config.min_lease),
            duration_text(config.max_lease)
        )));
    }
    Ok(d)
}

/// An enqueue request as a new job.
pub fn new_job(req: pb::EnqueueRequest, config: &Config) -> Result<NewJob> {
    name("queue", &req.queue)?;
    name("kind", &req.kind)?;
    let unique = uniqueness(&req, !req.key.is_empty(), config)?;
    let key = if req.key.is_empty() {
        None
    } else {
        name("key", &req.key)?;
        Some(req.key)
    };
    if req.payload.len() > config.max_payload {
        return Err(invalid(format!(
            "payload is {} bytes; the limit is {} (--max-payload)",
            req.payload.len(),
            config.max_payload
        )));
    }
    let max_attempts = match req.max_attempts {
        0 => config.default_max_attempts.max(1),
        n if n > config.max_attempts_limit => {
            return Err(invalid(format!(
                "max_attempts {n} is over the limit of {}",
                config.max_attempts_limit
            )))
        }
        n => n,
    };
    if !(PRIORITY_MIN..=PRIORITY_MAX).contains(&req.priority) {
        return Err(invalid(format!(
            "priority {} is out of range: {PRIORITY_MIN}..={PRIORITY_MAX}",
            req.priority
        )));
    }
    let max_snoozes = match req.max_snoozes {
        None => DEFAULT_MAX_SNOOZES.min(config.max_snoozes_limit),
        Some(n) if n > config.max_snoozes_limit => {
            return Err(invalid(format!(
                "max_snoozes {n} is over the limit of {} (--max-snoozes-limit)",
                config.max_snoozes_limit
            )))
        }
        Some(n) => n,
    };
    let delay = delay("delay", req.delay, config)?.unwrap_or_default();
    let metadata = metadata(req.metadata, config)?;
    let group = optional_name("group", req.group)?;
    Ok(NewJob {
        queue: req.queue,
        kind: req.kind,
        payload: req.payload,
        key,
        max_attempts,
        delay,
        priority: req.priority,
        metadata,
        group,
        max_snoozes,
        unique,
    })
}

/// An enqueue's key rules: a scope and a conflict rule from their enums,
/// a window within `--max-delay`, and none of them without a key.
fn uniqueness(req: &pb::EnqueueRequest, keyed: bool, config: &Config) -> Result<Uniqueness> {
    let scope = match pb::KeyScope::try_from(req.key_scope) {
        Ok(pb::KeyScope::Unspecified | pb::KeyScope::Retained) => KeyScope::Retained,
        Ok(pb::KeyScope::Active) => KeyScope::Active,
        Err(_) => return Err(invalid(format!("unknown key_scope {}", req.key_scope))),
    };
    let replace = match pb::OnConflict::try_from(req.on_conflict) {
        Ok(pb::OnConflict::Unspecified | pb::OnConflict::Keep) => false,
        Ok(pb::OnConflict::Replace) => true,
        Err(_) => return Err(invalid(format!("unknown on_conflict {}", req.on_conflict))),
    };
    let unique_for = delay("unique_for", req.unique_for, config)?;
    if unique_for == Some(Duration::ZERO) {
        return Err(invalid(
            "unique_for must be more than 0 (leave it unset for no window)",
        ));
    }
    let unique = Uniqueness {
        scope,
        replace,
        unique_for,
    };
    if !keyed && !unique.is_default() {
        return Err(invalid(
            "key_scope, on_conflict and unique_for are rules for a key: give the job a key",
        ));
    }
    Ok(unique)
}

/// Enqueue metadata: keys follow the name rules; keys and values together
/// are at most `--max-metadata-bytes`.
fn metadata(
    map: std::collections::HashMap<String, String>,
    config: &Config,
) -> Result<crate::job::Metadata> {
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > config.max_metadata_bytes {
        return Err(invalid(format!(
            "metadata is {bytes} bytes of keys and values; the limit is {} (--max-metadata-bytes)",
            config.max_metadata_bytes
        )));
    }
    for (key, value) in &map {
        name("metadata key", key)?;
        no_nul(&format!("metadata value of {key:?}"), value)?;
    }
    Ok(map.into_iter().collect())
}

/// Refuses a NUL character in free text a store keeps: PostgreSQL's `text`
/// and `jsonb` cannot hold one, and sled and PostgreSQL must accept the
/// same requests.
pub(crate) fn no_nul(field: &str, value: &str) -> Result<()> {
    match value.contains('\0') {
        true => Err(invalid(format!("{field} contains a NUL character"))),
        false => Ok(()),
    }
}

/// An enqueue batch: its size is bounded by `--max-batch`; each entry is
/// validated on its own, so one bad entry does not reject the others.
pub fn batch(reqs: Vec<pb::EnqueueRequest>, config: &Config) -> Result<Vec<Result<NewJob>>> {
    if reqs.is_empty() {
        return Err(invalid("jobs must not be empty"));
    }
    if reqs.len() > config.max_batch {
        return Err(invalid(format!(
            "batch of {} jobs is over the limit of {} (--max-batch)",
            reqs.len(),
            config.max_batch
        )));
    }
    let mut rules: std::collections::HashMap<(String, String), (KeyScope, Option<Duration>)> =
        std::collections::HashMap::new();
    Ok(reqs
        .into_iter()
        .map(|r| {
            let new = new_job(r, config)?;
            // Entries of one key are one enqueue (a later REPLACE entry
            // gives the first its payload): they must agree on how long
            // the key is held.
            if let Some(key) = &new.key {
                let rule = (new.unique.scope, new.unique.unique_for);
                let first = *rules
                    .entry((new.queue.clone(), key.clone()))
                    .or_insert(rule);
                if first != rule {
                    return Err(invalid(format!(
                        "an earlier entry of the batch has key {key:?} in queue {:?} with another \
                         key_scope or unique_for; enqueue them apart",
                        new.queue
                    )));
                }
            }
            Ok(new)
        })
        .collect())
}

/// What a Dequeue or a Lease stream takes: from which queues, for whom, for
/// how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakeSpec {
    /// Queues in priority order, without duplicates.
    pub queues: Vec<String>,
    /// Who takes.
    pub worker_id: String,
    /// The token taking (set from the caller, not from the request).
    pub owner: Option<String>,
    /// Lease length.
    pub lease: Duration,
}

/// A validated Lease request.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Queues, worker id, lease length.
    pub take: TakeSpec,
    /// Most jobs held at once.
    pub capacity: usize,
    /// Leases the worker declares it still holds.
    pub held: Vec<(JobId, LeaseId)>,
    /// The token that opened it (tokens on).
    pub caller: Option<Caller>,
}

fn take_spec(
    queues: Vec<String>,
    worker_id: String,
    lease_duration: Option<prost_types::Duration>,
    config: &Config,
) -> Result<TakeSpec> {
    if queues.is_empty() {
        return Err(invalid("queues must list at least one queue"));
    }
    if queues.len() > MAX_QUEUES {
        return Err(invalid(format!(
            "queues lists {} queues; the limit is {MAX_QUEUES}",
            queues.len()
        )));
    }
    let mut unique: Vec<String> = Vec::with_capacity(queues.len());
    for q in queues {
        name("queues[]", &q)?;
        if !unique.contains(&q) {
            unique.push(q);
        }
    }
    name("worker_id", &worker_id)?;
    let lease = lease("lease_duration", lease_duration, config)?;
    Ok(TakeSpec {
        queues: unique,
        worker_id,
        owner: None,
        lease,
    })
}

/// A Dequeue: what to take and how long to wait (bounded by `--max-wait`).
pub fn dequeue(req: pb::DequeueRequest, config: &Config) -> Result<(TakeSpec, Duration)> {
    let spec = take_spec(req.queues, req.worker_id, req.lease_duration, config)?;
    let wait = duration("wait", req.wait)?.unwrap_or_default();
    if wait > config.max_wait {
        return Err(invalid(format!(
            "wait {} is over the limit of {} (--max-wait)",
            duration_text(wait),
            duration_text(config.max_wait)
        )));
    }
    Ok((spec, wait))
}

/// A Lease stream: what to take and how many jobs at once (0 means 1; at
/// most `--max-capacity`).
pub fn lease_stream(req: pb::LeaseRequest, config: &Config) -> Result<StreamSpec> {
    let take = take_spec(req.queues, req.worker_id, req.lease_duration, config)?;
    let capacity = match req.capacity {
        0 => 1,
        n if n > config.max_capacity => {
            return Err(invalid(format!(
                "capacity {n} is over the limit of {} (--max-capacity)",
                config.max_capacity
            )))
        }
        n => n,
    };
    // Held leases are real: refusing them would keep a worker from ever
    // reconnecting (say, after --max-capacity was lowered). They count
    // against the capacity, so a stream holding more is pushed nothing.
    if req.held.len() > jobq::MAX_HEARTBEAT_LEASES {
        return Err(invalid(format!(
            "held lists {} leases; the limit is {} per call",
            req.held.len(),
            jobq::MAX_HEARTBEAT_LEASES
        )));
    }
    let held = req
        .held
        .iter()
        .map(|l| Ok((job_id("held[].job_id", &l.job_id)?, lease_id(&l.lease_id)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(StreamSpec {
        take,
        capacity: capacity as usize,
        held,
        caller: None,
    })
}

/// A Lease stream's token, as a heartbeat presents it (empty: none).
pub fn stream_token(value: &str) -> Result<&str> {
    if value.len() > 64 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid(
            "stream_token must be the jobq-stream-token header of a Lease stream",
        ));
    }
    Ok(value)
}

/// An Ack: which job, under which lease.
/// An ack: the job, its lease, and the result to store (none if empty),
/// at most `--max-result-bytes`.
pub fn ack(req: pb::AckRequest, config: &Config) -> Result<(JobId, LeaseId, Option<Vec<u8>>)> {
    let id = job_id("job_id", &req.job_id)?;
    let lease = lease_id(&req.lease_id)?;
    if req.result.len() > config.max_result_bytes {
        return Err(invalid(format!(
            "result is {} bytes; the limit is {} (--max-result-bytes)",
            req.result.len(),
            config.max_result_bytes
        )));
    }
    let result = (!req.result.is_empty()).then_some(req.result);
    Ok((id, lease, result))
}

/// The one rule for the text a job keeps of why it ended badly, whoever
/// sends it (a worker's Fail error, an operator's CancelJob reason): it is
/// never refused for its content. Each NUL character becomes U+FFFD (no
/// store's text column can hold a NUL; a program's stderr may), then text
/// over `limit` bytes is cut on a character boundary and ends in "…",
/// within the limit. A Fail must not be lost for what its handler's error
/// says (the job would wait out its lease and lose the error), and a
/// cancel's reason lands in the same `last_error`, read by the same
/// people, so it follows the same rule.
pub(crate) fn kept_text(text: String, limit: usize) -> String {
    let text = match text.contains('\0') {
        true => text.replace('\0', "\u{fffd}"),
        false => text,
    };
    cut_error(text, limit)
}

/// A Fail: which job, under which lease, why and when to retry. The error
/// follows [`kept_text`] with `--max-error-bytes`; an empty one is kept as
/// "failed (no error given)".
pub fn fail(req: pb::FailRequest, config: &Config) -> Result<(JobId, FailReport)> {
    let id = job_id("job_id", &req.job_id)?;
    let lease_id = lease_id(&req.lease_id)?;
    let retry_delay = delay("retry_delay", req.retry_delay, config)?;
    let snooze = delay("snooze", req.snooze, config)?;
    if snooze.is_some() && (req.fatal || retry_delay.is_some()) {
        return Err(Error::InvalidArgument(
            "snooze puts the job back without a failure: it cannot be fatal or carry a retry_delay"
                .into(),
        ));
    }
    // A snooze's reason is kept short (a job may snooze many times), and
    // leaves room for the words of a snooze past max_snoozes, a failure.
    let limit = match snooze {
        Some(_) => config
            .max_error_bytes
            .saturating_sub(crate::machine::OVER_SNOOZED_PREFIX_MAX)
            .min(MAX_SNOOZE_REASON_BYTES),
        None => config.max_error_bytes,
    };
    let mut error = kept_text(req.error, limit);
    if error.is_empty() {
        error = if snooze.is_some() {
            "snoozed (no reason given)"
        } else {
            "failed (no error given)"
        }
        .to_owned();
    }
    Ok((
        id,
        FailReport {
            lease_id,
            error,
            retry_delay,
            fatal: req.fatal,
            snooze,
        },
    ))
}

/// Cuts `error` to at most `limit` bytes, on a char boundary, marking the
/// cut with "…" inside the limit (left out when even that does not fit).
fn cut_error(mut error: String, limit: usize) -> String {
    const MARK: char = '…';
    if error.len() <= limit {
        return error;
    }
    let room = limit.saturating_sub(MARK.len_utf8());
    let mut cut = room;
    while !error.is_char_boundary(cut) {
        cut -= 1;
    }
    error.truncate(cut);
    if limit >= MARK.len_utf8() {
        error.push(MARK);
    }
    error
}

/// A (job, lease) pair named by a heartbeat.
pub type LeaseRef = (JobId, LeaseId);

/// A heartbeat, checked: its leases, the progress reported with each (in
/// the same order), and how far to extend them.
pub type Beats = (Vec<LeaseRef>, Vec<Option<Report>>, Option<Duration>);

/// A Heartbeat: who, which leases (at most [`jobq::MAX_HEARTBEAT_LEASES`],
/// the per-call limit clients chunk by; not `--max-capacity`, which bounds
/// one stream, while a worker's leases may span streams), the progress
/// reported with each, and how far to extend them.
pub fn heartbeat(req: pb::HeartbeatRequest, config: &Config) -> Result<Beats> {
    name("worker_id", &req.worker_id)?;
    if req.leases.len() > jobq::MAX_HEARTBEAT_LEASES {
        return Err(invalid(format!(
            "heartbeat lists {} leases; the limit is {} per call: send one call per {} leases",
            req.leases.len(),
            jobq::MAX_HEARTBEAT_LEASES,
            jobq::MAX_HEARTBEAT_LEASES
        )));
    }
    let leases = req
        .leases
        .iter()
        .map(|l| {
            Ok((
                job_id("leases[].job_id", &l.job_id)?,
                lease_id(&l.lease_id)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let progress = req
        .leases
        .into_iter()
        .map(|l| l.progress.map(|p| report(p, config)).transpose())
        .collect::<Result<Vec<_>>>()?;
    let extend_by = match req.extend_by {
        None => None,
        some => Some(lease("extend_by", some, config)?),
    };
    Ok((leases, progress, extend_by))
}

/// A progress report: a percent of at most 100, and a message kept as
/// [`kept_text`] with `--max-progress-message-bytes` (words for people, as
/// a Fail's error is: never refused for its text, so a worker's heartbeat
/// never fails on what its handler said).
fn report(p: pb::Progress, config: &Config) -> Result<Report> {
    if p.percent > 100 {
        return Err(invalid(format!(
            "leases[].progress.percent is {}; it is 0 to 100",
            p.percent
        )));
    }
    Ok(Report {
        percent: p.percent,
        message: kept_text(p.message, config.max_progress_message_bytes),
    })
}

/// A status filter: UNSPECIFIED means any.
pub fn status_filter(value: i32) -> Result<Option<Status>> {
    match pb::JobStatus::try_from(value) {
        Ok(pb::JobStatus::Unspecified) => Ok(None),
        Ok(pb::JobStatus::Pending) => Ok(Some(Status::Pending)),
        Ok(pb::JobStatus::Running) => Ok(Some(Status::Running)),
        Ok(pb::JobStatus::Done) => Ok(Some(Status::Done)),
        Ok(pb::JobStatus::Failed) => Ok(Some(Status::Failed)),
        Err(_) => Err(invalid(format!("status {value} is not a JobStatus"))),
    }
}

/// A ListJobs request as a store filter, its page bounded by count and by
/// `--max-page-bytes`.
pub fn list(req: pb::ListJobsRequest, config: &Config) -> Result<ListFilter> {
    let queue = optional_name("queue", req.queue)?;
    let key = optional_name("key", req.key)?;
    let status = status_filter(req.status)?;
    let after = if req.page_token.is_empty() {
        None
    } else {
        Some(job_id("page_token", &req.page_token)?)
    };
    let limit = match req.page_size as usize {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    };
    Ok(ListFilter {
        queue,
        status,
        key,
        after,
        limit,
        max_bytes: config.max_page_bytes,
        omit_payload: req.omit_payload,
    })
}

/// An optional name: empty means "any".
pub fn optional_name(field: &str, value: String) -> Result<Option<String>> {
    if value.is_empty() {
        return Ok(None);
    }
    name(field, &value)?;
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::with_data("unused")
    }

    #[test]
    fn names_follow_the_character_rules() {
        assert!(name("queue", "emails.v2:high-1_x").is_ok());
        assert!(name("queue", "").is_err());
        assert!(name("queue", &"q".repeat(129)).is_err());
        assert!(name("queue", &"q".repeat(128)).is_ok());
        assert!(name("queue", "with space").is_err());
        assert!(name("queue", "émails").is_err());
    }

    #[test]
    fn ids_are_digits_only() {
        assert!(job_id("id", "42").is_ok());
        for bad in ["", "+1", "-1", " 1", "1x", "007", "99999999999999999999999"] {
            assert!(job_id("id", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn metadata_keys_follow_the_name_rules_and_size_is_bounded() {
        let c = config();
        let with = |pairs: &[(&str, String)]| pb::EnqueueRequest {
            queue: "q".into(),
            kind: "k".into(),
            metadata: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
            ..Default::default()
        };
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned();
        let job = new_job(with(&[("traceparent", tp.clone())]), &c).expect("valid");
        assert_eq!(job.metadata.get("traceparent"), Some(&tp));
        for bad in ["", "with space", "é"] {
            let err = new_job(with(&[(bad, "v".into())]), &c).expect_err(bad);
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
        let huge = "v".repeat(c.max_metadata_bytes);
        let err = new_job(with(&[("k", huge)]), &c).expect_err("over the limit");
        assert!(err.to_string().contains("--max-metadata-bytes"), "{err}");
    }

    #[test]
    fn a_nul_in_a_metadata_value_is_refused_and_in_a_fail_error_replaced() {
        let c = config();
        let req = pb::EnqueueRequest {
            queue: "q".into(),
            kind: "k".into(),
            metadata: [("tenant".to_owned(), "a\0b".to_owned())].into(),
            ..Default::default()
        };
        let err = new_job(req, &c).expect_err("a NUL in a value");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains("NUL"), "{err}");
        let error = |text: String| {
            let req = pb::FailRequest {
                job_id: "1".into(),
                lease_id: "2".into(),
                error: text,
                ..Default::default()
            };
            fail(req, &c)
                .expect("a Fail is never refused for its text")
                .1
                .error
        };
        assert_eq!(
            error("exit 1\0\0: bad".into()),
            "exit 1\u{fffd}\u{fffd}: bad"
        );
        let cut = error("\0".repeat(5000));
        assert!(cut.len() <= c.max_error_bytes && !cut.contains('\0'));
    }

    #[test]
    fn a_batchs_entries_of_one_key_agree_on_its_rules() {
        let c = config();
        let entry = |key: &str, scope: i32, on_conflict: i32| pb::EnqueueRequest {
            queue: "q".into(),
            kind: "k".into(),
            key: key.into(),
            key_scope: scope,
            on_conflict,
            ..Default::default()
        };
        let checked = batch(
            vec![
                entry("a", 0, 0),
                entry("a", 1, 2),
                entry("a", 2, 0),
                entry("b", 2, 0),
                entry("", 0, 2),
            ],
            &c,
        )
        .expect("a batch");
        let ok: Vec<bool> = checked.iter().map(Result::is_ok).collect();
        // Retained is the default; a replace may differ; a scope may not;
        // another key has its own; no rule without a key.
        assert_eq!(ok, [true, true, false, true, false]);
    }

    #[test]
    fn enqueue_limits() {
        let c = config();
        let ok = pb::EnqueueRequest {
            queue: "q".into(),
            kind: "k".into(),
            ..Default::default()
        };
        assert_eq!(new_job(ok.clone(), &c).expect("valid").max_attempts, 3);
        let big = pb::EnqueueRequest {
            payload: vec![0; c.max_payload + 1],
            ..ok.clone()
        };
        assert!(new_job(big, &c).is_err());
        let attempts = pb::EnqueueRequest {
            max_attempts: 1001,
            ..ok.clone()
        };
        assert!(new_job(attempts, &c).is_err());
        assert_eq!(new_job(ok.clone(), &c).expect("valid").max_snoozes, 100);
        let snoozes = |max_snoozes| pb::EnqueueRequest {
            max_snoozes: Some(max_snoozes),
            ..ok.clone()
        };
        assert_eq!(new_job(snoozes(7), &c).expect("valid").max_snoozes, 7);
        assert_eq!(new_job(snoozes(0), &c).expect("valid").max_snoozes, 0);
        let limit = c.max_snoozes_limit;
        assert_eq!(
            new_job(snoozes(limit), &c).expect("valid").max_snoozes,
            limit
        );
        assert!(new_job(snoozes(limit + 1), &c)
            .expect_err("over the limit")
            .to_string()
            .contains("--max-snoozes-limit"));
        let negative = pb::EnqueueRequest {
            delay: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..ok.clone()
        };
        assert!(new_job(negative, &c).is_err());
        let forever = pb::EnqueueRequest {
            delay: Some(prost_types::Duration {
                seconds: i64::MAX,
                nanos: 0,
            }),
            ..ok.clone()
        };
        assert!(new_job(forever, &c).is_err());
        for (priority, valid) in [
            (-101, false),
            (-100, true),
            (0, true),
            (100, true),
            (101, false),
        ] {
            let req = pb::EnqueueRequest {
                priority,
                ..ok.clone()
            };
            match new_job(req, &c) {
                Ok(job) => {
                    assert!(valid, "priority {priority} must be refused");
                    assert_eq!(job.priority, priority);
                }
                Err(e) => {
                    assert!(!valid, "priority {priority} must be accepted: {e}");
                    assert_eq!(e.code(), tonic::Code::InvalidArgument);
                    assert!(e.to_string().contains("priority"), "{e}");
                }
            }
        }
    }

    #[test]
    fn leases_are_bounded() {
        let c = config();
        let secs = |s| {
            Some(prost_types::Duration {
                seconds: s,
                nanos: 0,
            })
        };
        assert_eq!(lease("l", None, &c).expect("default"), c.default_lease);
        assert!(lease("l", secs(0), &c).is_err());
        assert!(lease("l", secs(12 * 3600 + 1), &c).is_err());
        assert!(lease("l", secs(1), &c).is_ok());
    }

    #[test]
    fn a_snooze_is_within_max_delay_and_neither_fatal_nor_a_retry_delay() {
        let c = config();
        let secs = |s: u64| {
            Some(prost_types::Duration {
                seconds: s as i64,
                nanos: 0,
            })
        };
        let req = |snooze: u64, fatal: bool, retry: Option<u64>| pb::FailRequest {
            job_id: "1".into(),
            lease_id: "2".into(),
            snooze: secs(snooze),
            fatal,
            retry_delay: retry.and_then(secs),
            ..Default::default()
        };
        let (_, report) = fail(req(30, false, None), &c).expect("valid");
        assert_eq!(report.snooze, Some(Duration::from_secs(30)));
        assert_eq!(report.error, "snoozed (no reason given)");
        assert!(fail(req(0, false, None), &c).is_ok(), "0s: due now");
        assert!(fail(req(30, true, None), &c).is_err(), "fatal");
        assert!(
            fail(req(30, false, Some(5)), &c).is_err(),
            "with a retry delay"
        );
        let over = c.max_delay.as_secs() + 1;
        assert!(
            fail(req(over, false, None), &c).is_err(),
            "over --max-delay"
        );
    }

    #[test]
    fn long_errors_are_cut_on_a_char_boundary() {
        let c = config();
        let req = pb::FailRequest {
            job_id: "1".into(),
            lease_id: "2".into(),
            error: "é".repeat(5000),
            ..Default::default()
        };
        let (_, report) = fail(req, &c).expect("valid");
        assert!(
            report.error.len() <= c.max_error_bytes,
            "the cut text, \"…\" included, fits the limit"
        );
        assert!(report.error.ends_with("é…"));
    }

    #[test]
    fn cut_errors_keep_the_mark_within_the_limit() {
        for limit in 0..12 {
            let cut = cut_error("aé€😀bcdefghij".into(), limit);
            assert!(cut.len() <= limit, "{limit}: {cut:?}");
            if limit >= 3 {
                assert!(cut.ends_with('…'), "{limit}: {cut:?}");
            }
        }
        assert_eq!(cut_error("short".into(), 5), "short");
    }

    #[test]
    fn out_of_range_nanos_are_named_as_such() {
        for nanos in [2_000_000_000, 1_000_000_000, -1_000_000_000, i32::MIN] {
            let d = Some(prost_types::Duration { seconds: 1, nanos });
            let err = duration("delay", d).expect_err("malformed").to_string();
            assert!(
                err.contains("delay.nanos") && err.contains("out of range"),
                "{err}"
            );
        }
        let negative = Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        });
        let err = duration("delay", negative)
            .expect_err("negative")
            .to_string();
        assert!(err.contains("non-negative"), "{err}");
        let ok = Some(prost_types::Duration {
            seconds: 0,
            nanos: 999_999_999,
        });
        assert!(duration("delay", ok).is_ok());
    }
}
