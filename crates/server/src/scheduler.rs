//! The scheduler: enqueues each schedule's ticks (see [`crate::schedule`]
//! for which tick, and its key).
//!
//! It sleeps until the nearest tick of any schedule, and at most
//! [`RELOAD_EVERY`], then reloads the schedules from the store: a schedule
//! created or deleted (through this server or another sharing the store)
//! takes effect within that. Every server runs one; the tick's job key
//! makes a tick one job however many of them enqueue it, and `last_tick`
//! (moved forward once the job is stored) keeps a restart from enqueueing a
//! tick whose job was already purged.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    job::{Metadata, NewJob},
    schedule::{due_tick, tick_key, Schedule, Timetable},
    store::Store,
    waiter::instant_at,
};

/// Longest sleep between two loads of the schedules.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// The metadata key naming the schedule that made a job.
pub const SCHEDULE_METADATA: &str = "jobq-schedule";

/// Runs until `shutdown` fires.
pub async fn run<S: Store>(store: Arc<S>, shutdown: CancellationToken) {
    loop {
        let now = SystemTime::now();
        let mut wake = now + RELOAD_EVERY;
        match store.schedules().await {
            Ok(schedules) => {
                for schedule in schedules {
                    if let Some(next) = tick(&*store, &schedule, now).await {
                        wake = wake.min(next);
                    }
                }
            }
            Err(err) => warn!(cause = %err, "loading the schedules failed; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = tokio::time::sleep_until(instant_at(wake)) => {}
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
    if let Some(at) = due_tick(schedule, &table, now) {
        if let Err(err) = enqueue(store, schedule, at).await {
            // Tried again on the next pass: the tick is still the latest.
            warn!(schedule = %schedule.name, cause = %err, "enqueueing a schedule's tick failed; retrying");
            return Some(now + Duration::from_millis(200));
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
    };
    let enqueued = store.enqueue(new, SystemTime::now()).await?;
    store.schedule_ticked(&schedule.name, at).await?;
    if enqueued.created {
        info!(schedule = %schedule.name, job.id = %enqueued.job.id, queue = %schedule.queue, %key, "schedule tick enqueued");
    }
    Ok(())
}
