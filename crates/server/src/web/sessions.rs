//! Dashboard sessions: what a browser's cookie names once its token was
//! accepted by `/login`. The cookie carries an opaque id (256 random bits),
//! never the token; the server keeps, per session, the token it stands for
//! and when it expires (`--http-session-lifetime`), in a map of at most
//! `--http-max-sessions`. A session ends when it expires, at logout, or as
//! soon as its token is no longer in the tokens file (revoked or given a
//! new secret, then SIGHUP); it carries its token's rights as the file
//! says now. Sessions live in memory: a restart logs every browser out.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::auth::{Auth, Caller};

/// The session map, keyed by the SHA-256 of each id: the ids themselves
/// are not kept, and a lookup compares digests, not the secret.
#[derive(Debug)]
pub struct Sessions {
    lifetime: Duration,
    max: usize,
    map: Mutex<HashMap<[u8; 32], Session>>,
}

#[derive(Debug)]
struct Session {
    caller: Caller,
    expires: Instant,
}

/// A login refused because `--http-max-sessions` sessions are open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// An empty map of sessions lasting `lifetime`, at most `max` at once.
    pub fn new(lifetime: Duration, max: usize) -> Sessions {
        Sessions {
            lifetime,
            max,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// How long a session lasts.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session for `caller`: its id, for the cookie.
    ///
    /// # Errors
    /// [`Full`] when `max` sessions are open and none has expired.
    pub fn create(&self, caller: Caller) -> Result<String, Full> {
        let now = Instant::now();
        let mut map = self.map();
        if map.len() >= self.max {
            map.retain(|_, s| s.expires > now);
            if map.len() >= self.max {
                return Err(Full);
            }
        }
        let id = hex::encode(rand::random::<[u8; 32]>());
        // A lifetime past what an Instant holds: until the server stops.
        let far = now + Duration::from_secs(100 * 365 * 24 * 3600);
        map.insert(
            key(&id),
            Session {
                caller,
                expires: now.checked_add(self.lifetime).unwrap_or(far),
            },
        );
        Ok(id)
    }

    /// The caller session `id` stands for, with its token's current rights;
    /// `None` (and the session forgotten) once it expired or its token left
    /// the tokens file.
    pub fn lookup(&self, id: &str, auth: &Auth) -> Option<Caller> {
        let key = key(id);
        let mut map = self.map();
        let session = map.get(&key)?;
        let current = (session.expires > Instant::now())
            .then(|| auth.current_caller(&session.caller))
            .flatten();
        if current.is_none() {
            map.remove(&key);
        }
        current
    }

    /// Ends session `id` (logout); nothing when there is none.
    pub fn remove(&self, id: &str) {
        self.map().remove(&key(id));
    }

    /// How many sessions are kept (expired ones included until they are
    /// next looked at or room is needed).
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no session is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{digest_hex, Tokens};

    fn auth() -> Auth {
        let file = format!(
            "[[token]]\nname = \"ops\"\nsha256 = \"{}\"\nqueues = [\"*\"]\nroles = [\"admin\"]\n",
            digest_hex("ops-secret")
        );
        Auth::from_tokens(Tokens::parse(&file).unwrap())
    }

    #[test]
    fn a_session_is_opaque_bounded_and_ends_at_logout() {
        let auth = auth();
        let caller = auth
            .authenticate_secret(Some("ops-secret"))
            .unwrap()
            .unwrap();
        let sessions = Sessions::new(Duration::from_secs(60), 2);
        let id = sessions.create(caller.clone()).unwrap();
        assert_eq!(id.len(), 64);
        assert!(!id.contains("ops-secret"));
        assert_eq!(sessions.lookup(&id, &auth).unwrap().name(), "ops");
        assert!(sessions.lookup("not-a-session", &auth).is_none());
        let other = sessions.create(caller.clone()).unwrap();
        assert_ne!(id, other);
        // Full: refused until one ends.
        assert_eq!(sessions.create(caller.clone()), Err(Full));
        sessions.remove(&other);
        assert!(sessions.lookup(&other, &auth).is_none());
        assert!(sessions.create(caller).is_ok());
        assert!(sessions.lookup(&id, &auth).is_some());
    }

    #[test]
    fn an_expired_session_is_refused_and_forgotten() {
        let auth = auth();
        let caller = auth
            .authenticate_secret(Some("ops-secret"))
            .unwrap()
            .unwrap();
        let sessions = Sessions::new(Duration::ZERO, 4);
        let id = sessions.create(caller).unwrap();
        assert!(sessions.lookup(&id, &auth).is_none());
        assert!(sessions.is_empty());
    }

    #[test]
    fn a_revoked_token_ends_its_sessions() {
        let entry = |name: &str, secret: &str| {
            format!(
                "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nqueues = [\"*\"]\nroles = [\"read\"]\n",
                digest_hex(secret)
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, entry("a", "a-secret") + &entry("b", "b-secret")).unwrap();
        let auth = Auth::from_file(&path).unwrap();
        let sessions = Sessions::new(Duration::from_secs(60), 8);
        let login = |secret| {
            let caller = auth.authenticate_secret(Some(secret)).unwrap().unwrap();
            sessions.create(caller).unwrap()
        };
        let (a, b) = (login("a-secret"), login("b-secret"));
        // `a` keeps its name but gets a new secret; `b` is unchanged.
        std::fs::write(&path, entry("a", "a-rotated") + &entry("b", "b-secret")).unwrap();
        auth.reload().unwrap();
        assert!(sessions.lookup(&a, &auth).is_none());
        assert_eq!(sessions.lookup(&b, &auth).unwrap().name(), "b");
        std::fs::write(&path, entry("c", "c-secret")).unwrap();
        auth.reload().unwrap();
        assert!(sessions.lookup(&b, &auth).is_none());
        assert!(sessions.is_empty());
    }

    #[test]
    fn expired_sessions_make_room() {
        let auth = auth();
        let caller = auth
            .authenticate_secret(Some("ops-secret"))
            .unwrap()
            .unwrap();
        let sessions = Sessions::new(Duration::ZERO, 1);
        sessions.create(caller.clone()).unwrap();
        sessions.create(caller).unwrap();
        assert_eq!(sessions.len(), 1);
    }
}
