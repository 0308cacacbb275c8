//! A job's record on disk: a two-byte header (a 0 marker, then the layout
//! version), then in postcard the length of the payload stored apart (0:
//! none) and the `Job`; and the older layouts still read. A payload over
//! [`INLINE_MAX`] bytes is stored apart (the `payloads` tree), written once
//! at enqueue (or by the first change after a debounce replaced it in the
//! record), and left out of the record: a change of status, lease or
//! history rewrites only the small record, whatever the size of the
//! payload. A smaller one stays in the record, which costs a change at most
//! [`INLINE_MAX`] more bytes and spares an enqueue a second write.
//!
//! postcard is positional, so adding a field to `Job` changes the layout.
//! Layouts:
//! - 1 (unversioned): before jobs had `metadata` and leases an `owner`;
//! - 2 (unversioned): before jobs had a `priority`;
//! - 3 (versioned): the current `Job`, payload inline;
//! - 4 (versioned): `(length apart, Job)`: 0 and the payload
//!   in the `Job` ([`Payload::Inline`]), or the payload's length and an
//!   empty `Job::payload` ([`Payload::Apart`]);
//! - 5 (versioned): the same body, the payload's length
//!   never 0 and its bytes in a file of their own ([`Payload::File`],
//!   [`super::payload_files`]); a build before layout 5 refuses
//!   the record rather than hand the job out without its payload;
//! - 6 and 7 (versioned, [`VERSION`] and [`FILE_VERSION`]): layouts 4 and
//!   5 with the job's `group`, written only for a job that has one (a job
//!   without one is still written in layout 4 or 5, so a build from before
//!   groups reads a store that never used them). Layouts 3 to 5 read as
//!   [`JobV4`], with no group; a build before layout 6 refuses a record of
//!   6 or 7;
//! - 8 and 9 (versioned, [`VERSION`] and [`FILE_VERSION`]): layouts 6 and
//!   7 with the job's `snoozes` and `max_snoozes`, written only for a job
//!   that has snoozed or allows other than [`DEFAULT_MAX_SNOOZES`] (any
//!   other is still written in layouts 4 to 7, for builds from before
//!   snooze counts). Layouts 6 and 7 read with none used of the default.
//!
//! An unversioned record begins with the job's id as a postcard varint, and
//! ids are never 0, so its first byte is never 0: a leading 0 marks a
//! versioned record. An unversioned record is decoded as layout 2, which
//! must consume the whole record, then as layout 1. Whatever it was read
//! as, a record is written back in the current layout on its next change
//! (its inline payload moved apart then).
//!
//! Changing `Job` (or `Lease`, or `Attempt`, which the old layouts share
//! with the current one where they did not change) again: keep its current
//! shape here as `JobV4` (decoded by version 4, and version 3 as its
//! inline-payload form), bump [`VERSION`], and add a unit test like the ones
//! below.

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::job::{Attempt, Job, JobId, Lease, LeaseId, Metadata, Status, DEFAULT_MAX_SNOOZES};

/// The first byte of a versioned record.
const MARKER: u8 = 0;

/// The layout [`encode`] writes for a payload inline or in the
/// `payloads` tree.
pub const VERSION: u8 = 8;

/// The layout [`encode`] writes for a payload in a file.
pub const FILE_VERSION: u8 = 9;

/// Layout 6: [`VERSION`] before jobs counted snoozes.
const V6: u8 = 6;

/// Layout 7: [`FILE_VERSION`] before jobs counted snoozes.
const V7: u8 = 7;

/// The body's last bytes that layouts 8 and 9 add to 6 and 7: `snoozes`
/// 0 and `max_snoozes` [`DEFAULT_MAX_SNOOZES`], each a one-byte varint.
const SNOOZES_TAIL: [u8; 2] = [0, DEFAULT_MAX_SNOOZES as u8];

/// Layout 4: [`VERSION`] before jobs had a group.
const V4: u8 = 4;

/// Layout 5: [`FILE_VERSION`] before jobs had a group.
const V5: u8 = 5;

/// The last layout with the payload inline.
const INLINE_VERSION: u8 = 3;

/// The largest payload kept in the record itself.
pub const INLINE_MAX: usize = 512;

/// Where a record's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// In the record: `Job::payload` holds it.
    Inline,
    /// Apart, this many bytes of it (never 0): `Job::payload` is empty.
    Apart(u64),
    /// In the job's payload file, this many bytes (never 0):
    /// `Job::payload` is empty.
    File(u64),
}

