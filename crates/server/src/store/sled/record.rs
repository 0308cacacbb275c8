//! A job's record on disk: the `Job` in postcard, and the one older layout
//! still read.
//!
//! postcard is positional, so adding a field changes the layout. Records
//! written before jobs had `metadata` and leases an `owner` (the first
//! releases) are still read: decoding tries the current layout, which must
//! consume the whole record, then the old one. Either way the record is
//! written back in the current layout on its next change.

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::job::{Attempt, Job, JobId, Lease, LeaseId, Status};

/// Encodes a job in the current layout.
pub fn encode(job: &Job) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(job)
}

/// Decodes a record of either layout.
pub fn decode(value: &[u8]) -> Result<Job, postcard::Error> {
    match postcard::take_from_bytes::<Job>(value) {
        Ok((job, [])) => Ok(job),
        Ok(_) | Err(_) => {
            let (old, rest) = postcard::take_from_bytes::<JobV1>(value)?;
            if !rest.is_empty() {
                return Err(postcard::Error::DeserializeBadEncoding);
            }
            Ok(old.into())
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

/// The job before `metadata`.
#[derive(Deserialize)]
struct JobV1 {
    id: JobId,
    queue: String,
    kind: String,
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
            let job = decode(&old_record(running)).expect("an old record");
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
            // Written back in the current layout, it reads the same.
            assert_eq!(decode(&encode(&job).expect("encode")).expect("new"), job);
        }
    }
}
