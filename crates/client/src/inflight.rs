//! The worker's book of in-flight leases: what the heartbeat extends, and
//! whose handler to cancel when a lease is lost.
//!
//! Pure bookkeeping (no I/O, no clock): the worker holds it behind a std
//! `Mutex` that is never held across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use jobq::pb;
use tokio_util::sync::CancellationToken;

/// A lease deadline shared between the book (which moves it forward after a
/// heartbeat) and the handler's [`JobContext`](crate::JobContext).
pub(crate) type Deadline = Arc<Mutex<SystemTime>>;

/// The progress a handler reported that no heartbeat has carried yet,
/// shared between the book (which sends it with the next heartbeat and
/// forgets it once the server took it) and the handler's
/// [`JobContext`](crate::JobContext), which replaces it with a newer one.
pub(crate) type Unsent = Arc<Mutex<Option<pb::Progress>>>;

#[derive(Debug)]
struct Entry {
    lease_id: String,
    cancel: CancellationToken,
    deadline: Deadline,
    progress: Unsent,
    /// Its ack or fail has been sent: the server's answer to that call,
    /// not a heartbeat that crossed it, says whether the lease was lost.
    settling: bool,
}

/// In-flight jobs by job id. A job is in the book from the moment its lease
/// arrives until its ack/fail is settled or its lease is found lost.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    jobs: HashMap<String, Entry>,
}

impl InFlight {
    /// Records a new lease. If the same job was already in the book under
    /// another lease, that older lease is necessarily lost (a job has one
    /// lease at a time): its token is returned for the caller to cancel.
    pub(crate) fn insert(
        &mut self,
        job_id: String,
        lease_id: String,
        cancel: CancellationToken,
        deadline: Deadline,
        progress: Unsent,
    ) -> Option<CancellationToken> {
        let old = self.jobs.insert(
            job_id,
            Entry {
                lease_id,
                cancel,
                deadline,
                progress,
                settling: false,
            },
        );
        old.map(|entry| entry.cancel)
    }

    /// Marks a lease whose ack or fail is on its way: a heartbeat reply that
    /// calls it lost (the server may have applied the ack first) leaves it
    /// alone; the ack's own reply decides.
    pub(crate) fn settling(&mut self, job_id: &str, lease_id: &str) {
        if let Some(e) = self.jobs.get_mut(job_id).filter(|e| e.lease_id == lease_id) {
            e.settling = true;
        }
    }

    /// Forgets a job, but only under the lease the caller ran it with: a
    /// finished stale run must not drop a newer lease of the same job.
    pub(crate) fn remove(&mut self, job_id: &str, lease_id: &str) -> bool {
        if self
            .jobs
            .get(job_id)
            .is_some_and(|e| e.lease_id == lease_id)
        {
            self.jobs.remove(job_id);
            true
        } else {
            false
        }
    }

    /// Every lease to extend, with the progress its handler reported since
    /// the last heartbeat that carried one, sorted by job id (so one tick's
    /// request is deterministic).
    pub(crate) fn snapshot(&self) -> Vec<pb::LeaseRef> {
        let mut refs: Vec<_> = self
            .jobs
            .iter()
            .map(|(job_id, e)| pb::LeaseRef {
                job_id: job_id.clone(),
                lease_id: e.lease_id.clone(),
                progress: e.progress.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            })
            .collect();
        refs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        refs
    }

    /// Applies a heartbeat reply. `sent` is what the request carried, `lost`
    /// what the server said the worker no longer holds. Lost leases still in
    /// the book leave it and are returned with their tokens for cancelling
    /// (one that already left, e.g. revoked meanwhile, is skipped); the others
    /// that are still in the book get `new_deadline`. A lease that finished
    /// while the heartbeat was in flight is left alone.
    pub(crate) fn apply_heartbeat(
        &mut self,
        sent: &[pb::LeaseRef],
        lost: &[pb::LeaseRef],
        new_deadline: SystemTime,
    ) -> Vec<(pb::LeaseRef, CancellationToken)> {
        let mut cancelled = Vec::new();
        for r in lost {
            if let Some(token) = self.take(&r.job_id, &r.lease_id) {
                cancelled.push((r.clone(), token));
            }
        }
        for r in sent {
            if lost
                .iter()
                .any(|l| l.job_id == r.job_id && l.lease_id == r.lease_id)
            {
                // Lost but settling: its ack's reply decides, and the
                // deadline must not pretend the server still holds it.
                continue;
            }
            if let Some(e) = self
                .jobs
                .get(&r.job_id)
                .filter(|e| e.lease_id == r.lease_id)
            {
                *e.deadline.lock().unwrap_or_else(|p| p.into_inner()) = new_deadline;
                // Taken: unless the handler reported again meanwhile.
                let mut unsent = e.progress.lock().unwrap_or_else(|p| p.into_inner());
                if r.progress.is_some() && *unsent == r.progress {
                    *unsent = None;
                }
            }
        }
        cancelled
    }

