//! Who may call what (docs/src/design.md §6).
//!
//! - [`Tokens`]: the `--auth-tokens` file, `[[token]]` entries of a name,
//!   the SHA-256 of the secret, queue globs and roles. Secrets are never
//!   stored; a presented secret is hashed and compared in constant time.
//! - [`Auth`]: the reloadable table (SIGHUP swaps it; connections stay up)
//!   and the tonic interceptor that turns `authorization: Bearer <secret>`
//!   into a [`Caller`] in the request's extensions, or UNAUTHENTICATED.
//! - [`Who`] and [`authorize`]: the one check per RPC, role and queue, and
//!   the lease owner for Ack, Fail, Heartbeat and adopted leases, made
//!   before the store is changed.
//!
//! A job (or schedule) in a queue the token may not read is, to that
//! token, a job that does not exist: every call naming it by id gets the
//! NOT_FOUND, with the same message, that an id naming nothing gets.
//! Else a token could count another tenant's jobs, or learn its
//! schedules' names, by asking about ids and names.
//!
//! Health and reflection are not behind the interceptor: they reveal no
//! jobs.

use std::{
    collections::HashSet,
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::{metadata::MetadataMap, Request, Status};

use crate::{
    error::{Error, Result},
    job::{JobId, LeaseId},
    store::Store,
};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Enqueue, EnqueueBatch.
    Produce,
    /// Dequeue, Lease, Ack, Fail, Heartbeat.
    Consume,
    /// GetJob, ListJobs, Stats.
    Read,
    /// All of the above, plus Retry and every operator call (CancelJob,
    /// PauseQueue, ResumeQueue, DeleteJob, PurgeJobs, CreateSchedule,
    /// DeleteSchedule).
    Admin,
}

impl Role {
    /// Every role, in the order the docs list them.
    pub const ALL: [Role; 4] = [Role::Produce, Role::Consume, Role::Read, Role::Admin];

    /// The role's name in the tokens file.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Produce => "produce",
            Role::Consume => "consume",
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role {s:?}: expected produce, consume, read or admin"))
    }
}

/// Why a tokens file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file could not be read.
    #[error("cannot read the tokens file {path}: {cause}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("tokens file: {0}")]
    Syntax(String),
    /// An entry is wrong (bad digest, bad glob, duplicate name).
    #[error("tokens file, token {name:?}: {why}")]
    Entry {
        /// The entry's name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// A reload found no token in the file: refused, since a file read
    /// while an editor rewrites it in place is empty, and taking it would
    /// refuse every caller.
    #[error("the tokens file names no token (half-written? replace it atomically)")]
    Empty,
}

/// One `[[token]]` entry, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    sha256: String,
    queues: Vec<String>,
    roles: Vec<Role>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    token: Vec<Entry>,
}

/// A known token: who it names and what it may do.
#[derive(Debug)]
struct Token {
    name: Arc<str>,
    digest: [u8; 32],
    queues: GlobSet,
    /// One of its patterns is `*`: it covers every queue there is.
    all_queues: bool,
    roles: u8,
}

/// The parsed tokens file.
#[derive(Debug, Default)]
pub struct Tokens {
    entries: Vec<Arc<Token>>,
}

/// The hex SHA-256 of a secret, as the tokens file stores it.
pub fn digest_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

