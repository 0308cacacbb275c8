//! The scheduler: enqueues each schedule's ticks (see [`crate::schedule`]
//! for which tick, and its key).
//!
//! It sleeps until the nearest tick of any schedule, and at most
//! [`RELOAD_EVERY`], then reloads the schedules from the store: a schedule
//! created or deleted (through this server or another sharing the store)
//! takes effect within that. Every server runs one; the tick's job key
//! makes a tick one job however many of them enqueue it, and `last_tick`
//! (moved forward once the job is stored) keeps a restart from enqueueing a
//! tick whose job was already purged. A pass enqueues its due ticks
//! [`TICKS_AT_ONCE`] at a time, each through [`Store::fire_schedule`],
//! which checks that the schedule is still the one the pass read.
//!
//! Time is the store's ([`Store::now`]): on PostgreSQL the database's
//! clock, never ahead of it, so no server enqueues a tick before the
//! database's clock reaches it, whatever its own clock says. The sleep
//! towards the next tick is measured on that clock too.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    job::{Metadata, NewJob},
    schedule::{due_tick, tick_key, untrusted_start, Schedule, Timetable},
    store::Store,
};

/// Longest sleep between two loads of the schedules.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// The metadata key naming the schedule that made a job.
pub const SCHEDULE_METADATA: &str = "jobq-schedule";

/// Ticks of one pass enqueued at once: schedules due together (the top of
/// the hour) share commit rounds instead of waiting for one each in turn,
/// and on PostgreSQL take at most half of the default pool of 16
/// connections from the calls that share it.
const TICKS_AT_ONCE: usize = 8;

/// Runs until `shutdown` fires.
pub async fn run<S: Store>(store: Arc<S>, shutdown: CancellationToken) {
    loop {
        let now = store.now();
        let mut wake = now + RELOAD_EVERY;
        match store.schedules().await {
            Ok(schedules) => {
                let store = &*store;
                let mut passes = futures::stream::iter(schedules)
                    .map(|schedule| async move { tick(store, &schedule, now).await })
                    .buffer_unordered(TICKS_AT_ONCE);
                while let Some(next) = passes.next().await {
                    if let Some(next) = next {
                        wake = wake.min(next);
                    }
                }
            }
            Err(err) => warn!(cause = %err, "loading the schedules failed; retrying"),
        }
        let nap = wake.duration_since(store.now()).unwrap_or(Duration::ZERO);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = tokio::time::sleep(nap) => {}
        }
    }
}

/// Enqueues `schedule`'s due tick, if it has one; returns its next tick.
async fn tick<S: Store>(store: &S, schedule: &Schedule, now: SystemTime) -> Option<SystemTime> {
    let table = match Timetable::of(schedule) {
        Ok(table) => table,
        Err(err) => {
            warn!(schedule = %schedule.name, cause = %err, "a stored schedule does not parse; skipped");
            return None;
        }
    };
    let retry = Some(now + Duration::from_millis(200));
    if let Some(start) = untrusted_start(schedule, &table, now) {
        warn!(schedule = %schedule.name, "the schedule was created under a clock that ran ahead; it runs from its next tick");
        if let Err(err) = store.schedule_ticked(schedule, start).await {
            warn!(schedule = %schedule.name, cause = %err, "recording a schedule's start failed; retrying");
            return retry;
        }
    } else if let Some(at) = due_tick(schedule, &table, now) {
        if let Err(err) = enqueue(store, schedule, at).await {
            // Tried again on the next pass: the tick is still the latest.
            warn!(schedule = %schedule.name, cause = %err, "enqueueing a schedule's tick failed; retrying");
            return retry;
        }
    }
    table.next_after(now)
}

async fn enqueue<S: Store>(store: &S, schedule: &Schedule, at: SystemTime) -> crate::Result<()> {
    let key = tick_key(&schedule.name, at);
    let new = NewJob {
        queue: schedule.queue.clone(),
        kind: schedule.kind.clone(),
        payload: schedule.payload.clone(),
        key: Some(key.clone()),
        max_attempts: schedule.max_attempts,
        delay: Duration::ZERO,
        priority: 0,
        metadata: Metadata::from([(SCHEDULE_METADATA.to_owned(), schedule.name.clone())]),
        group: None,
        max_snoozes: crate::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    };
    match store.fire_schedule(schedule, at, new).await? {
        Some(enqueued) if enqueued.created => {
            info!(schedule = %schedule.name, job.id = %enqueued.job.id, queue = %schedule.queue, %key, "schedule tick enqueued");
        }
        Some(_) => {}
        None => {
            info!(schedule = %schedule.name, %key, "schedule deleted or replaced before its tick; not enqueued")
        }
    }
    Ok(())
}
