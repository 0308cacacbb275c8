//! The job state machine: one pure function, [`apply`], that every store
//! calls for every change to a job.
//!
//! It does no I/O and never reads the clock or a random number generator:
//! `now`, the new lease id and the backoff jitter all come in as arguments,
//! so the same inputs always give the same job (docs/src/design.md §1).

use std::time::{Duration, SystemTime};

use crate::job::{
    Attempt, Job, JobId, Lease, LeaseId, Metadata, NewJob, Outcome, Progress, Report, Status,
};

/// Most attempts a job's history keeps (the most recent ones). A job can
/// be retried by an operator any number of times; without a bound its
/// record (and every reply carrying it) would grow without end.
pub const MAX_HISTORY: usize = 1000;

/// Exponential backoff between failed attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure.
    pub base: Duration,
    /// The longest delay.
    pub cap: Duration,
}

impl Backoff {
    /// The delay after the `attempts`-th failure: `base * 2^(attempts-1)`,
    /// capped, then scaled into `[50%, 100%]` by `jitter` (in `[0, 1]`), so
    /// jobs that failed together do not all come back at the same instant.
    pub fn delay(&self, attempts: u32, jitter: f64) -> Duration {
        let exp = attempts.saturating_sub(1).min(32);
        let full = self.base.saturating_mul(1u32 << exp.min(31)).min(self.cap);
        full.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }
}

/// Something that happens to an existing job.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A worker takes a due PENDING job under a fresh lease.
    Take {
        /// The new lease's fencing token (fresh, never used before).
        lease_id: LeaseId,
        /// Who takes it.
        worker_id: String,
        /// The token it is taken with (`None` when tokens are off).
        owner: Option<String>,
        /// How long the lease lasts.
        lease: Duration,
    },
    /// The lease holder completed the job.
    Ack {
        /// The lease presented.
        lease_id: LeaseId,
        /// The job's output, stored apart by the store in the ack's commit.
        result: Option<Vec<u8>>,
    },
    /// The lease holder reports a failure.
    Fail {
        /// The lease presented.
        lease_id: LeaseId,
        /// Why it failed.
        error: String,
        /// The worker's own delay before the next attempt; `None` = backoff.
        retry_delay: Option<Duration>,
        /// Do not retry: FAILED at once.
        fatal: bool,
        /// The server's backoff policy.
        backoff: Backoff,
        /// Uniform in `[0, 1]`, drawn by the caller.
        jitter: f64,
    },
    /// The lease holder puts the job back without failing it (a snooze: a
    /// rate limit said "later", or its worker is stopping). Back to PENDING,
    /// due after `delay`; the attempt is not counted, and its history entry
    /// ends SNOOZED with `reason`. `last_error` is unchanged: nothing
    /// failed. A job that has used its `max_snoozes` fails instead: the
    /// attempt counts and ends FAILED, and `delay` is its retry delay
    /// (docs/src/design.md §1 rule 3).
    Snooze {
        /// The lease presented.
        lease_id: LeaseId,
        /// Why, as the worker put it.
        reason: String,
        /// How long until the job is due again.
        delay: Duration,
    },
    /// The lease holder extends its lease (a heartbeat), and may report
    /// how far the job has come.
    Extend {
        /// The lease presented.
        lease_id: LeaseId,
        /// New lease length from now; `None` = the lease's own duration.
        extend_by: Option<Duration>,
        /// The job's progress, kept as its latest (stamped `now`).
        progress: Option<Report>,
    },
    /// The server takes the lease back: it expired, its stream ended, or an
    /// operator revoked it. The run counts as an attempt.
    Reclaim {
        /// The lease being taken back.
        lease_id: LeaseId,
        /// `LeaseExpired`, `WorkerDisconnected` or `Revoked`.
        outcome: Outcome,
    },
    /// The job never reached the worker (its push failed, or the stream
    /// never read it before the lease ran out): the take is undone. Back to
    /// PENDING in its old place, with no attempt counted and the attempt's
    /// history entry removed. A job that was never delivered must not spend
    /// an attempt.
    Return {
        /// The lease being undone.
        lease_id: LeaseId,
        /// Only if the lease has run out (the reaper's case: a heartbeat
        /// that got in first proves the job was delivered).
        if_expired: bool,
    },
    /// The server restarted: a lease that ran out (or is about to) while it
    /// was down is extended to `now + grace` (or `now +` the lease's own
    /// length), so that its worker can reconnect and heartbeat or ack. A
    /// server restart is not a worker death.
    RestartGrace {
        /// The lease.
        lease_id: LeaseId,
        /// The grace from startup; `None` = the lease's own duration.
        grace: Option<Duration>,
    },
    /// A later enqueue of a PENDING job's key replaces what it will run
    /// with (`on_conflict = REPLACE`, a debounce): its payload and
    /// metadata, and it is due after `delay` from now. Its id, attempts,
    /// history and place among jobs due at the same time (its id) stay.
    Replace {
        /// The new payload.
        payload: Vec<u8>,
        /// The new metadata.
        metadata: Metadata,
        /// Due this long from now.
        delay: Duration,
    },
    /// A later enqueue of the job's key took the key over (the job no
    /// longer held it under that enqueue's rules: finished, or past the
    /// enqueue's `unique_for`): the job keeps everything else, without a
    /// key, so that one job at most has a (queue, key).
    FreeKey,
    /// An operator brings a FAILED job back.
    Retry,
    /// An operator cancels a PENDING or RUNNING job: FAILED at once with
    /// `last_error = "cancelled: <reason>"`. A RUNNING job's attempt ends
    /// [`Outcome::Revoked`] (it counts as an attempt, like any run that
    /// ended without an ack) and its lease is gone, so the holder's ack,
    /// fail and heartbeat are stale. A cancelled job is a dead letter:
    /// [`Event::Retry`] brings it back.
    Cancel {
        /// The operator's reason (may be empty).
        reason: String,
    },
}

