//! `jobq policy QUEUE`: show a queue's policy, or change it (how many of
//! its jobs run at once, over every server and per group).

use std::time::Duration;

use jobq_client::{Client, QueuePolicy, RateLimit};
use serde_json::json;

use crate::output::Out;

/// Options of `jobq policy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The queue.
    queue: String,

    /// At most N of the queue's jobs RUNNING at once, over every server
    /// (0: no limit).
    #[arg(long, value_name = "N")]
    max_running: Option<u32>,

    /// At most N RUNNING jobs of one group (`enqueue --group`) at once; 1
    /// runs each group's jobs one at a time, in enqueue order (0: no
    /// limit).
    #[arg(long, value_name = "N")]
    group_max_running: Option<u32>,

    /// At most N takes of the queue's jobs per period, over every server:
    /// `100/s`, `5/1m`, `10/500ms` (a token bucket); `0` removes it.
    #[arg(long, value_name = "N/PERIOD", value_parser = parse_rate)]
    rate: Option<Option<(u32, Duration)>>,

    /// With --rate: how many takes may go at once after a quiet spell
    /// (default: N).
    #[arg(long, value_name = "N", requires = "rate")]
    burst: Option<u32>,

    /// At most N takes of one group's jobs per period, over every server,
    /// as --rate; `0` removes it.
    #[arg(long, value_name = "N/PERIOD", value_parser = parse_rate)]
    group_rate: Option<Option<(u32, Duration)>>,

    /// With --group-rate: a group's burst (default: N).
    #[arg(long, value_name = "N", requires = "group_rate")]
    group_burst: Option<u32>,

    /// Remove the queue's policy.
    #[arg(long, conflicts_with_all = ["max_running", "group_max_running", "rate", "group_rate"])]
    clear: bool,
}

/// `N/PERIOD` (`100/s`, `5/1m`, `10/500ms`), or `0` for none.
fn parse_rate(s: &str) -> Result<Option<(u32, Duration)>, String> {
    if s.trim() == "0" {
        return Ok(None);
    }
    let (n, per) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not N/PERIOD (e.g. 100/s)"))?;
    let n: u32 = n
        .trim()
        .parse()
        .map_err(|e| format!("{n:?} is not a number: {e}"))?;
    let per = per.trim();
    // `s` reads as `1s`.
    let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
        per.to_owned()
    } else {
        format!("1{per}")
    };
    let per = humantime::parse_duration(&per).map_err(|e| format!("{per:?}: {e}"))?;
    Ok((n > 0).then_some((n, per)))
}

/// Runs `jobq policy`: the limits given change, the others stay.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    let changes = args.clear
        || args.max_running.is_some()
        || args.group_max_running.is_some()
        || args.rate.is_some()
        || args.group_rate.is_some();
    let policy = if changes {
        let mut policy = if args.clear {
            QueuePolicy::new()
        } else {
            client.queue_policy(args.queue.clone()).await?
        };
        if let Some(n) = args.max_running {
            policy = policy.max_running(n);
        }
        if let Some(n) = args.group_max_running {
            policy = policy.group_max_running(n);
        }
        match args.rate {
            Some(Some((n, per))) => {
                policy = policy.rate(RateLimit::new(n, per).burst(args.burst.unwrap_or(0)));
            }
            Some(None) => policy.rate = None,
            None => {}
        }
        match args.group_rate {
            Some(Some((n, per))) => {
                let rate = RateLimit::new(n, per).burst(args.group_burst.unwrap_or(0));
                policy = policy.group_rate(rate);
            }
            Some(None) => policy.group_rate = None,
            None => {}
        }
        client.set_queue_policy(args.queue.clone(), policy).await?;
        policy
    } else {
        client.queue_policy(args.queue.clone()).await?
    };
    if out.json {
        out.json(&json!({
            "queue": args.queue,
            "max_running": policy.max_running,
            "group_max_running": policy.group_max_running,
            "rate": policy.rate.map(rate_json),
            "group_rate": policy.group_rate.map(rate_json),
        }))?;
    } else if policy.is_empty() {
        out.line(format!("queue {}: no policy", args.queue))?;
    } else {
        out.line(format!("queue {}: {}", args.queue, describe(&policy)))?;
    }
    Ok(())
}

fn rate_json(r: RateLimit) -> serde_json::Value {
    json!({
        "limit": r.limit,
        "per_secs": r.per.as_secs_f64(),
        "burst": r.burst,
    })
}

/// The policy in words, as `jobq stats` shows it: `max_running=10
/// group_max_running=1`; `-` for none.
pub fn describe(policy: &QueuePolicy) -> String {
    let mut parts = Vec::new();
    if policy.max_running > 0 {
        parts.push(format!("max_running={}", policy.max_running));
    }
    if policy.group_max_running > 0 {
        parts.push(format!("group_max_running={}", policy.group_max_running));
    }
    for (name, rate) in [("rate", &policy.rate), ("group_rate", &policy.group_rate)] {
        if let Some(r) = rate {
            let per = humantime::format_duration(r.per);
            match r.burst {
                0 => parts.push(format!("{name}={}/{per}", r.limit)),
                b => parts.push(format!("{name}={}/{per} burst={b}", r.limit)),
            }
        }
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_a_count_per_period() {
        assert_eq!(parse_rate("100/s"), Ok(Some((100, Duration::from_secs(1)))));
        assert_eq!(parse_rate("5/1m"), Ok(Some((5, Duration::from_secs(60)))));
        assert_eq!(
            parse_rate("10/500ms"),
            Ok(Some((10, Duration::from_millis(500))))
        );
        assert_eq!(parse_rate("0"), Ok(None));
        for bad in ["100", "x/s", "5/parsec", "-1/s"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        let policy = QueuePolicy::new()
            .max_running(10)
            .rate(RateLimit::new(100, Duration::from_secs(1)).burst(5));
        assert_eq!(describe(&policy), "max_running=10 rate=100/1s burst=5");
    }
}
