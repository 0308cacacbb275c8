//! The fault suite's producers: keyed enqueues through random servers,
//! retried with the same key until one is acknowledged.

#[allow(unused_imports)]
use super::*;

/// Key → job id of every acknowledged enqueue.
pub(super) type Enqueued = Arc<Mutex<BTreeMap<String, String>>>;

/// Enqueues `jobs` jobs with keys, one every `every`, each through a random
/// server and retried (same key) through others until acknowledged.
pub(super) async fn produce(
    urls: Vec<String>,
    producer: usize,
    jobs: usize,
    every: Duration,
    seed: u64,
    enqueued: Enqueued,
    findings: Arc<Mutex<Vec<String>>>,
) {
    let clients: Vec<Client> = urls
        .iter()
        .map(|u| {
            Client::connect_lazy(u.clone())
                .expect("a client")
                .with_timeout(Some(2 * CALL_TIMEOUT))
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed ^ (producer as u64 + 1).wrapping_mul(0x9e37_79b9));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..jobs {
        tick.tick().await;
        let key = format!("p{producer}-{i}");
        loop {
            let c = &clients[rng.random_range(0..clients.len())];
            let opts = EnqueueOptions::new()
                .key(key.clone())
                .group(format!("g{}", i % GROUPS))
                .max_attempts(MAX_ATTEMPTS);
            match c
                .enqueue(QUEUE, "chaos", key.clone().into_bytes(), opts)
                .await
            {
                Ok((job, _)) => {
                    let mut enqueued = enqueued.lock().unwrap();
                    if let Some(before) = enqueued.insert(key.clone(), job.id.clone()) {
                        if before != job.id {
                            findings.lock().unwrap().push(format!(
                                "key {key} enqueued as job {before} and then as {}",
                                job.id
                            ));
                        }
                    }
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}