impl Event {
    /// A short name for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Take { .. } => "take",
            Event::Ack { .. } => "ack",
            Event::Fail { .. } => "fail",
            Event::Snooze { .. } => "snooze",
            Event::Extend { .. } => "extend",
            Event::Reclaim { .. } => "reclaim",
            Event::Return { .. } => "return",
            Event::RestartGrace { .. } => "restart grace",
            Event::Replace { .. } => "replace",
            Event::FreeKey => "free key",
            Event::Retry => "retry",
            Event::Cancel { .. } => "cancel",
        }
    }
}

/// Why a transition was refused. The job is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The event is not allowed from the job's status.
    #[error("cannot {event} job {id}: it is {status}")]
    NotAllowed {
        /// The job.
        id: JobId,
        /// Its status.
        status: Status,
        /// The refused event.
        event: &'static str,
    },
    /// The presented lease is not the job's current lease.
    #[error(
        "lease {lease_id} of job {id} is no longer held (the job was reclaimed or leased again)"
    )]
    StaleLease {
        /// The job.
        id: JobId,
        /// The presented lease.
        lease_id: LeaseId,
    },
    /// A take of a job whose `run_at` is still in the future.
    #[error("job {id} is not due yet")]
    NotDue {
        /// The job.
        id: JobId,
    },
    /// An extension of a lease that has already run out.
    #[error("lease {lease_id} of job {id} has expired")]
    Expired {
        /// The job.
        id: JobId,
        /// The presented lease.
        lease_id: LeaseId,
    },
    /// A delete of a RUNNING job: its worker holds it; cancel it first.
    #[error("job {id} is RUNNING: cancel it first (CancelJob), then delete it")]
    Running {
        /// The job.
        id: JobId,
    },
    /// A reclaim for expiry of a lease that has not run out.
    #[error("lease {lease_id} of job {id} has not expired")]
    NotExpired {
        /// The job.
        id: JobId,
        /// The lease.
        lease_id: LeaseId,
    },
}

/// Makes a new PENDING job from a validated request.
pub fn create(id: JobId, new: NewJob, now: SystemTime) -> Job {
    Job {
        id,
        queue: new.queue,
        kind: new.kind,
        payload: new.payload,
        key: new.key,
        status: Status::Pending,
        attempts: 0,
        max_attempts: new.max_attempts.max(1),
        priority: new.priority,
        enqueued_at: now,
        run_at: now + new.delay,
        lease: None,
        finished_at: None,
        last_error: None,
        history: Vec::new(),
        metadata: new.metadata,
        group: new.group,
        snoozes: 0,
        max_snoozes: new.max_snoozes,
        result: None,
        progress: None,
    }
}

