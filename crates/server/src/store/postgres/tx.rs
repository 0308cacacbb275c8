//! A transaction whose `BEGIN` goes out with its first statements, in one
//! round trip, instead of one round trip of its own (tokio-postgres'
//! `transaction()` waits for the `BEGIN`'s reply before anything else is
//! sent). A connection runs its statements in the order sent, so
//! statements polled after [`Open::begin`] in one `try_join!` (which polls
//! in order) run inside the transaction.
//!
//! Ended by [`Open::commit`] or [`Open::rollback`]; one dropped otherwise
//! (a panic, a caller cancelled midway) takes its connection out of the
//! pool and closes it, so PostgreSQL rolls the transaction back and no
//! pooled connection is ever handed out inside a transaction.

use deadpool_postgres::{ClientWrapper, Object};

use super::error::PgError;

/// A pooled connection inside a transaction of its own.
pub struct Open {
    client: Option<Object>,
    ended: std::sync::atomic::AtomicBool,
}

impl Open {
    /// Wraps `client`, on which no transaction is open yet; send
    /// [`Open::begin`] before anything else.
    pub fn new(client: Object) -> Open {
        Open {
            client: Some(client),
            ended: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The `BEGIN`: poll it before (or in one `try_join!` ahead of) the
    /// transaction's first statements.
    pub async fn begin(&self) -> Result<(), PgError> {
        self.client().batch_execute("BEGIN").await?;
        Ok(())
    }

    /// The connection, for the transaction's statements.
    pub fn client(&self) -> &Object {
        // Only `Drop` takes it.
        self.client
            .as_ref()
            .expect("an open transaction has its client")
    }

    /// Commits. On an error the connection is closed (see the module docs).
    pub async fn commit(self) -> Result<(), PgError> {
        self.client().batch_execute("COMMIT").await?;
        self.done();
        Ok(())
    }

    /// Marks the transaction ended by a `COMMIT` the caller sent itself
    /// (pipelined with its last statements, see [`Open::begin`]); the
    /// connection goes back to the pool with this.
    pub fn done(&self) {
        self.ended.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Rolls back (after a failed statement).
    pub async fn rollback(self) {
        if self.client().batch_execute("ROLLBACK").await.is_ok() {
            self.done();
        }
    }
}

impl std::ops::Deref for Open {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        self.client()
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if !*self.ended.get_mut() {
            if let Some(client) = self.client.take() {
                // Out of the pool and closed: PostgreSQL rolls back.
                drop(Object::take(client));
            }
        }
    }
}
