//! WatchJob: a stream of a job's states, from the current one to a final
//! one.
//!
//! A watcher reads its jobs, sends each state it has not sent yet, and
//! waits for the next change. States that follow each other faster than
//! it reads may reach it as the latest one only; a lease's deadline moved
//! by a heartbeat is not a change, the progress a heartbeat reports is. Changes made through this server wake it at
//! once: the store tells every [`Observer`] of each change it applies, and
//! [`Watches`] wakes the watchers of the changed job. On a store shared by
//! several servers, changes made through the others are seen by reading
//! again every `--watch-poll` (one get per watched job that is not final
//! yet, payload left out). Deletes and purges are not changes the store publishes: the
//! service wakes the watchers after them. A state is sent once it is durable (the store's flush), so a
//! crash never takes back a state a watcher was sent. The stream ends
//! after every watched job has been sent in a final state (DONE or
//! FAILED); a job deleted meanwhile ends it with NOT_FOUND.
//!
//! Each stream holds one of `--max-watchers` places (and one of its
//! token's `--max-streams-per-token`) and at most `--max-watch-ids` jobs.

use std::{
    collections::HashMap,
    pin::pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard, Weak,
    },
    time::{Duration, SystemTime},
};

use jobq::pb;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::{
    error::{Error, Result},
    job::{Job, JobId, LeaseId, Outcome, Status},
    store::{Fact, Store},
};

/// What a WatchJob call returns.
pub type WatchEvents = ReceiverStream<std::result::Result<pb::Job, tonic::Status>>;

/// How many states wait to be sent before a watcher stops reading.
const BUFFER: usize = 8;

/// The first wait before a read that failed is made again.
const RETRY_FIRST: Duration = Duration::from_millis(50);

/// The longest wait between reads that keep failing.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// The watchers of this server, by job.
pub struct Watches {
    by_job: Mutex<HashMap<JobId, Vec<Weak<Notify>>>>,
    /// Jobs watched now: the observer does nothing while it is 0.
    watched: AtomicUsize,
    places: Arc<Semaphore>,
    max: usize,
}

impl Watches {
    /// The watch registry of `store`, with at most `max` streams at once.
    pub fn new<S: Store>(store: &S, max: usize) -> Arc<Watches> {
        let watches = Arc::new(Watches {
            by_job: Mutex::new(HashMap::new()),
            watched: AtomicUsize::new(0),
            places: Arc::new(Semaphore::new(max)),
            max,
        });
        let weak = Arc::downgrade(&watches);
        store.observe(Arc::new(move |fact: &Fact<'_>| {
            let Some(watches) = weak.upgrade() else {
                return;
            };
            let id = match fact {
                Fact::Created(job) => job.id,
                Fact::Changed { new, .. } => new.id,
            };
            watches.changed(id);
        }));
        watches
    }

    fn by_job(&self) -> MutexGuard<'_, HashMap<JobId, Vec<Weak<Notify>>>> {
        self.by_job.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every watcher to read its jobs again (jobs were purged).
    pub fn recheck_all(&self) {
        if self.watched.load(Ordering::SeqCst) == 0 {
            return;
        }
        for notify in self.by_job().values().flatten().filter_map(Weak::upgrade) {
            notify.notify_one();
        }
    }

    /// Wakes the watchers of `id`: the store applied a change to it, or
    /// it was deleted. Runs inside the store's call: a map lookup, and
    /// nothing at all while nobody watches.
    pub fn changed(&self, id: JobId) {
        if self.watched.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(watchers) = self.by_job().get(&id) {
            for notify in watchers.iter().filter_map(Weak::upgrade) {
                notify.notify_one();
            }
        }
    }

    /// A place for one more stream.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED when `--max-watchers` streams are open.
    pub fn place(&self) -> Result<OwnedSemaphorePermit> {
        Arc::clone(&self.places).try_acquire_owned().map_err(|_| {
            Error::ResourceExhausted(format!(
                "too many WatchJob streams (limit {}, --max-watchers)",
                self.max
            ))
        })
    }

    /// Starts watching `ids` (checked and authorized by the caller), with
    /// the place from [`Watches::place`] (and whatever else the stream
    /// holds until it ends); reads again every `poll` too
    /// (`None`: only on this server's changes).
    pub fn watch<S: Store>(
        self: &Arc<Self>,
        store: Arc<S>,
        ids: Vec<JobId>,
        poll: Option<Duration>,
        place: impl Send + 'static,
        shutdown: CancellationToken,
    ) -> WatchEvents {
        let (tx, rx) = mpsc::channel(BUFFER);
        let notify = Arc::new(Notify::new());
        let registered = Registered::new(Arc::clone(self), &ids, &notify);
        tokio::spawn(async move {
            let _place = place;
            let _registered = registered;
            run(&*store, ids, &notify, &tx, poll, &shutdown).await;
        });
        ReceiverStream::new(rx)
    }
}