impl Payload {
    /// Where a payload of `len` bytes belongs.
    pub fn for_len(len: usize) -> Payload {
        if len > INLINE_MAX {
            Payload::Apart(len as u64)
        } else {
            Payload::Inline
        }
    }
}

/// Encodes a job in the current layout, its payload where `payload` says:
/// with [`Payload::Apart`] or [`Payload::File`] only the length goes in,
/// and whatever `job.payload` holds is left out (and back in place on
/// return).
pub fn encode(job: &mut Job, payload: Payload) -> Result<Vec<u8>, postcard::Error> {
    // A job that never snoozed, with the default allowance, is written
    // in layouts 6 and 7 (the snooze counts are the body's last fields,
    // two one-byte varints); one without a group too in 4 and 5 (the group
    // comes before them, and `None` is its one byte, 0). Builds from
    // before those fields read them.
    let snoozed = job.snoozes != 0 || job.max_snoozes != DEFAULT_MAX_SNOOZES;
    let grouped = job.group.is_some();
    let (inline, apart, file) = if snoozed {
        (VERSION, VERSION, FILE_VERSION)
    } else if grouped {
        (V6, V6, V7)
    } else {
        (V4, V4, V5)
    };
    let mut record = match payload {
        Payload::Inline => postcard::to_extend(&(0u64, &*job), vec![MARKER, inline])?,
        Payload::Apart(len) | Payload::File(len) => {
            let version = if matches!(payload, Payload::File(_)) {
                file
            } else {
                apart
            };
            let bytes = std::mem::take(&mut job.payload);
            let record = postcard::to_extend(&(len, &*job), vec![MARKER, version]);
            job.payload = bytes;
            record?
        }
    };
    if !snoozed {
        if !record.ends_with(&SNOOZES_TAIL) {
            return Err(postcard::Error::SerializeBufferFull);
        }
        record.truncate(record.len() - SNOOZES_TAIL.len());
        if !grouped && record.pop() != Some(0) {
            return Err(postcard::Error::SerializeBufferFull);
        }
    }
    Ok(record)
}

/// Decodes a record of any layout, and says where its payload is.
pub fn decode(value: &[u8]) -> Result<(Job, Payload), postcard::Error> {
    match value {
        [MARKER, VERSION, body @ ..] => match whole::<(u64, Job)>(body)? {
            (0, job) => Ok((job, Payload::Inline)),
            (len, job) if job.payload.is_empty() => Ok((job, Payload::Apart(len))),
            _ => Err(postcard::Error::DeserializeBadEncoding),
        },
        [MARKER, FILE_VERSION, body @ ..] => match whole::<(u64, Job)>(body)? {
            (len, job) if len > 0 && job.payload.is_empty() => Ok((job, Payload::File(len))),
            _ => Err(postcard::Error::DeserializeBadEncoding),
        },
        [MARKER, version @ (V6 | V7), body @ ..] => {
            // The current body with the default snooze counts after it.
            let mut current = Vec::with_capacity(body.len() + SNOOZES_TAIL.len() + 2);
            current.extend_from_slice(&[MARKER, *version + 2]);
            current.extend_from_slice(body);
            current.extend_from_slice(&SNOOZES_TAIL);
            decode(&current)
        }
        [MARKER, V4, body @ ..] => match whole::<(u64, JobV4)>(body)? {
            (0, job) => Ok((job.into(), Payload::Inline)),
            (len, job) if job.payload.is_empty() => Ok((job.into(), Payload::Apart(len))),
            _ => Err(postcard::Error::DeserializeBadEncoding),
        },
        [MARKER, V5, body @ ..] => match whole::<(u64, JobV4)>(body)? {
            (len, job) if len > 0 && job.payload.is_empty() => Ok((job.into(), Payload::File(len))),
            _ => Err(postcard::Error::DeserializeBadEncoding),
        },
        [MARKER, INLINE_VERSION, body @ ..] => Ok((whole::<JobV4>(body)?.into(), Payload::Inline)),
        [MARKER, ..] => Err(postcard::Error::DeserializeBadEncoding),
        _ => whole::<JobV2>(value)
            .map(Job::from)
            .or_else(|_| whole::<JobV1>(value).map(Job::from))
            .map(|job| (job, Payload::Inline)),
    }
}

/// Decodes `T` from all of `bytes` (trailing bytes are an error: they mean
/// the record is of another layout).
fn whole<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    match postcard::take_from_bytes::<T>(bytes)? {
        (value, []) => Ok(value),
        _ => Err(postcard::Error::DeserializeBadEncoding),
    }
}