/// Applies `event` to `job` at time `now`: the one place where a job
/// changes status. On error the job is returned unchanged to nobody: the
/// caller keeps its copy and stores nothing.
///
/// # Errors
/// [`TransitionError`] when the event is not allowed from the job's status,
/// or presents a lease the job no longer holds.
pub fn apply(mut job: Job, event: Event, now: SystemTime) -> Result<Job, TransitionError> {
    match event {
        Event::Take {
            lease_id,
            worker_id,
            owner,
            lease,
        } => {
            if job.status != Status::Pending {
                return Err(not_allowed(&job, "take"));
            }
            if job.run_at > now {
                return Err(TransitionError::NotDue { id: job.id });
            }
            if job.history.len() >= MAX_HISTORY {
                // Keep the record bounded across operator retries.
                job.history.remove(0);
            }
            job.history.push(Attempt {
                lease_id,
                worker_id: worker_id.clone(),
                started_at: now,
                ended_at: None,
                outcome: None,
                error: None,
            });
            job.lease = Some(Lease {
                id: lease_id,
                worker_id,
                taken_at: now,
                expires_at: now + lease,
                duration: lease,
                owner,
            });
            job.status = Status::Running;
            Ok(job)
        }
        Event::Ack { lease_id, result } => {
            held_lease(&job, lease_id, "ack")?;
            end_attempt(&mut job, Outcome::Acked, None, now);
            job.result = result;
            job.status = Status::Done;
            job.finished_at = Some(now);
            // The last attempt ended well; the errors of earlier ones stay
            // in the history (docs/src/design.md §1).
            job.last_error = None;
            Ok(job)
        }
        Event::Fail {
            lease_id,
            error,
            retry_delay,
            fatal,
            backoff,
            jitter,
        } => {
            held_lease(&job, lease_id, "fail")?;
            let delay = |attempts| retry_delay.unwrap_or_else(|| backoff.delay(attempts, jitter));
            fail_attempt(&mut job, error, fatal, delay, now);
            Ok(job)
        }
        Event::Snooze {
            lease_id,
            reason,
            delay,
        } => {
            held_lease(&job, lease_id, "snooze")?;
            if job.snoozes >= job.max_snoozes {
                // Past its snoozes, a job that keeps saying "later" is
                // failing: the attempt counts, with the snooze's delay as
                // its retry delay.
                let error = over_snoozed(job.snoozes, &reason);
                fail_attempt(&mut job, error, false, |_| delay, now);
            } else {
                job.snoozes += 1;
                end_attempt(&mut job, Outcome::Snoozed, Some(reason), now);
                job.status = Status::Pending;
                job.run_at = now + delay;
            }
            Ok(job)
        }
        Event::Extend {
            lease_id,
            extend_by,
            progress,
        } => {
            let (expires_at, duration) = held_lease(&job, lease_id, "extend")?;
            if expires_at <= now {
                return Err(TransitionError::Expired {
                    id: job.id,
                    lease_id,
                });
            }
            if let Some(lease) = job.lease.as_mut() {
                lease.expires_at = now + extend_by.unwrap_or(duration);
            }
            if let Some(Report { percent, message }) = progress {
                job.progress = Some(Progress {
                    percent,
                    message,
                    reported_at: now,
                    lease_id,
                });
            }
            Ok(job)
        }
        Event::Reclaim { lease_id, outcome } => {
            let (expires_at, _) = held_lease(&job, lease_id, "reclaim")?;
            if outcome == Outcome::LeaseExpired && expires_at > now {
                return Err(TransitionError::NotExpired {
                    id: job.id,
                    lease_id,
                });
            }
            job.attempts += 1;
            let reason = outcome.reason().to_owned();
            end_attempt(&mut job, outcome, Some(reason.clone()), now);
            job.last_error = Some(reason);
            if job.attempts >= job.max_attempts {
                finish_failed(&mut job, now);
            } else {
                // Due again at once, behind the jobs that were already due.
                job.status = Status::Pending;
                job.run_at = now;
            }
            Ok(job)
        }
        Event::Return {
            lease_id,
            if_expired,
        } => {
            let (expires_at, _) = held_lease(&job, lease_id, "return")?;
            if if_expired && expires_at > now {
                return Err(TransitionError::NotExpired {
                    id: job.id,
                    lease_id,
                });
            }
            if job.history.last().is_some_and(|a| a.lease_id == lease_id) {
                job.history.pop();
            }
            job.lease = None;
            job.status = Status::Pending;
            Ok(job)
        }
        Event::RestartGrace { lease_id, grace } => {
            let (expires_at, duration) = held_lease(&job, lease_id, "restart grace")?;
            let until = now + grace.unwrap_or(duration);
            if let Some(lease) = job.lease.as_mut() {
                lease.expires_at = expires_at.max(until);
            }
            Ok(job)
        }
        Event::Replace {
            payload,
            metadata,
            delay,
        } => {
            if job.status != Status::Pending {
                return Err(not_allowed(&job, "replace"));
            }
            job.payload = payload;
            job.metadata = metadata;
            job.run_at = now + delay;
            Ok(job)
        }
        Event::FreeKey => {
            job.key = None;
            Ok(job)
        }
        Event::Retry => {
            if job.status != Status::Failed {
                return Err(not_allowed(&job, "retry"));
            }
            job.status = Status::Pending;
            job.attempts = 0;
            job.snoozes = 0;
            job.run_at = now;
            job.finished_at = None;
            Ok(job)
        }
        Event::Cancel { reason } => {
            let error = cancelled(&reason);
            match job.status {
                Status::Pending => {}
                Status::Running => {
                    // A RUNNING job has attempts < max_attempts (the take
                    // requires a job that is not FAILED), so this keeps
                    // attempts <= max_attempts.
                    job.attempts = (job.attempts + 1).min(job.max_attempts);
                    end_attempt(&mut job, Outcome::Revoked, Some(error.clone()), now);
                }
                Status::Done | Status::Failed => return Err(not_allowed(&job, "cancel")),
            }
            job.last_error = Some(error);
            finish_failed(&mut job, now);
            Ok(job)
        }
    }
}

