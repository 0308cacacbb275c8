//! The one check per RPC: role and queue, and the lease owner for Ack,
//! Fail, Heartbeat and adopted leases, made before the store is changed.
//! A job in a queue the token may not read is NOT_FOUND to it (see
//! [`super`]).

use super::{Caller, Role};
use crate::{
    error::{Error, Result},
    job::{JobId, LeaseId},
    store::Store,
};

/// Who is calling: anyone (tokens are off) or a token.
#[derive(Debug, Clone)]
pub enum Who {
    /// Tokens are off.
    Anyone,
    /// The caller's token.
    Token(Caller),
}

impl Who {
    /// The token, when tokens are on.
    pub fn caller(&self) -> Option<&Caller> {
        match self {
            Who::Anyone => None,
            Who::Token(c) => Some(c),
        }
    }

    /// The owner recorded on the leases this caller takes.
    pub fn owner(&self) -> Option<String> {
        match self {
            Who::Anyone => None,
            Who::Token(c) => Some(c.name().to_owned()),
        }
    }

    /// True when the caller may act in `role` on `queue`.
    pub fn may(&self, role: Role, queue: &str) -> bool {
        match self {
            Who::Anyone => true,
            Who::Token(c) => c.may(role, queue),
        }
    }

    /// True when the caller may read `queue` (ListJobs and Stats without a
    /// queue show only these).
    pub fn sees(&self, queue: &str) -> bool {
        self.may(Role::Read, queue)
    }

    /// True when the caller may read every queue: figures summed over all
    /// queues are theirs to see.
    pub fn sees_everything(&self) -> bool {
        match self {
            Who::Anyone => true,
            Who::Token(c) => c.may_everywhere(Role::Read),
        }
    }

    fn require(&self, role: Role, queue: &str) -> Result<()> {
        match self {
            Who::Token(c) if !c.may(role, queue) => Err(Error::PermissionDenied(format!(
                "token {:?} may not {} on queue {queue:?}",
                c.name(),
                verb(role)
            ))),
            _ => Ok(()),
        }
    }
}

fn verb(role: Role) -> &'static str {
    match role {
        Role::Produce => "produce",
        Role::Consume => "consume",
        Role::Read => "read",
        Role::Admin => "administer",
    }
}