/// The job before `group` (layouts 3 to 5).
#[derive(Deserialize)]
struct JobV4 {
    id: JobId,
    queue: String,
    kind: String,
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
    key: Option<String>,
    status: Status,
    attempts: u32,
    max_attempts: u32,
    priority: i32,
    enqueued_at: SystemTime,
    run_at: SystemTime,
    lease: Option<Lease>,
    finished_at: Option<SystemTime>,
    last_error: Option<String>,
    history: Vec<Attempt>,
    metadata: Metadata,
}

impl From<JobV4> for Job {
    fn from(j: JobV4) -> Job {
        Job {
            id: j.id,
            queue: j.queue,
            kind: j.kind,
            payload: j.payload,
            key: j.key,
            status: j.status,
            attempts: j.attempts,
            max_attempts: j.max_attempts,
            priority: j.priority,
            enqueued_at: j.enqueued_at,
            run_at: j.run_at,
            lease: j.lease,
            finished_at: j.finished_at,
            last_error: j.last_error,
            history: j.history,
            metadata: j.metadata,
            group: None,
            snoozes: 0,
            max_snoozes: DEFAULT_MAX_SNOOZES,
            result: None,
            progress: None,
        }
    }
}

/// The job before `priority` (layout 2).
#[derive(Deserialize)]
struct JobV2 {
    id: JobId,
    queue: String,
    kind: String,
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
    key: Option<String>,
    status: Status,
    attempts: u32,
    max_attempts: u32,
    enqueued_at: SystemTime,
    run_at: SystemTime,
    lease: Option<LeaseV2>,
    finished_at: Option<SystemTime>,
    last_error: Option<String>,
    history: Vec<Attempt>,
    metadata: Metadata,
}

/// The lease of layout 2 (as `Lease` is now).
#[derive(Deserialize)]
struct LeaseV2 {
    id: LeaseId,
    worker_id: String,
    taken_at: SystemTime,
    expires_at: SystemTime,
    duration: Duration,
    owner: Option<String>,
}

impl From<JobV2> for Job {
    fn from(j: JobV2) -> Job {
        Job {
            id: j.id,
            queue: j.queue,
            kind: j.kind,
            payload: j.payload,
            key: j.key,
            status: j.status,
            attempts: j.attempts,
            max_attempts: j.max_attempts,
            priority: 0,
            enqueued_at: j.enqueued_at,
            run_at: j.run_at,
            lease: j.lease.map(|l| Lease {
                id: l.id,
                worker_id: l.worker_id,
                taken_at: l.taken_at,
                expires_at: l.expires_at,
                duration: l.duration,
                owner: l.owner,
            }),
            finished_at: j.finished_at,
            last_error: j.last_error,
            history: j.history,
            metadata: j.metadata,
            group: None,
            snoozes: 0,
            max_snoozes: DEFAULT_MAX_SNOOZES,
            result: None,
            progress: None,
        }
    }
}

/// The lease before `owner`.
#[derive(Deserialize)]
struct LeaseV1 {
    id: LeaseId,
    worker_id: String,
    taken_at: SystemTime,
    expires_at: SystemTime,
    duration: Duration,
}

/// The job before `metadata` (layout 1).
#[derive(Deserialize)]
struct JobV1 {
    id: JobId,
    queue: String,
    kind: String,
    #[serde(with = "serde_bytes")]
    payload: Vec<u8>,
    key: Option<String>,
    status: Status,
    attempts: u32,
    max_attempts: u32,
    enqueued_at: SystemTime,
    run_at: SystemTime,
    lease: Option<LeaseV1>,
    finished_at: Option<SystemTime>,
    last_error: Option<String>,
    history: Vec<Attempt>,
}

