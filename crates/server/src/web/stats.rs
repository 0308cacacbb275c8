//! Queue counts for `/metrics` and the dashboard, reused for
//! `--stats-cache`: counting is a full pass over the jobs (on PostgreSQL a
//! GROUP BY over the whole table), and a scrape storm must not turn into
//! as many passes. Within a period, every request gets the last count;
//! the first request after it counts again while the others wait for that
//! count instead of starting their own. So the counts shown are at most
//! one period, plus the time one count takes, old.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::{sync::Mutex, time::Instant};

use crate::{
    error::Result,
    store::{QueueStats, Store},
};

/// The last count, and when it was taken.
#[derive(Debug)]
pub struct StatsCache {
    period: Duration,
    last: Mutex<Option<(Instant, Arc<Vec<QueueStats>>)>>,
}

impl StatsCache {
    /// A cache whose counts are reused for `period` (zero: never).
    pub fn new(period: Duration) -> StatsCache {
        StatsCache {
            period,
            last: Mutex::new(None),
        }
    }

    /// Every queue's counts, at most `period` old (plus one count's time).
    ///
    /// # Errors
    /// When the store cannot count; nothing is cached then.
    pub async fn get<S: Store>(&self, store: &S) -> Result<Arc<Vec<QueueStats>>> {
        // Held across the count: concurrent callers wait for it rather
        // than each starting one.
        let mut last = self.last.lock().await;
        if let Some((at, stats)) = last.as_ref() {
            if at.elapsed() < self.period {
                return Ok(Arc::clone(stats));
            }
        }
        let stats = Arc::new(store.stats(None, SystemTime::now()).await?);
        if !self.period.is_zero() {
            *last = Some((Instant::now(), Arc::clone(&stats)));
        }
        Ok(stats)
    }
}