impl Tokens {
    /// Parses the TOML text of a tokens file.
    ///
    /// # Errors
    /// Bad TOML, unknown keys or roles, a digest that is not 64 hex
    /// digits, a bad glob, or two entries with one name or one digest.
    pub fn parse(text: &str) -> std::result::Result<Tokens, TokensError> {
        let file: File = toml::from_str(text).map_err(|e| TokensError::Syntax(e.to_string()))?;
        let mut names = HashSet::new();
        let mut digests = HashSet::new();
        let mut entries = Vec::with_capacity(file.token.len());
        for entry in file.token {
            let bad = |why: String| TokensError::Entry {
                name: entry.name.clone(),
                why,
            };
            if entry.name.is_empty() {
                return Err(bad("the name is empty".into()));
            }
            if !names.insert(entry.name.clone()) {
                return Err(bad("another token has the same name".into()));
            }
            let mut digest = [0u8; 32];
            hex::decode_to_slice(entry.sha256.trim(), &mut digest)
                .map_err(|e| bad(format!("sha256 must be 64 hex digits: {e}")))?;
            if !digests.insert(digest) {
                return Err(bad("another token has the same secret".into()));
            }
            let mut globs = GlobSetBuilder::new();
            for pattern in &entry.queues {
                globs.add(Glob::new(pattern).map_err(|e| bad(format!("queues: {e}")))?);
            }
            let queues = globs.build().map_err(|e| bad(format!("queues: {e}")))?;
            let all_queues = entry.queues.iter().any(|p| p == "*");
            let roles = entry.roles.iter().fold(0, |acc, r| acc | r.bit());
            entries.push(Arc::new(Token {
                name: entry.name.into(),
                digest,
                queues,
                all_queues,
                roles,
            }));
        }
        Ok(Tokens { entries })
    }

    /// Reads and parses a tokens file.
    ///
    /// # Errors
    /// As [`Tokens::parse`], or when the file cannot be read.
    pub fn load(path: &Path) -> std::result::Result<Tokens, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|cause| TokensError::Read {
            path: path.to_owned(),
            cause,
        })?;
        Tokens::parse(&text)
    }

    /// How many tokens the file names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the file names no token (then nobody gets in).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The token whose secret this is. Every entry is compared, in
    /// constant time, so the timing says nothing about which digest
    /// matched how far.
    fn find(&self, secret: &str) -> Option<Caller> {
        let presented: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let mut found = None;
        for token in &self.entries {
            if bool::from(token.digest.ct_eq(&presented)) {
                found = Some(Arc::clone(token));
            }
        }
        found.map(Caller)
    }
}

/// An authenticated caller: the token it presented. Put into the request's
/// extensions by the interceptor; handlers never parse headers.
#[derive(Debug, Clone)]
pub struct Caller(Arc<Token>);

impl Caller {
    /// The token's name (a lease's owner).
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// True when the token has `role` (or admin) on some queue.
    pub fn has_role(&self, role: Role) -> bool {
        (self.0.roles & (role.bit() | Role::Admin.bit())) != 0
    }

    /// True when the token has `role` (or admin) on every queue (its
    /// queues include the pattern `*`).
    pub fn may_everywhere(&self, role: Role) -> bool {
        self.has_role(role) && self.0.all_queues
    }

    /// True when both present the same secret (whatever the token's name
    /// or rights are now).
    pub fn same_secret(&self, other: &Caller) -> bool {
        self.0.digest == other.0.digest
    }

    /// True when the token has `role` (or admin) on `queue`.
    pub fn may(&self, role: Role, queue: &str) -> bool {
        let roles = self.0.roles;
        (roles & (role.bit() | Role::Admin.bit())) != 0 && self.0.queues.is_match(queue)
    }

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

/// The reloadable token table, and the interceptor in front of the
/// JobQueue service.
#[derive(Clone, Default)]
pub struct Auth {
    /// `None`: tokens are off, every caller may do everything.
    table: Option<Arc<RwLock<Arc<Tokens>>>>,
    path: Option<PathBuf>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth").field("path", &self.path).finish()
    }
}

impl Auth {
    /// No tokens: every caller may do everything.
    pub fn off() -> Auth {
        Auth::default()
    }

    /// Tokens from `path` (`--auth-tokens`).
    ///
    /// # Errors
    /// When the file cannot be read or is not valid.
    pub fn from_file(path: &Path) -> std::result::Result<Auth, TokensError> {
        let tokens = Tokens::load(path)?;
        Ok(Auth {
            table: Some(Arc::new(RwLock::new(Arc::new(tokens)))),
            path: Some(path.to_owned()),
        })
    }