    /// Handles a `revoked` event: if the book holds that lease, it leaves
    /// and its token is returned for cancelling.
    pub(crate) fn revoke(&mut self, job_id: &str, lease_id: &str) -> Option<CancellationToken> {
        self.take(job_id, lease_id)
    }

    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    fn take(&mut self, job_id: &str, lease_id: &str) -> Option<CancellationToken> {
        let entry = self.jobs.get(job_id)?;
        if entry.lease_id != lease_id || entry.settling {
            return None;
        }
        self.jobs.remove(job_id).map(|e| e.cancel)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn lease(job: &str, lease: &str) -> pb::LeaseRef {
        pb::LeaseRef {
            job_id: job.into(),
            lease_id: lease.into(),
            progress: None,
        }
    }

    fn deadline(t: SystemTime) -> Deadline {
        Arc::new(Mutex::new(t))
    }

    fn unsent() -> Unsent {
        Arc::new(Mutex::new(None))
    }

    fn book(entries: &[(&str, &str)]) -> (InFlight, Vec<(CancellationToken, Deadline)>) {
        let mut book = InFlight::default();
        let handles = entries
            .iter()
            .map(|(job, l)| {
                let (token, d) = (CancellationToken::new(), deadline(SystemTime::UNIX_EPOCH));
                assert!(book
                    .insert(
                        job.to_string(),
                        l.to_string(),
                        token.clone(),
                        d.clone(),
                        unsent()
                    )
                    .is_none());
                (token, d)
            })
            .collect();
        (book, handles)
    }

    #[test]
    fn snapshot_lists_every_lease_in_one_batch() {
        let (book, _) = book(&[("j2", "l2"), ("j1", "l1"), ("j3", "l3")]);
        assert_eq!(
            book.snapshot(),
            vec![lease("j1", "l1"), lease("j2", "l2"), lease("j3", "l3")]
        );
    }

    #[test]
    fn heartbeat_cancels_lost_and_extends_the_rest() {
        let (mut book, handles) = book(&[("j1", "l1"), ("j2", "l2")]);
        let sent = book.snapshot();
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(60);
        let cancelled = book.apply_heartbeat(&sent, &[lease("j1", "l1")], later);
        assert_eq!(cancelled.len(), 1);
        assert_eq!(cancelled[0].0, lease("j1", "l1"));
        cancelled[0].1.cancel();
        assert!(handles[0].0.is_cancelled());
        assert!(!handles[1].0.is_cancelled());
        assert_eq!(book.snapshot(), vec![lease("j2", "l2")]);
        assert_eq!(*handles[1].1.lock().unwrap(), later);
        assert_eq!(*handles[0].1.lock().unwrap(), SystemTime::UNIX_EPOCH);
    }

    #[test]
    fn a_heartbeat_that_crossed_the_ack_does_not_call_the_lease_lost() {
        let (mut book, handles) = book(&[("j1", "l1")]);
        let sent = book.snapshot();
        book.settling("j1", "l1");
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(60);
        assert!(book
            .apply_heartbeat(&sent, &[lease("j1", "l1")], later)
            .is_empty());
        assert!(!handles[0].0.is_cancelled());
        assert_eq!(
            *handles[0].1.lock().unwrap(),
            SystemTime::UNIX_EPOCH,
            "a lease the server calls lost is not extended"
        );
        assert!(book.remove("j1", "l1"), "the ack's reply removes it");
    }

    #[test]
    fn heartbeat_ignores_leases_it_no_longer_tracks() {
        let (mut book, handles) = book(&[("j1", "l1")]);
        let sent = book.snapshot();
        // The job finished while the heartbeat was in flight, and was then
        // leased to us again under a new lease.
        assert!(book.remove("j1", "l1"));
        let (token, d) = (CancellationToken::new(), deadline(SystemTime::UNIX_EPOCH));
        book.insert("j1".into(), "l9".into(), token.clone(), d.clone(), unsent());
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(60);
        assert!(book
            .apply_heartbeat(&sent, &[lease("j1", "l1")], later)
            .is_empty());
        assert!(!token.is_cancelled());
        assert_eq!(
            *d.lock().unwrap(),
            SystemTime::UNIX_EPOCH,
            "new lease was not in the request"
        );
        assert!(!handles[0].0.is_cancelled());
    }

    #[test]
    fn revoke_needs_the_matching_lease() {
        let (mut book, _) = book(&[("j1", "l1")]);
        assert!(book.revoke("j1", "other").is_none());
        assert!(book.revoke("nope", "l1").is_none());
        assert!(book.revoke("j1", "l1").is_some());
        assert_eq!(book.len(), 0);
    }

    #[test]
    fn releasing_the_same_job_returns_the_stale_token() {
        let (mut book, handles) = book(&[("j1", "l1")]);
        let old = book.insert(
            "j1".into(),
            "l2".into(),
            CancellationToken::new(),
            deadline(SystemTime::UNIX_EPOCH),
            unsent(),
        );
        old.expect("old lease token").cancel();
        assert!(handles[0].0.is_cancelled());
        // The stale run finishing must not remove the new lease.
        assert!(!book.remove("j1", "l1"));
        assert_eq!(book.snapshot(), vec![lease("j1", "l2")]);
    }
}