/// A stream's entries in [`Watches`], removed when it ends.
struct Registered {
    watches: Arc<Watches>,
    ids: Vec<JobId>,
    notify: Weak<Notify>,
}

impl Registered {
    fn new(watches: Arc<Watches>, ids: &[JobId], notify: &Arc<Notify>) -> Registered {
        {
            let mut by_job = watches.by_job();
            for id in ids {
                by_job.entry(*id).or_default().push(Arc::downgrade(notify));
            }
        }
        watches.watched.fetch_add(ids.len(), Ordering::SeqCst);
        Registered {
            watches,
            ids: ids.to_vec(),
            notify: Arc::downgrade(notify),
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut by_job = self.watches.by_job();
        for id in &self.ids {
            if let Some(watchers) = by_job.get_mut(id) {
                watchers.retain(|w| !w.ptr_eq(&self.notify) && w.strong_count() > 0);
                if watchers.is_empty() {
                    by_job.remove(id);
                }
            }
        }
        self.watches
            .watched
            .fetch_sub(self.ids.len(), Ordering::SeqCst);
    }
}

/// A job as a watcher sends it: without its payload.
fn state(mut job: Job) -> pb::Job {
    job.payload = Vec::new();
    job.into()
}

/// What a watcher compares to tell a change from the state it sent: the
/// status, the attempts and how they ended, when it runs (a replace moves
/// it), its lease (a new take), its error and result, whether it still has
/// its key (another enqueue may take it over), its latest progress report;
/// not the lease's deadline, which every heartbeat moves.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    status: Status,
    attempts: u32,
    history: usize,
    last: Option<(Option<Outcome>, Option<SystemTime>)>,
    run_at: SystemTime,
    lease: Option<LeaseId>,
    last_error: Option<String>,
    result: bool,
    keyed: bool,
    progress: Option<SystemTime>,
}

impl Seen {
    fn of(job: &Job) -> Seen {
        Seen {
            status: job.status,
            attempts: job.attempts,
            history: job.history.len(),
            last: job.history.last().map(|a| (a.outcome, a.ended_at)),
            run_at: job.run_at,
            lease: job.lease_id(),
            last_error: job.last_error.clone(),
            result: job.result.is_some(),
            keyed: job.key.is_some(),
            progress: job.progress_now().map(|p| p.reported_at),
        }
    }
}

/// Reads a watched job: without its payload, and with its result once it
/// is DONE.
async fn read<S: Store>(store: &S, id: JobId) -> Result<Job> {
    let job = store.peek(id).await?;
    if job.status == Status::Done {
        return store.get(id).await;
    }
    Ok(job)
}

async fn run<S: Store>(
    store: &S,
    ids: Vec<JobId>,
    notify: &Notify,
    tx: &mpsc::Sender<std::result::Result<pb::Job, tonic::Status>>,
    poll: Option<Duration>,
    shutdown: &CancellationToken,
) {
    let mut open = ids;
    // What was sent of each job not final yet.
    let mut sent: HashMap<JobId, Seen> = HashMap::new();
    let mut retry = RETRY_FIRST;
    loop {
        // Armed before the reads: a change made while they run wakes the
        // next wait.
        let mut notified = pin!(notify.notified());
        notified.as_mut().enable();
        let mut failed = false;
        let mut states = Vec::new();
        for id in &open {
            match read(store, *id).await {
                Ok(job) => states.push(job),
                Err(Error::NotFound(_)) => {
                    let _ = tx.send(Err(Error::NotFound(*id).into())).await;
                    return;
                }
                Err(err) if err.transient() => {
                    debug!(cause = %err, "a watched job could not be read; reading again");
                    failed = true;
                    break;
                }
                Err(err) => {
                    let _ = tx.send(Err(err.into())).await;
                    return;
                }
            }
        }
        if !failed {
            retry = RETRY_FIRST;
            // What is sent is durable: a crash never takes it back.
            if let Err(err) = store.flush().await {
                let _ = tx.send(Err(err.into())).await;
                return;
            }
            for job in states {
                let (id, done) = (job.id, matches!(job.status, Status::Done | Status::Failed));
                let seen = Seen::of(&job);
                if sent.get(&id) != Some(&seen) {
                    if tx.send(Ok(state(job))).await.is_err() {
                        return;
                    }
                    sent.insert(id, seen);
                }
                if done {
                    open.retain(|o| *o != id);
                    sent.remove(&id);
                }
            }
            if open.is_empty() {
                return;
            }
        }
        let wait = if failed {
            let wait = retry;
            retry = (retry * 2).min(RETRY_MAX);
            Some(wait)
        } else {
            poll
        };
        tokio::select! {
            () = notified => {}
            () = sleep_opt(wait) => {}
            () = tx.closed() => return,
            () = shutdown.cancelled() => {
                let _ = tx.send(Err(Error::ShuttingDown.into())).await;
                return;
            }
        }
    }
}

async fn sleep_opt(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}