    /// Tokens given directly (tests and embedding).
    pub fn from_tokens(tokens: Tokens) -> Auth {
        Auth {
            table: Some(Arc::new(RwLock::new(Arc::new(tokens)))),
            path: None,
        }
    }

    /// True when callers must present a token.
    pub fn enabled(&self) -> bool {
        self.table.is_some()
    }

    /// Reads the file again and swaps the table in; calls in flight and
    /// open connections keep going. A bad file, or one with no token,
    /// leaves the old table in place. Returns how many tokens are now
    /// known.
    ///
    /// # Errors
    /// When the file cannot be read, is not valid, or names no token
    /// ([`TokensError::Empty`]).
    pub fn reload(&self) -> std::result::Result<usize, TokensError> {
        let (Some(table), Some(path)) = (&self.table, &self.path) else {
            return Ok(0);
        };
        let tokens = Tokens::load(path)?;
        if tokens.is_empty() {
            return Err(TokensError::Empty);
        }
        let n = tokens.len();
        *table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
        Ok(n)
    }

    /// Why a Lease stream that `caller` opened on `queues` may no longer
    /// run under the current tokens (after a reload): its token is gone
    /// (or its secret changed), or no longer consumes one of the queues.
    /// `None` while it still may, and when tokens are off.
    pub fn stream_refused(&self, caller: &Caller, queues: &[String]) -> Option<Error> {
        let tokens = self.current()?;
        let Some(now) = tokens
            .entries
            .iter()
            .find(|t| t.digest == caller.0.digest)
            .map(|t| Caller(Arc::clone(t)))
        else {
            return Some(Error::Unauthenticated(format!(
                "token {:?} was revoked",
                caller.name()
            )));
        };
        let queue = queues.iter().find(|q| !now.may(Role::Consume, q))?;
        Some(Error::PermissionDenied(format!(
            "token {:?} may no longer consume on queue {queue:?}",
            now.name()
        )))
    }

    /// The caller presenting `caller`'s secret under the current tokens,
    /// with the rights its entry has now; `None` once that secret is no
    /// longer in the file (revoked, or its secret changed) or tokens are
    /// off. For what outlives one request, as a dashboard session does.
    pub fn current_caller(&self, caller: &Caller) -> Option<Caller> {
        self.current()?
            .entries
            .iter()
            .find(|t| t.digest == caller.0.digest)
            .map(|t| Caller(Arc::clone(t)))
    }

    fn current(&self) -> Option<Arc<Tokens>> {
        self.table
            .as_ref()
            .map(|t| Arc::clone(&t.read().unwrap_or_else(|p| p.into_inner())))
    }

    /// The caller a bearer secret names. `Ok(None)` when tokens are off.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] for a missing or unknown secret.
    pub fn authenticate_secret(&self, secret: Option<&str>) -> Result<Option<Caller>> {
        let Some(tokens) = self.current() else {
            return Ok(None);
        };
        let secret = secret.ok_or_else(|| {
            Error::Unauthenticated(
                "this server needs a token: send `authorization: Bearer <secret>`".into(),
            )
        })?;
        tokens
            .find(secret)
            .map(Some)
            .ok_or_else(|| Error::Unauthenticated("unknown token".into()))
    }

    /// The caller the request's `authorization` header names.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] for a missing, malformed or unknown token.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Option<Caller>> {
        if !self.enabled() {
            return Ok(None);
        }
        let secret = match metadata.get("authorization") {
            None => None,
            Some(value) => Some(bearer(value.to_str().ok()).ok_or_else(|| {
                Error::Unauthenticated(
                    "malformed authorization header: expected `Bearer <secret>`".into(),
                )
            })?),
        };
        self.authenticate_secret(secret)
    }

    /// The per-request identity of a call that passed the interceptor.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] when tokens are on and the request has no
    /// caller (it did not pass the interceptor).
    pub fn who<T>(&self, req: &Request<T>) -> Result<Who> {
        if !self.enabled() {
            return Ok(Who::Anyone);
        }
        req.extensions()
            .get::<Caller>()
            .cloned()
            .map(Who::Token)
            .ok_or_else(|| Error::Unauthenticated("no token".into()))
    }
}

