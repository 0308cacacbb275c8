//! Latency histograms: hdrhistogram in microseconds, and the summary
//! (percentiles in milliseconds) that the report prints.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Highest latency recorded exactly: ten minutes, in microseconds. Longer
/// ones are clamped (and would mean the run is broken anyway).
const HIGHEST_US: u64 = 600_000_000;

/// A latency histogram with microsecond resolution, 3 significant digits.
#[derive(Clone)]
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Latencies(Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("valid bounds"))
    }
}

impl Latencies {
    /// Records one latency.
    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.0.saturating_record(us.clamp(1, HIGHEST_US));
    }

    /// Adds another histogram's counts to this one.
    pub fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// The percentiles of what was recorded.
    pub fn summary(&self) -> Summary {
        let ms = |us: u64| us as f64 / 1000.0;
        Summary {
            count: self.0.len(),
            p50_ms: ms(self.0.value_at_quantile(0.50)),
            p90_ms: ms(self.0.value_at_quantile(0.90)),
            p99_ms: ms(self.0.value_at_quantile(0.99)),
            p999_ms: ms(self.0.value_at_quantile(0.999)),
            max_ms: ms(self.0.max()),
            mean_ms: self.0.mean() / 1000.0,
        }
    }
}

/// Percentiles of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Summary {
    /// How many latencies were recorded.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Mean (for comparison only; the percentiles are the figures).
    pub mean_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_distribution_not_the_mean() {
        let mut h = Latencies::default();
        for _ in 0..98 {
            h.record(Duration::from_millis(1));
        }
        h.record(Duration::from_millis(100));
        h.record(Duration::from_millis(200));
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert!((s.p50_ms - 1.0).abs() < 0.01, "{s:?}");
        assert!((s.p99_ms - 100.0).abs() < 0.1, "{s:?}");
        assert!((s.max_ms - 200.0).abs() < 0.2, "{s:?}");
        assert!(s.mean_ms > 3.9 && s.mean_ms < 4.0, "{s:?}");
    }

    #[test]
    fn merge_adds_counts_and_extremes_are_clamped() {
        let mut a = Latencies::default();
        let mut b = Latencies::default();
        a.record(Duration::ZERO);
        b.record(Duration::from_secs(3600));
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.count, 2);
        assert!((s.max_ms - 600_000.0).abs() < 600.0, "{s:?}");
    }

    #[test]
    fn empty_histogram_summarises_to_zeros() {
        assert_eq!(Latencies::default().summary().count, 0);
    }
}
