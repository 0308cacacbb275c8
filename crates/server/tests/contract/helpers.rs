// Helpers shared by the store tests (included, not a module).

const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(100),
    cap: Duration::from_secs(1),
};
const LEASE: Duration = Duration::from_millis(100);

/// A fixed point in time plus `ms` milliseconds.
fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_millis(ms)
}

fn new_job(queue: &str, key: Option<&str>, delay_ms: u64) -> NewJob {
    NewJob {
        queue: queue.into(),
        kind: "send-email".into(),
        payload: b"order-4711".to_vec(),
        key: key.map(Into::into),
        max_attempts: 3,
        delay: Duration::from_millis(delay_ms),
        priority: 0,
        metadata: Default::default(),
        group: None,
        max_snoozes: jobq_server::job::DEFAULT_MAX_SNOOZES,
        unique: Default::default(),
    }
}

/// A job as a change returns it: without its payload (see `Store`).
fn receipt(job: Job) -> Job {
    Job {
        payload: Vec::new(),
        ..job
    }
}

fn qs(names: &[&str]) -> Vec<String> {
    names.iter().map(|q| q.to_string()).collect()
}

async fn enqueue(
    store: &impl Store,
    queue: &str,
    key: Option<&str>,
    delay_ms: u64,
    now: SystemTime,
) -> Job {
    store
        .enqueue(new_job(queue, key, delay_ms), now)
        .await
        .expect("enqueue")
        .job
}

async fn take(store: &impl Store, queue: &str, now: SystemTime) -> Option<Leased> {
    store
        .take(&qs(&[queue]), "worker-1", None, LEASE, now)
        .await
        .expect("take")
}

fn report(lease_id: LeaseId, retry_delay: Option<Duration>) -> FailReport {
    FailReport {
        lease_id,
        error: "smtp down".into(),
        retry_delay,
        fatal: false,
        snooze: None,
    }
}

fn code<T: std::fmt::Debug>(result: jobq_server::Result<T>) -> Code {
    result.expect_err("expected an error").code()
}
