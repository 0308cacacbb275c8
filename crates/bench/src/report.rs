//! What a run found: one [`Outcome`] per workload, printed as a table or as
//! JSON lines.

use std::{io::Write, time::Duration};

use serde_json::{json, Map, Value};

use crate::{hist::Summary, server::Memory, BenchArgs, Workload};

/// The server's only durability mode: every reply that promises durability
/// waits for sled's flush and an `fdatasync` of its log (group commit).
pub const DURABILITY: &str = "fsync";

/// One workload's figures.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Which workload.
    pub workload: Workload,
    /// Jobs the throughput counts.
    pub jobs: u64,
    /// The timed phase.
    pub elapsed: Duration,
    /// What [`latency`](Self::latency) measures, e.g. `enqueue_rpc`.
    pub latency_of: &'static str,
    /// The workload's headline latency.
    pub latency: Summary,
    /// Further latencies measured on the way, by name.
    pub extra: Vec<(&'static str, Summary)>,
    /// The workload's settings (producers, batch size, …).
    pub params: Map<String, Value>,
    /// The server's memory when the workload ended; its peak is the
    /// peak during this workload (the bench restarts VmHWM before each).
    pub memory: Option<Memory>,
}

impl Outcome {
    /// An outcome with no extras, params or memory yet.
    pub fn new(
        workload: Workload,
        jobs: u64,
        elapsed: Duration,
        latency_of: &'static str,
        latency: Summary,
    ) -> Outcome {
        Outcome {
            workload,
            jobs,
            elapsed,
            latency_of,
            latency,
            extra: Vec::new(),
            params: Map::new(),
            memory: None,
        }
    }

    /// Adds a further latency.
    pub fn extra(mut self, name: &'static str, summary: Summary) -> Outcome {
        self.extra.push((name, summary));
        self
    }

    /// Adds a setting.
    pub fn param(mut self, name: &str, value: impl Into<Value>) -> Outcome {
        self.params.insert(name.to_owned(), value.into());
        self
    }

