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
mod interceptor;
mod policy;
#[cfg(test)]
mod tests;
mod tokens;

pub use interceptor::{bearer, Auth};
pub use policy::{authorize, hidden_leases, Access, Who};
pub use tokens::{digest_hex, Caller, Role, Tokens, TokensError};
