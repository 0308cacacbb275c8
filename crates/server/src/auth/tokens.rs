//! The `--auth-tokens` file: `[[token]]` entries of a name, the SHA-256 of
//! the secret, queue globs and roles, and the [`Caller`] a presented secret
//! finds. Secrets are never stored; a presented secret is hashed and
//! compared in constant time.

use std::{
    collections::HashSet,
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Enqueue, EnqueueBatch.
    Produce,
    /// Dequeue, Lease, Ack, Fail, Heartbeat.
    Consume,
    /// GetJob, WatchJob, ListJobs, Stats, GetQueuePolicy.
    Read,
    /// All of the above, plus Retry and every operator call (CancelJob,
    /// PauseQueue, ResumeQueue, SetQueuePolicy, DeleteJob, PurgeJobs,
    /// CreateSchedule, DeleteSchedule).
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

    /// The caller presenting `caller`'s secret in this table, with the
    /// rights its entry has here; `None` once the secret is not in it.
    pub(super) fn renewed(&self, caller: &Caller) -> Option<Caller> {
        self.entries
            .iter()
            .find(|t| t.digest == caller.0.digest)
            .map(|t| Caller(Arc::clone(t)))
    }

    /// The token whose secret this is. Every entry is compared, in
    /// constant time, so the timing says nothing about which digest
    /// matched how far.
    pub(super) fn find(&self, secret: &str) -> Option<Caller> {
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
}