    /// Jobs per second over the timed phase.
    pub fn jobs_per_sec(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The JSON line: `workload`, `jobs`, `jobs_per_sec`, `p50_ms`,
    /// `p99_ms`, `durability` and the rest.
    pub fn to_json(&self) -> Value {
        let l = &self.latency;
        let mut obj = json!({
            "workload": self.workload.name(),
            "jobs": self.jobs,
            "seconds": round(self.elapsed.as_secs_f64(), 3),
            "jobs_per_sec": round(self.jobs_per_sec(), 1),
            "latency": self.latency_of,
            "p50_ms": round(l.p50_ms, 3),
            "p90_ms": round(l.p90_ms, 3),
            "p99_ms": round(l.p99_ms, 3),
            "p999_ms": round(l.p999_ms, 3),
            "max_ms": round(l.max_ms, 3),
            "mean_ms": round(l.mean_ms, 3),
            "samples": l.count,
            "durability": DURABILITY,
            "server_rss_mib": self.memory.map(|m| round(m.rss_mib, 1)),
            "server_peak_rss_mib": self.memory.map(|m| round(m.peak_rss_mib, 1)),
            "params": self.params,
        });
        let extra: Map<String, Value> = self
            .extra
            .iter()
            .map(|(name, s)| {
                let v = json!({
                    "p50_ms": round(s.p50_ms, 3),
                    "p99_ms": round(s.p99_ms, 3),
                    "max_ms": round(s.max_ms, 3),
                    "samples": s.count,
                });
                ((*name).to_owned(), v)
            })
            .collect();
        obj["extra"] = Value::Object(extra);
        obj
    }
}

impl Report {
    /// The server's peak RSS over the enqueue and drain workloads (A and
    /// B in any of their shapes), MiB; `None` when none ran or memory was
    /// not measured.
    pub fn peak_rss_a_b(&self) -> Option<f64> {
        self.outcomes
            .iter()
            .filter(|o| o.workload.is_a_or_b())
            .filter_map(|o| o.memory.map(|m| m.peak_rss_mib))
            .reduce(f64::max)
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Report {
    /// Which server was measured.
    pub server: String,
    /// One per workload, in the order run.
    pub outcomes: Vec<Outcome>,
    /// The spawned server's memory after the run.
    pub memory: Option<Memory>,
}

impl Report {
    /// An empty report on `server`.
    pub fn new(server: String) -> Report {
        Report {
            server,
            outcomes: Vec::new(),
            memory: None,
        }
    }

    /// The table: one row per workload (its headline latency), then one
    /// row per further latency, then the server's memory.
    pub fn write_table(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(out)?;
        writeln!(
            out,
            "{:<19} {:>7} {:>8} {:>10}  {:<22} {:>8} {:>8} {:>8} {:>8}",
            "workload",
            "jobs",
            "secs",
            "jobs/s",
            "latency of",
            "p50 ms",
            "p99 ms",
            "p99.9",
            "max ms"
        )?;
        writeln!(out, "{}", "-".repeat(108))?;
        for o in &self.outcomes {
            let l = &o.latency;
            writeln!(
                out,
                "{:<19} {:>7} {:>8.2} {:>10.0}  {:<22} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                o.workload.name(),
                o.jobs,
                o.elapsed.as_secs_f64(),
                o.jobs_per_sec(),
                o.latency_of,
                l.p50_ms,
                l.p99_ms,
                l.p999_ms,
                l.max_ms
            )?;
            for (name, s) in &o.extra {
                writeln!(
                    out,
                    "{:<19} {:>7} {:>8} {:>10}  {:<22} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                    "", "", "", "", name, s.p50_ms, s.p99_ms, s.p999_ms, s.max_ms
                )?;
            }
        }
        writeln!(out)?;
        writeln!(
            out,
            "durability: {DURABILITY} — every reply waited for sled's flush and an fdatasync"
        )?;
        match self.memory {
            Some(m) => {
                let peak = self
                    .outcomes
                    .iter()
                    .filter_map(|o| o.memory.map(|m| m.peak_rss_mib))
                    .fold(m.peak_rss_mib, f64::max);
                writeln!(
                    out,
                    "server memory: peak RSS (VmHWM) {peak:.1} MiB, RSS now (VmRSS) {:.1} MiB",
                    m.rss_mib
                )?;
                if let Some(ab) = self.peak_rss_a_b() {
                    writeln!(
                        out,
                        "server peak RSS during the enqueue and drain workloads (A+B): {ab:.1} MiB"
                    )?;
                }
            }
            None => writeln!(
                out,
                "server memory: not measured (external server without --server-pid)"
            )?,
        }
        Ok(())
    }
}

/// The lines before the run: what is measured, against what.
pub fn write_header(
    out: &mut impl Write,
    server: &crate::server::Server,
    args: &BenchArgs,
) -> std::io::Result<()> {
    writeln!(out, "jobq bench")?;
    writeln!(out, "  server:     {}", server.describe())?;
    writeln!(
        out,
        "  durability: {DURABILITY} (the server flushes sled and fdatasyncs before each durable reply)"
    )?;
    writeln!(
        out,
        "  client:     {} connections (own: one per producer and worker; the -own workloads always), payload {} B, {} CPUs on this host",
        args.connections,
        args.payload_bytes,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )?;
    writeln!(out)?;
    out.flush()
}

/// `x` to `digits` decimals, for JSON that is read by people too.
fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome() -> Outcome {
        let l = Summary {
            count: 100,
            p50_ms: 1.23456,
            p99_ms: 9.5,
            ..Summary::default()
        };
        Outcome::new(
            Workload::Drain,
            2000,
            Duration::from_millis(500),
            "ack_rpc",
            l,
        )
        .extra("enqueue_rpc", l)
        .param("workers", 8)
    }

    #[test]
    fn json_line_has_the_promised_fields() {
        let v = outcome().to_json();
        assert_eq!(v["workload"], "drain");
        assert_eq!(v["jobs"], 2000);
        assert_eq!(v["jobs_per_sec"], 4000.0);
        assert_eq!(v["p50_ms"], 1.235);
        assert_eq!(v["p99_ms"], 9.5);
        assert_eq!(v["durability"], "fsync");
        assert_eq!(v["params"]["workers"], 8);
        assert_eq!(v["extra"]["enqueue_rpc"]["samples"], 100);
        assert!(v["server_rss_mib"].is_null());
        // One line per workload.
        assert!(!v.to_string().contains('\n'));
    }

    #[test]
    fn table_lists_each_workload_and_the_memory() {
        let mut report = Report::new("test".into());
        let mut o = outcome();
        o.memory = Some(Memory {
            rss_mib: 9.0,
            peak_rss_mib: 11.0,
        });
        report.outcomes.push(o);
        report.memory = Some(Memory {
            rss_mib: 10.0,
            peak_rss_mib: 12.5,
        });
        let mut out = Vec::new();
        report.write_table(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("drain"), "{text}");
        assert!(text.contains("4000"), "{text}");
        assert!(text.contains("enqueue_rpc"), "{text}");
        assert!(text.contains("peak RSS (VmHWM) 12.5 MiB"), "{text}");
        assert!(text.contains("durability: fsync"), "{text}");
        assert!(text.contains("(A+B): 11.0 MiB"), "{text}");
    }
}