/// The secret of a `Bearer <secret>` header value (scheme case-insensitive).
pub fn bearer(value: Option<&str>) -> Option<&str> {
    let value = value?.trim();
    let (scheme, secret) = value.split_once(' ')?;
    let secret = secret.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !secret.is_empty()).then_some(secret)
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(caller) = self.authenticate(req.metadata())? {
            req.extensions_mut().insert(caller);
        }
        Ok(req)
    }
}

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
    /// Change one queue as an operator (PauseQueue, ResumeQueue, PurgeJobs,
    /// CreateSchedule on its queue).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens::parse(&format!(
            r#"
            [[token]]
            name = "mailer"
            sha256 = "{}"
            queues = ["emails", "billing.*"]
            roles = ["produce", "read"]

            [[token]]
            name = "ops"
            sha256 = "{}"
            queues = ["*"]
            roles = ["admin"]
            "#,
            digest_hex("s3cret"),
            digest_hex("root")
        ))
        .unwrap()
    }

    #[test]
    fn a_secret_finds_its_token_and_roles_apply_per_queue() {
        let t = tokens();
        let mailer = t.find("s3cret").unwrap();
        assert_eq!(mailer.name(), "mailer");
        assert!(mailer.may(Role::Produce, "emails"));
        assert!(mailer.may(Role::Read, "billing.eu"));
        assert!(!mailer.may(Role::Produce, "billing"));
        assert!(!mailer.may(Role::Consume, "emails"));
        assert!(!mailer.may(Role::Admin, "emails"));
        let ops = t.find("root").unwrap();
        assert!(Role::ALL.iter().all(|&r| ops.may(r, "anything")));
        assert!(t.find("S3cret").is_none());
        assert!(t.find("").is_none());
    }

    #[test]
    fn bad_files_are_refused_with_the_entry_named() {
        for (text, needle) in [
            ("[[token]]\nname='a'\nsha256='zz'\nqueues=[]\nroles=[]", "64 hex"),
            ("[[token]]\nname='a'\nsha256='00'\nqueues=[]\nroles=['root']", "unknown variant"),
            ("[[token]]\nname='a'\nqueues=[]\nroles=[]", "sha256"),
            ("[[token]]\nname='a'\nsha256='{d}'\nqueues=['[']\nroles=[]", "queues"),
            ("[[token]]\nname='a'\nsha256='{d}'\nqueues=[]\nroles=[]\n[[token]]\nname='a'\nsha256='{e}'\nqueues=[]\nroles=[]", "same name"),
            ("[[token]]\nname='a'\nsha256='{d}'\nqueues=[]\nroles=[]\n[[token]]\nname='b'\nsha256='{d}'\nqueues=[]\nroles=[]", "same secret"),
        ] {
            let text = text.replace("{d}", &digest_hex("x")).replace("{e}", &digest_hex("y"));
            let err = Tokens::parse(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("abc")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn a_reload_that_finds_no_token_keeps_the_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let one = format!(
            "[[token]]\nname = 'a'\nsha256 = '{}'\nqueues = ['*']\nroles = ['read']\n",
            digest_hex("x")
        );
        std::fs::write(&path, &one).unwrap();
        let auth = Auth::from_file(&path).unwrap();
        // Caught half-written: truncated to nothing.
        std::fs::write(&path, "").unwrap();
        assert!(matches!(auth.reload(), Err(TokensError::Empty)));
        assert_eq!(auth.current().unwrap().len(), 1, "the old token stays");
        std::fs::write(&path, &one).unwrap();
        assert_eq!(auth.reload().unwrap(), 1);
    }
}
