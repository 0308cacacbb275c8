//! The reloadable token table (SIGHUP swaps it; connections stay up) and
//! the tonic interceptor that turns `authorization: Bearer <secret>` into a
//! [`Caller`] in the request's extensions, or UNAUTHENTICATED.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use tonic::{metadata::MetadataMap, Request, Status};

use super::{Caller, Role, Tokens, TokensError, Who};
use crate::error::{Error, Result};

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
        let Some(now) = tokens.renewed(caller) else {
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
        self.current()?.renewed(caller)
    }

    pub(super) fn current(&self) -> Option<Arc<Tokens>> {
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