/// Whether an operator may delete `job` for good: any job but a RUNNING
/// one (its worker holds a lease on it; DeleteJob never pulls a job from
/// under a worker).
///
/// # Errors
/// [`TransitionError::Running`].
pub fn deletable(job: &Job) -> Result<(), TransitionError> {
    match job.status {
        Status::Running => Err(TransitionError::Running { id: job.id }),
        Status::Pending | Status::Done | Status::Failed => Ok(()),
    }
}

/// The longest text [`over_snoozed`] puts before a snooze's reason.
pub const OVER_SNOOZED_PREFIX_MAX: usize = "snoozed 4294967295 times, its max_snoozes: ".len();

/// The error of a snooze past the job's `max_snoozes`, a failed attempt.
fn over_snoozed(snoozes: u32, reason: &str) -> String {
    format!("snoozed {snoozes} times, its max_snoozes: {reason}")
}

/// What the `last_error` of a cancelled job with a reason begins with.
pub const CANCELLED_PREFIX: &str = "cancelled: ";

/// The `last_error` of a cancelled job: `cancelled: <reason>`, or
/// `cancelled` without one.
pub fn cancelled(reason: &str) -> String {
    match reason.trim() {
        "" => "cancelled".to_owned(),
        _ => format!("{CANCELLED_PREFIX}{reason}"),
    }
}

fn not_allowed(job: &Job, event: &'static str) -> TransitionError {
    TransitionError::NotAllowed {
        id: job.id,
        status: job.status,
        event,
    }
}

/// Checks that `lease_id` is the job's current lease and returns its expiry
/// and length.
///
/// A lease that is not current is stale (ABORTED), with one exception: the
/// holder of the lease that acked the job repeating itself is told the job
/// is DONE (FAILED_PRECONDITION), not that it lost something.
fn held_lease(
    job: &Job,
    lease_id: LeaseId,
    event: &'static str,
) -> Result<(SystemTime, Duration), TransitionError> {
    match &job.lease {
        Some(lease) if lease.id == lease_id => Ok((lease.expires_at, lease.duration)),
        Some(_) => Err(TransitionError::StaleLease {
            id: job.id,
            lease_id,
        }),
        None => {
            let last = job.history.last();
            if job.status == Status::Done && last.is_some_and(|a| a.lease_id == lease_id) {
                Err(not_allowed(job, event))
            } else {
                Err(TransitionError::StaleLease {
                    id: job.id,
                    lease_id,
                })
            }
        }
    }
}

/// Closes the running attempt (the last history entry) and drops the lease.
fn end_attempt(job: &mut Job, outcome: Outcome, error: Option<String>, now: SystemTime) {
    if let Some(attempt) = job.history.last_mut() {
        attempt.ended_at = Some(now);
        attempt.outcome = Some(outcome);
        attempt.error = error;
    }
    job.lease = None;
}

/// Ends the running attempt as a failure with `error`: counted, and the
/// job FAILED when `fatal` or out of attempts, else PENDING again after
/// `delay` of the attempts spent.
fn fail_attempt(
    job: &mut Job,
    error: String,
    fatal: bool,
    delay: impl FnOnce(u32) -> Duration,
    now: SystemTime,
) {
    job.attempts += 1;
    end_attempt(job, Outcome::Failed, Some(error.clone()), now);
    job.last_error = Some(error);
    if fatal || job.attempts >= job.max_attempts {
        finish_failed(job, now);
    } else {
        job.status = Status::Pending;
        job.run_at = now + delay(job.attempts);
    }
}

fn finish_failed(job: &mut Job, now: SystemTime) {
    job.status = Status::Failed;
    job.finished_at = Some(now);
}

#[cfg(test)]
mod tests;
