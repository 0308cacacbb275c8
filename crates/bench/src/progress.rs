//! The progress bar: one per workload, on stderr, only when stderr is a
//! terminal (indicatif hides it otherwise) and `--no-progress` is not set.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Makes the bars of a run.
pub struct Progress {
    enabled: bool,
}

impl Progress {
    /// Bars are drawn only when `enabled`.
    pub fn new(enabled: bool) -> Progress {
        Progress { enabled }
    }

    /// A bar for `what` counting to `len` jobs.
    pub fn bar(&self, what: &str, len: u64) -> ProgressBar {
        let target = if self.enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(len), target);
        let style = ProgressStyle::with_template(
            "{prefix:>14} [{bar:32}] {pos:>7}/{len:7} {per_sec:>12} {elapsed:>4} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(what.to_owned());
        bar
    }
}

impl Progress {
    /// A bar for `what` with no known end: it counts jobs and shows the
    /// rate, with `msg` for the planned duration.
    pub fn counter(&self, what: &str) -> ProgressBar {
        let bar = self.bar(what, 0);
        bar.unset_length();
        let style = ProgressStyle::with_template(
            "{prefix:>14} {spinner} {pos:>7} acked {per_sec:>12} {elapsed:>4} {msg}",
        )
        .expect("valid template");
        bar.set_style(style);
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        bar
    }
}
