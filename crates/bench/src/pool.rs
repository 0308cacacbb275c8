//! Client connections and queue names.
//!
//! Every [`Client::connect`] opens its own HTTP/2 connection; producers and
//! workers share a few of them round-robin. One connection for everything
//! would measure one TCP stream's and one hyper task's limits, not the
//! server's.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use jobq_client::{Client, QueuePolicy};

/// A fixed set of connected clients.
pub struct Pool {
    clients: Vec<Client>,
    run_id: String,
    /// Set on every queue before its workload runs (`--policy-max-running`).
    policy: Option<QueuePolicy>,
}

impl Pool {
    /// Opens `n` connections to `url`; a comma-separated list of URLs
    /// (several servers over one PostgreSQL) spreads them round-robin.
    pub async fn connect(url: &str, n: usize, policy: Option<QueuePolicy>) -> anyhow::Result<Pool> {
        let urls: Vec<&str> = url.split(',').map(str::trim).collect();
        let mut clients = Vec::with_capacity(n);
        for i in 0..n {
            let url = urls[i % urls.len()];
            let client = Client::connect(url.to_owned())
                .await
                .with_context(|| format!("cannot connect to {url}"))?;
            clients.push(client);
        }
        Ok(Pool {
            clients,
            run_id: run_id(),
            policy,
        })
    }

    /// The client for producer or worker number `i`.
    pub fn client(&self, i: usize) -> Client {
        self.clients[i % self.clients.len()].clone()
    }

    /// A queue nobody else uses: this run's id plus the workload's name, so
    /// workloads (and runs against the same `--server`) never see each
    /// other's jobs.
    pub fn queue(&self, workload: &str) -> String {
        format!("bench-{}-{workload}", self.run_id)
    }

    /// [`Pool::queue`], with the run's policy set on it first, if any.
    pub async fn queue_for(&self, workload: &str) -> anyhow::Result<String> {
        let queue = self.queue(workload);
        if let (Some(policy), Some(client)) = (self.policy, self.clients.first()) {
            client
                .set_queue_policy(queue.clone(), policy)
                .await
                .with_context(|| format!("cannot set the policy of {queue}"))?;
        }
        Ok(queue)
    }
}

/// Process id and clock: unique enough among runs against one server.
fn run_id() -> String {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or_default();
    format!("{}-{:x}", std::process::id(), micros % (1 << 40))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_valid_and_distinct_per_workload() {
        let pool = Pool {
            clients: Vec::new(),
            run_id: run_id(),
            policy: None,
        };
        let (a, b) = (pool.queue("enqueue"), pool.queue("drain"));
        assert_ne!(a, b);
        for q in [a, b] {
            assert!(q.len() <= 128);
            assert!(q
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c)));
        }
    }
}