impl From<JobV1> for Job {
    fn from(j: JobV1) -> Job {
        Job {
            id: j.id,
            queue: j.queue,
            kind: j.kind,
            payload: j.payload,
            key: j.key,
            status: j.status,
            attempts: j.attempts,
            max_attempts: j.max_attempts,
            priority: 0,
            enqueued_at: j.enqueued_at,
            run_at: j.run_at,
            lease: j.lease.map(|l| Lease {
                id: l.id,
                worker_id: l.worker_id,
                taken_at: l.taken_at,
                expires_at: l.expires_at,
                duration: l.duration,
                owner: None,
            }),
            finished_at: j.finished_at,
            last_error: j.last_error,
            history: j.history,
            metadata: Default::default(),
            group: None,
            snoozes: 0,
            max_snoozes: DEFAULT_MAX_SNOOZES,
            result: None,
            progress: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Outcome;
    use serde::Serialize;

    #[derive(Serialize)]
    struct LeaseV1Out<'a> {
        id: LeaseId,
        worker_id: &'a str,
        taken_at: SystemTime,
        expires_at: SystemTime,
        duration: Duration,
    }

    #[derive(Serialize)]
    struct JobV1Out<'a> {
        id: JobId,
        queue: &'a str,
        kind: &'a str,
        payload: &'a [u8],
        key: Option<&'a str>,
        status: Status,
        attempts: u32,
        max_attempts: u32,
        enqueued_at: SystemTime,
        run_at: SystemTime,
        lease: Option<LeaseV1Out<'a>>,
        finished_at: Option<SystemTime>,
        last_error: Option<&'a str>,
        history: Vec<Attempt>,
    }

    fn old_record(running: bool) -> Vec<u8> {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let old = JobV1Out {
            id: JobId(7),
            queue: "emails",
            kind: "send-email",
            payload: b"{\"order\":\"order-4711\"}",
            key: Some("order-4711"),
            status: if running {
                Status::Running
            } else {
                Status::Pending
            },
            attempts: 1,
            max_attempts: 3,
            enqueued_at: t,
            run_at: t,
            lease: running.then_some(LeaseV1Out {
                id: LeaseId(0x9e37_79b9_7f4a_7c15),
                worker_id: "w1",
                taken_at: t,
                expires_at: t + Duration::from_secs(30),
                duration: Duration::from_secs(30),
            }),
            finished_at: None,
            last_error: Some("lease expired"),
            history: vec![Attempt {
                lease_id: LeaseId(3),
                worker_id: "w0".into(),
                started_at: t,
                ended_at: Some(t),
                outcome: Some(Outcome::LeaseExpired),
                error: Some("lease expired".into()),
            }],
        };
        postcard::to_allocvec(&old).expect("encode")
    }

    #[test]
    fn records_from_before_metadata_and_lease_owners_still_read() {
        for running in [false, true] {
            let (job, payload) = decode(&old_record(running)).expect("an old record");
            assert_eq!(payload, Payload::Inline);
            assert_eq!(job.id, JobId(7));
            assert_eq!(job.key.as_deref(), Some("order-4711"));
            assert_eq!(job.last_error.as_deref(), Some("lease expired"));
            assert_eq!(job.history.len(), 1);
            assert!(job.metadata.is_empty());
            assert_eq!(job.lease.is_some(), running);
            if let Some(lease) = &job.lease {
                assert_eq!(lease.worker_id, "w1");
                assert_eq!(lease.owner, None);
            }
            // Written back in the current layout, it reads the same, with
            // its payload inline or apart.
            let mut written = job.clone();
            let inline = encode(&mut written, Payload::Inline).expect("encode");
            assert_eq!(
                decode(&inline).expect("new"),
                (job.clone(), Payload::Inline)
            );
            let apart = Payload::Apart(job.payload.len() as u64);
            let (read, payload) =
                decode(&encode(&mut written, apart).expect("encode")).expect("new");
            assert_eq!(written, job, "encode leaves the job as it was");
            assert_eq!(payload, apart);
            assert_eq!(
                read,
                Job {
                    payload: Vec::new(),
                    ..job
                }
            );
        }
    }