/// What a call needs, described before the store is changed.
#[derive(Debug)]
pub enum Access<'a> {
    /// Enqueue into each of these queues (Enqueue, EnqueueBatch).
    Produce(Vec<&'a str>),
    /// Take from these queues (Dequeue, Lease). The leases a reconnecting
    /// Lease stream declares are checked by [`hidden_leases`].
    Take(&'a [String]),
    /// Complete these leases (Ack, Fail): a lease of a job the token may
    /// not see is NOT_FOUND. Heartbeat uses [`hidden_leases`], and reports
    /// such a lease lost, as one of a job that does not exist.
    Leases(&'a [(JobId, LeaseId)]),
    /// Read one job (GetJob).
    ReadJob(JobId),
    /// Read one queue (ListJobs, Stats with a queue); `None`: all queues,
    /// filtered afterwards with [`Who::sees`] (Stats, ListSchedules).
    ReadQueue(Option<&'a str>),
    /// List jobs of one queue, or (`None`) across every queue, which takes
    /// read on every queue: across queues a page would step through other
    /// queues' jobs, and its page token would name one of them.
    ListJobs(Option<&'a str>),
    /// Change one job as an operator (Retry, CancelJob, DeleteJob).
    Administer(JobId),
    /// Change one queue as an operator (PauseQueue, ResumeQueue,
    /// SetQueuePolicy, PurgeJobs, CreateSchedule on its queue).
    AdministerQueue(&'a str),
    /// Delete one schedule: the admin role on its queue. One on a queue
    /// the token may not read is NOT_FOUND, as a name that names none.
    AdministerSchedule(&'a str),
    /// Create a schedule, replacing any of the same name: the admin role
    /// on the queue the replaced one feeds. Names are one namespace, so a
    /// name taken on a queue the token may not administer is refused
    /// (PERMISSION_DENIED, naming no queue) rather than taken over.
    ReplaceSchedule(&'a str),
}

/// The one check per RPC: the caller's role on the queues involved, and
/// for leases, that the caller's token took them. Jobs named only by id
/// are read to learn their queue; a job that does not exist passes here
/// (for a token with the role on some queue) and is NOT_FOUND from the
/// store, and so is one in a queue the token may not read.
///
/// The owner check is fenced by the lease id: a lease id names one lease
/// for ever, so the owner read here is the owner of the lease the store
/// will then check, whatever happens in between.
///
/// # Errors
/// [`Error::PermissionDenied`]; store errors from reading jobs.
pub async fn authorize<S: Store>(store: &S, who: &Who, access: Access<'_>) -> Result<()> {
    let Who::Token(caller) = who else {
        return Ok(());
    };
    match access {
        Access::Produce(queues) => queues
            .into_iter()
            .try_for_each(|q| who.require(Role::Produce, q)),
        Access::Take(queues) => queues
            .iter()
            .try_for_each(|q| who.require(Role::Consume, q)),
        Access::Leases(held) => match hidden_leases(store, who, held).await?.first() {
            Some(&(id, _)) => Err(Error::NotFound(id)),
            None => Ok(()),
        },
        Access::ReadJob(id) => job_role(store, caller, id, Role::Read).await,
        Access::ReadQueue(Some(queue)) => who.require(Role::Read, queue),
        // Every queue (Stats), filtered afterwards; a token that reads no
        // queue at all is told so rather than shown an empty list.
        Access::ReadQueue(None) => match who {
            Who::Token(c) if !c.has_role(Role::Read) => Err(Error::PermissionDenied(format!(
                "token {:?} has no read role on any queue",
                c.name()
            ))),
            _ => Ok(()),
        },
        Access::ListJobs(Some(queue)) => who.require(Role::Read, queue),
        Access::ListJobs(None) if caller.may_everywhere(Role::Read) => Ok(()),
        Access::ListJobs(None) if !caller.has_role(Role::Read) => Err(Error::PermissionDenied(
            format!("token {:?} has no read role on any queue", caller.name()),
        )),
        Access::ListJobs(None) => Err(Error::PermissionDenied(format!(
            "token {:?} reads only some queues: name one (ListJobs across every queue needs read on `*`)",
            caller.name()
        ))),
        Access::Administer(id) => job_role(store, caller, id, Role::Admin).await,
        Access::AdministerQueue(queue) => who.require(Role::Admin, queue),
        Access::AdministerSchedule(name) | Access::ReplaceSchedule(name) => {
            caller.require_somewhere(Role::Admin)?;
            let replace = matches!(access, Access::ReplaceSchedule(_));
            match store.schedules().await?.iter().find(|s| s.name == name) {
                // Unknown: NOT_FOUND from the store (or created).
                None => Ok(()),
                Some(schedule) if caller.may(Role::Admin, &schedule.queue) => Ok(()),
                Some(schedule) if !replace && !caller.may(Role::Read, &schedule.queue) => {
                    Err(Error::ScheduleNotFound(name.to_owned()))
                }
                // Not naming the queue: the caller may not know it.
                Some(_) => Err(Error::PermissionDenied(format!(
                    "token {:?} may not administer schedule {name:?}",
                    caller.name()
                ))),
            }
        }
    }
}

/// `role` on the queue of job `id`. The role on some queue is checked
/// before the job is even read: a token without it is refused the same way
/// whether the id names a job or not, so it cannot learn which ids (or
/// queues) exist. A job that does not exist passes, and is NOT_FOUND from
/// the store; one in a queue the token may not read is NOT_FOUND here.
async fn job_role<S: Store>(store: &S, caller: &Caller, id: JobId, role: Role) -> Result<()> {
    caller.require_somewhere(role)?;
    match store.peek(id).await {
        Ok(job) => caller.require_on_job(role, &job.queue, id),
        Err(Error::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Checks leases named by job and lease id (Ack, Fail, Heartbeat, the
/// leases a Lease stream declares): the token must have the consume role
/// (on some queue at all, else it is refused whatever the ids name), and
/// on each job's queue, and must have taken the lease. Returns the leases
/// whose job is in a queue the token may not read (nor consume): the
/// caller answers for those as for a job that does not exist (NOT_FOUND,
/// a lost lease, a declared lease dropped), and must not act on them.
/// Empty when tokens are off.
///
/// # Errors
/// [`Error::PermissionDenied`]; store errors from reading jobs.
pub async fn hidden_leases<S: Store>(
    store: &S,
    who: &Who,
    held: &[(JobId, LeaseId)],
) -> Result<Vec<(JobId, LeaseId)>> {
    let Who::Token(caller) = who else {
        return Ok(Vec::new());
    };
    caller.require_somewhere(Role::Consume)?;
    let mut hidden = Vec::new();
    for &(id, lease_id) in held {
        let job = match store.peek(id).await {
            Ok(job) => job,
            Err(Error::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        match caller.require_on_job(Role::Consume, &job.queue, id) {
            Err(Error::NotFound(_)) => {
                hidden.push((id, lease_id));
                continue;
            }
            other => other?,
        }
        let Some(lease) = job.lease.as_ref().filter(|l| l.id == lease_id) else {
            // Not the current lease: the store answers ABORTED.
            continue;
        };
        if let Some(owner) = &lease.owner {
            if owner.as_str() != caller.name() {
                return Err(Error::PermissionDenied(format!(
                    "lease {lease_id} of job {id} was taken by another token"
                )));
            }
        }
    }
    Ok(hidden)
}

impl Caller {
    /// `role` on job `id`, which is in `queue`. A token that may not read
    /// the queue is told that the job does not exist, word for word as for
    /// an id that names no job. One that may read it (and so may see the
    /// job anyway) is refused, naming the job and not its queue.
    fn require_on_job(&self, role: Role, queue: &str, id: JobId) -> Result<()> {
        if self.may(role, queue) {
            return Ok(());
        }
        if !self.may(Role::Read, queue) {
            return Err(Error::NotFound(id));
        }
        Err(Error::PermissionDenied(format!(
            "token {:?} may not {} job {id}",
            self.name(),
            verb(role)
        )))
    }

    /// `role` on some queue: without it, a call naming a job or schedule
    /// is refused before anything is read, alike whether it exists or not.
    fn require_somewhere(&self, role: Role) -> Result<()> {
        if self.has_role(role) {
            return Ok(());
        }
        Err(Error::PermissionDenied(format!(
            "token {:?} has no {role} role on any queue",
            self.name()
        )))
    }
}
