//! What an engine shared by several servers adds to [`super::Backend`]:
//! the servers' registry and liveness, the leases of servers that died,
//! and the other servers' events. An engine of its own (sled) has none of
//! this: its [`super::Backend::Cluster`] is [`Alone`], a type with no
//! values, and [`super::Backend::cluster`] returns `None`, so
//! [`super::Jobs`] never calls into it.

use std::{future::Future, time::SystemTime};

use super::backend::Change;
use crate::{
    error::Result,
    job::{JobId, LeaseId},
};

/// One server's part in a cluster of servers that share an engine.
pub trait Cluster: Send + Sync + 'static {
    /// Keeps this server registered as alive.
    fn heartbeat(&self) -> impl Future<Output = Result<()>> + Send;

    /// Reclaims, as worker disconnected, the stream leases of servers
    /// that stopped heartbeating (their streams are gone with them), each
    /// only while it still belongs to such a server, checked under the
    /// job's lock (a worker may have reconnected elsewhere and declared
    /// it). Returns the changes made; the caller publishes them. Also ends
    /// the dead servers' own sessions with the engine.
    fn reclaim_orphaned(&self, now: SystemTime)
        -> impl Future<Output = Result<Vec<Change>>> + Send;

    /// This server's Lease stream took over these leases (a worker
    /// reconnected and declared them): this server becomes their holder,
    /// so they are not reclaimed as orphans of the server that held them
    /// before.
    fn adopt(&self, leases: &[(JobId, LeaseId)]) -> impl Future<Output = Result<()>> + Send;

    /// Whether another server's Lease stream holds this lease now (a
    /// worker reconnected there and declared it): the stream here that
    /// ended must then not reclaim it.
    fn held_elsewhere(
        &self,
        id: JobId,
        lease: LeaseId,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// This server stops (gracefully): its stream leases become plain
    /// leases that only expire, and it leaves the registry.
    fn leave(&self) -> impl Future<Output = Result<()>> + Send;

    /// Refused reclaims of leases that another server had reclaimed first
    /// (harmless: fencing refused them).
    fn fenced_reclaims(&self) -> u64;

    /// How full the engine's notification queue is, from 0 to 1.
    fn notification_queue_usage(&self) -> impl Future<Output = Result<Option<f64>>> + Send;
}

/// The cluster of an engine of its own: there is none, and no value of
/// this type can exist.
#[derive(Debug)]
pub enum Alone {}

impl Cluster for Alone {
    async fn heartbeat(&self) -> Result<()> {
        match *self {}
    }

    async fn reclaim_orphaned(&self, _: SystemTime) -> Result<Vec<Change>> {
        match *self {}
    }

    async fn adopt(&self, _: &[(JobId, LeaseId)]) -> Result<()> {
        match *self {}
    }

    async fn held_elsewhere(&self, _: JobId, _: LeaseId) -> Result<bool> {
        match *self {}
    }

    async fn leave(&self) -> Result<()> {
        match *self {}
    }

    fn fenced_reclaims(&self) -> u64 {
        match *self {}
    }

    async fn notification_queue_usage(&self) -> Result<Option<f64>> {
        match *self {}
    }
}