    /// Layout 2: the current fields but `priority`, unversioned.
    #[derive(Serialize)]
    struct JobV2Out<'a> {
        id: JobId,
        queue: &'a str,
        kind: &'a str,
        payload: &'a [u8],
        key: Option<&'a str>,
        status: Status,
        attempts: u32,
        max_attempts: u32,
        enqueued_at: SystemTime,
        run_at: SystemTime,
        lease: Option<&'a Lease>,
        finished_at: Option<SystemTime>,
        last_error: Option<&'a str>,
        history: &'a [Attempt],
        metadata: &'a Metadata,
    }

    fn current(running: bool, id: u64) -> Job {
        let (mut job, _) = decode(&old_record(running)).expect("an old record");
        job.id = JobId(id);
        job.metadata
            .insert("traceparent".into(), "00-abc-def-01".into());
        if let Some(lease) = job.lease.as_mut() {
            lease.owner = Some("ops".into());
        }
        job
    }

    fn v2_record(job: &Job) -> Vec<u8> {
        postcard::to_allocvec(&JobV2Out {
            id: job.id,
            queue: &job.queue,
            kind: &job.kind,
            payload: &job.payload,
            key: job.key.as_deref(),
            status: job.status,
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            enqueued_at: job.enqueued_at,
            run_at: job.run_at,
            lease: job.lease.as_ref(),
            finished_at: job.finished_at,
            last_error: job.last_error.as_deref(),
            history: &job.history,
            metadata: &job.metadata,
        })
        .expect("encode")
    }

    #[test]
    fn records_from_before_priorities_read_as_priority_zero() {
        // Ids whose varint first byte is large, or spans several bytes.
        for (running, id) in [(false, 1), (true, 0x7f), (true, 0x80), (false, u64::MAX)] {
            let job = current(running, id);
            let old = v2_record(&job);
            assert_ne!(old[0], MARKER, "an unversioned record never starts with 0");
            let (read, payload) = decode(&old).expect("a layout 2 record");
            assert_eq!(payload, Payload::Inline);
            assert_eq!(read, Job { priority: 0, ..job });
            assert_eq!(
                read.lease.as_ref().and_then(|l| l.owner.as_deref()),
                running.then_some("ops")
            );
        }
    }

    #[test]
    fn payloads_are_written_as_they_were_as_a_sequence_of_u8() {
        // `Job::payload` goes through serde as bytes; postcard must write
        // it as it wrote a `[u8]` sequence (length, then the bytes), or
        // every record would change layout.
        let job = current(false, 9);
        let record = postcard::to_allocvec(&job).expect("encode");
        let prefix =
            postcard::to_allocvec(&(job.id, &job.queue, &job.kind, job.payload.as_slice()))
                .expect("encode");
        assert!(record.starts_with(&prefix));
    }

    /// `job` (without a group, never snoozed) in the shape of layouts 3 to
    /// 5: the current body less its last fields, the group (`None` is one
    /// byte) and the snooze counts.
    fn without_group(job: &Job, prefix: Vec<u8>) -> Vec<u8> {
        assert_eq!(job.group, None);
        let mut bytes = without_snoozes(job, prefix);
        assert_eq!(bytes.pop(), Some(0), "the group comes before the snoozes");
        bytes
    }

    /// `job` (never snoozed) in the shape of layouts 6 and 7: the current
    /// body less its snooze counts.
    fn without_snoozes(job: &Job, prefix: Vec<u8>) -> Vec<u8> {
        let mut bytes = postcard::to_extend(job, prefix).expect("encode");
        assert!(
            bytes.ends_with(&SNOOZES_TAIL),
            "the snoozes are the last fields"
        );
        bytes.truncate(bytes.len() - SNOOZES_TAIL.len());
        bytes
    }

    #[test]
    fn layout_3_records_read_with_their_payload_inline() {
        let job = current(true, 42);
        let v3 = without_group(&job, vec![MARKER, INLINE_VERSION]);
        assert_eq!(decode(&v3).expect("decode"), (job, Payload::Inline));
    }

    /// `job` (no payload, no group) as a layout 5 record of a 600-byte
    /// payload in a file.
    fn v5_file(job: &Job) -> Vec<u8> {
        let mut v5 = postcard::to_extend(&600u64, vec![MARKER, V5]).expect("encode");
        v5.extend(without_group(job, Vec::new()));
        v5
    }

    fn job_with_payload(job: &Job) -> Job {
        Job {
            payload: b"order-4711".to_vec(),
            ..job.clone()
        }
    }

    #[test]
    fn records_from_before_groups_read_with_no_group() {
        let job = current(true, 42);
        let mut v4 = postcard::to_extend(&0u64, vec![MARKER, V4]).expect("encode");
        v4.extend(without_group(&job, Vec::new()));
        assert_eq!(decode(&v4).expect("decode"), (job.clone(), Payload::Inline));
        let apart = Job {
            payload: Vec::new(),
            ..job
        };
        let mut v5 = postcard::to_extend(&600u64, vec![MARKER, V5]).expect("encode");
        v5.extend(without_group(&apart, Vec::new()));
        assert_eq!(
            decode(&v5).expect("decode"),
            (apart.clone(), Payload::File(600))
        );
        v5[1] = V4;
        assert_eq!(
            decode(&v5).expect("decode"),
            (apart.clone(), Payload::Apart(600))
        );
        // A job without a group is still written in layouts 4 and 5, as
        // built by hand above; a grouped one in 6 and 7 (and one that
        // snoozed in 8 and 9).
        let mut plain = apart.clone();
        assert_eq!(
            encode(&mut plain, Payload::File(600)).expect("encode"),
            v5_file(&apart)
        );
        let mut inline = job_with_payload(&apart);
        let bytes = encode(&mut inline, Payload::Inline).expect("encode");
        assert_eq!(bytes[..2], [MARKER, V4]);
        assert_eq!(decode(&bytes).expect("decode"), (inline, Payload::Inline));
        let mut grouped = Job {
            group: Some("tenant-7".into()),
            ..apart
        };
        let bytes = encode(&mut grouped, Payload::File(600)).expect("encode");
        assert_eq!(bytes[..2], [MARKER, V7]);
        assert_eq!(
            decode(&bytes).expect("decode"),
            (grouped, Payload::File(600))
        );
    }

    #[test]
    fn records_from_before_snooze_counts_read_as_none_used_of_the_default() {
        let job = Job {
            group: Some("tenant-7".into()),
            ..current(true, 42)
        };
        let mut v6 = postcard::to_extend(&0u64, vec![MARKER, V6]).expect("encode");
        v6.extend(without_snoozes(&job, Vec::new()));
        assert_eq!(decode(&v6).expect("decode"), (job.clone(), Payload::Inline));
        let apart = Job {
            payload: Vec::new(),
            ..job
        };
        let mut v7 = postcard::to_extend(&600u64, vec![MARKER, V7]).expect("encode");
        v7.extend(without_snoozes(&apart, Vec::new()));
        assert_eq!(
            decode(&v7).expect("decode"),
            (apart.clone(), Payload::File(600))
        );
        // A job that snoozed, or allows other than the default, is written
        // in layouts 8 and 9, with or without a group, and reads back.
        for (group, snoozes, max_snoozes, payload) in [
            (None, 1, DEFAULT_MAX_SNOOZES, Payload::Inline),
            (None, 0, 5, Payload::File(600)),
            (Some("tenant-7"), 200, 10_000, Payload::Apart(600)),
            (Some("tenant-7"), 0, 0, Payload::Inline),
        ] {
            let mut snoozed = Job {
                group: group.map(Into::into),
                snoozes,
                max_snoozes,
                ..apart.clone()
            };
            if payload == Payload::Inline {
                snoozed.payload = b"order-4711".to_vec();
            }
            let bytes = encode(&mut snoozed, payload).expect("encode");
            let version = if matches!(payload, Payload::File(_)) {
                FILE_VERSION
            } else {
                VERSION
            };
            assert_eq!(bytes[..2], [MARKER, version]);
            assert_eq!(decode(&bytes).expect("decode"), (snoozed, payload));
        }
    }

    #[test]
    fn records_are_versioned_and_round_trip_without_their_payload() {
        let mut job = current(true, 42);
        job.priority = -100;
        job.group = Some("tenant-7".into());
        job.snoozes = 3;
        job.payload = vec![7; 10_000];
        assert_eq!(Payload::for_len(10_000), Payload::Apart(10_000));
        assert_eq!(Payload::for_len(INLINE_MAX), Payload::Inline);
        let bytes = encode(&mut job, Payload::for_len(10_000)).expect("encode");
        assert_eq!(job.payload.len(), 10_000, "encode puts the payload back");
        assert_eq!(&bytes[..2], &[MARKER, VERSION]);
        assert!(
            bytes.len() < 200,
            "the payload is not in the record: {} bytes",
            bytes.len()
        );
        let (read, payload) = decode(&bytes).expect("decode");
        assert_eq!(payload, Payload::Apart(10_000));
        assert_eq!(
            read,
            Job {
                payload: Vec::new(),
                ..job.clone()
            }
        );
        // A version this build does not know is an error, not a guess.
        let mut future = bytes.clone();
        future[1] = FILE_VERSION + 1;
        assert!(decode(&future).is_err());
        // In a file: layout 7, the same body.
        let in_file = encode(&mut job, Payload::File(10_000)).expect("encode");
        assert_eq!(&in_file[..2], &[MARKER, FILE_VERSION]);
        assert_eq!(&in_file[2..], &bytes[2..]);
        assert_eq!(
            decode(&in_file).expect("decode"),
            (read.clone(), Payload::File(10_000))
        );
        // A payload in a file is never empty.
        let mut empty = job.clone();
        empty.payload.clear();
        let no_len = encode(&mut empty, Payload::File(0)).expect("encode");
        assert!(decode(&no_len).is_err());
        // Trailing bytes mean another layout: refused.
        let mut longer = bytes;
        longer.push(0);
        assert!(decode(&longer).is_err());
    }
}
