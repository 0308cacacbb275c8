//! Lease streams: the server pushes jobs to workers (docs/src/design.md §3).
//!
//! Each `Lease` call gets a task that takes due jobs while the stream holds
//! fewer than its capacity, and sleeps on the store's change signal (or the
//! next delayed job's due time) otherwise. Jobs pushed on a stream belong to
//! it: when the stream ends because the worker went away, they are
//! reclaimed (after `--disconnect-grace`) as "worker disconnected". A
//! server shutdown ends the streams with UNAVAILABLE but reclaims nothing:
//! the persisted leases stay valid until they expire.
//!
//! The [`LeaseHub`] connects the streams to the rest of the server. It
//! listens to the store's lease-ended events: whoever ended a lease (an
//! ack through this server or another, a fail, the reaper, a reclaim), the
//! stream that held it frees its slot, and a stream whose lease was taken
//! away is told `revoked`. No RPC handler frees a slot, so a client that
//! cancels its Ack cannot leak one.
//!
//! Flow control: a stream takes a job only when the previous one has been
//! pulled by the transport, and at most `capacity` at a time, so a worker
//! that stops reading is given nothing more and the server buffers at most
//! one job for it. A job still waiting to be pulled when its lease runs out
//! (or when the stream ends) never reached the worker: it is given back
//! without spending an attempt. A stream whose delivered lease expired
//! without a heartbeat (a frozen worker) gets no new jobs until its worker
//! heartbeats or acks again.

mod in_flight;

use std::{
    collections::{HashMap, HashSet},
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, Weak,
    },
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use jobq::pb::{self, lease_event::Event};
use tokio::sync::{mpsc, watch, Notify};
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::{
    auth::Caller,
    clock::retake_at,
    config::Config,
    error::Error,
    job::{Job, JobId, LeaseId, Outcome, Status},
    liveness::Liveness,
    store::{LeaseEnded, Store},
    validate::StreamSpec,
};

/// The response header that carries a stream's token.
pub use jobq::STREAM_TOKEN_HEADER;

type StreamId = u64;

/// How long a refused stream waits for room in its channel for the status
/// that ends it.
const REFUSAL_ROOM: Duration = Duration::from_secs(1);

/// How long a stream looks up why a cancelled job's lease ended before it
/// tells the worker without it (the stream does nothing else meanwhile,
/// and a bulk cancel makes one lookup per lease it held).
const CANCEL_REASON_WAIT: Duration = Duration::from_millis(100);

/// Why a stream of a server whose heartbeat is stale ends.
const STALE_SERVER: &str = "this server cannot heartbeat to the database; reconnect to another server and declare the leases you hold";

/// The revoke reason of a lease that the same worker declared on a newer
/// stream of this server.
const MOVED_HERE: &str = "taken over by a newer stream of this worker";

/// The revoke reason of a lease that the same worker declared on a stream
/// of another server.
const MOVED_AWAY: &str = "taken over by this worker's stream on another server";

/// The first wait before a stream takes again after a transient store
/// failure (a database restart, an exhausted pool); it doubles up to
/// [`STORE_RETRY_MAX`] while the failures go on.
const STORE_RETRY_FIRST: Duration = Duration::from_millis(50);

/// The longest wait between a stream's retries of a failing store.
const STORE_RETRY_MAX: Duration = Duration::from_secs(2);

/// A message to one stream's task.
#[derive(Debug, Clone)]
enum Notice {
    /// The lease ended by ack or fail: its slot is free, and the worker is
    /// evidently alive.
    Released(LeaseId),
    /// The lease was taken away: tell the worker (`tell`: unless it never
    /// saw the job), free the slot. `stall`: it expired although the worker
    /// had it, so the worker may be frozen.
    Revoked {
        job: JobId,
        lease: LeaseId,
        reason: &'static str,
        stall: bool,
        tell: bool,
        /// By CancelJob: the worker is told the operator's reason too.
        cancelled: bool,
    },
    /// The worker heartbeated through this stream's token.
    Heartbeat { draining: bool },
    /// The stream's token was revoked, or lost its queues (a tokens
    /// reload): the stream ends with this error, as if its worker went
    /// away.
    Refused(tonic::Status),
}

/// What a stream's task and its outgoing event stream share.
#[derive(Default)]
struct Pipe {
    /// Leases sent into the channel that the transport has not pulled yet.
    unpulled: Mutex<HashSet<LeaseId>>,
    /// Signalled when the transport pulls a leased job.
    pulled: Notify,
    /// Unpulled leases the reaper claimed (see `LeaseHub::undelivered`),
    /// until their give-back is published: a pass whose give-back failed
    /// finds them claimed again.
    claimed: Mutex<HashSet<LeaseId>>,
    /// Set when the outgoing side refused to send a lease because this
    /// server's heartbeat was stale, and ended the stream.
    stale: AtomicBool,
}

impl Pipe {
    fn unpulled(&self) -> MutexGuard<'_, HashSet<LeaseId>> {
        self.unpulled.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claimed(&self) -> MutexGuard<'_, HashSet<LeaseId>> {
        self.claimed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One item of a stream's channel.
struct Outgoing {
    lease: Option<LeaseId>,
    /// The liveness epoch its take began in (see [`Liveness`]).
    epoch: u64,
    item: Result<pb::LeaseEvent, tonic::Status>,
}

/// What a Lease RPC returns: the events of one stream. Pulling a leased
/// job from it is what counts as "sent".
pub struct LeaseEvents {
    rx: mpsc::Receiver<Outgoing>,
    pipe: Arc<Pipe>,
    liveness: Liveness,
    /// Ended by this side (a stale server's UNAVAILABLE was the last item).
    ended: bool,
}

impl Stream for LeaseEvents {
    type Item = Result<pb::LeaseEvent, tonic::Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        loop {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(out)) => {
                    if let Some(lease) = out.lease {
                        if !self.liveness.may_send(out.epoch) {
                            // This server's heartbeat is stale, or lapsed
                            // since the take began (it may have been frozen
                            // with the job waiting here): the others may
                            // have reclaimed the lease, so it is not sent. It stays unpulled, and is given back
                            // as the stream ends, which this ends now.
                            self.ended = true;
                            self.pipe.stale.store(true, Ordering::Relaxed);
                            return Poll::Ready(Some(Err(tonic::Status::unavailable(
                                STALE_SERVER,
                            ))));
                        }
                        let still_ours = self.pipe.unpulled().remove(&lease);
                        self.pipe.pulled.notify_one();
                        if !still_ours {
                            // Given back while it waited here (its lease ran
                            // out, see `LeaseHub::undelivered`): the job may
                            // be another worker's now, so it is never sent.
                            continue;
                        }
                    }
                    return Poll::Ready(Some(out.item));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

struct StreamEntry {
    worker_id: String,
    token: String,
    /// The token that opened it, and its queues: checked again when the
    /// tokens are reloaded.
    caller: Option<(Caller, Vec<String>)>,
    notices: mpsc::UnboundedSender<Notice>,
    pipe: Arc<Pipe>,
    /// Its delivered leases that expired without a heartbeat since its
    /// worker was last heard from (by a heartbeat, an ack or a fail, which
    /// clear them; so at most its capacity): an ack or fail of one of them,
    /// refused as stale, still shows the worker is alive. Each is also in
    /// [`Registry::expired`].
    expired: HashSet<LeaseId>,
}

impl StreamEntry {
    /// Whether `caller` (`None` with tokens off) opened this stream.
    fn opened_by(&self, caller: Option<&Caller>) -> bool {
        match (&self.caller, caller) {
            (None, None) => true,
            (Some((opened, _)), Some(caller)) => opened.same_secret(caller),
            _ => false,
        }
    }
}

/// What a declared lease took over when its stream opened, to put back if
/// the declaration turns out not to match.
struct Displaced {
    /// The stream that owned the lease, and its job.
    owner: Option<(StreamId, JobId)>,
    /// Whether it was an orphan waiting out `--disconnect-grace`.
    orphan: bool,
}

#[derive(Default)]
struct Registry {
    /// Which stream holds each pushed lease, and its job.
    owners: HashMap<LeaseId, (StreamId, JobId)>,
    streams: HashMap<StreamId, StreamEntry>,
    tokens: HashMap<String, StreamId>,
    /// Leases of streams that ended, waiting out `--disconnect-grace`; a
    /// heartbeat (or a new stream that declares them) within the grace
    /// adopts them (they stay leased).
    orphans: HashSet<LeaseId>,
    /// Leases a new stream declared and owns until its check: what each
    /// took over, put back if the check fails ([`LeaseHub::adopt`]), and
    /// told too if the lease ends before the check.
    displaced: HashMap<LeaseId, Displaced>,
    /// Takes not yet registered as owners, and the unowned lease ends they
    /// may have raced with.
    in_flight: in_flight::InFlight,
    /// Which stream each lease in a [`StreamEntry::expired`] belongs to.
    expired: HashMap<LeaseId, StreamId>,
}

impl Registry {
    /// Stream `id`'s worker was heard from: it forgets its expired leases,
    /// and with `notice` (a heartbeat's), a stalled stream takes jobs
    /// again.
    fn heard_from(&mut self, id: StreamId, notice: Option<Notice>) {
        let Registry {
            streams, expired, ..
        } = self;
        if let Some(entry) = streams.get_mut(&id) {
            for lease in entry.expired.drain() {
                expired.remove(&lease);
            }
            if let Some(notice) = notice {
                let _ = entry.notices.send(notice);
            }
        }
    }
}

/// A stream's take until its lease is owned (or it returned nothing); a
/// take dropped midway still counts as finished.
struct TakeInFlight<'a> {
    registry: &'a Mutex<Registry>,
    since: Option<u64>,
}

impl<'a> TakeInFlight<'a> {
    fn begin(registry: &'a Mutex<Registry>) -> TakeInFlight<'a> {
        let since = lock(registry).in_flight.begin();
        TakeInFlight {
            registry,
            since: Some(since),
        }
    }

    /// The take returned `lease`: whether it ended meanwhile, decided
    /// under `reg`, so that the caller registers its owner before any later
    /// end is published.
    fn finish(mut self, reg: &mut Registry, lease: LeaseId) -> bool {
        match self.since.take() {
            Some(since) => reg.in_flight.finish(since, Some(lease)),
            None => false,
        }
    }
}

impl Drop for TakeInFlight<'_> {
    fn drop(&mut self) {
        if let Some(since) = self.since.take() {
            lock(self.registry).in_flight.finish(since, None);
        }
    }
}

fn lock(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    // A panic elsewhere must not wedge every stream: the registry holds
    // no invariant that a half-finished update could break badly.
    registry.lock().unwrap_or_else(|p| p.into_inner())
}

/// The registry of live Lease streams.
pub struct LeaseHub<S> {
    store: Arc<S>,
    config: Arc<Config>,
    shutdown: CancellationToken,
    registry: Mutex<Registry>,
    next_stream: AtomicU64,
    /// Stream tasks not finished yet, their give-backs and reclaims
    /// included (a stream leaves the registry before those).
    tasks: Arc<watch::Sender<usize>>,
}

/// How a stream's task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The worker closed the stream, died, or its connection broke.
    WorkerGone,
    /// The server is shutting down.
    Shutdown,
    /// The store failed; the worker is told and will reconnect.
    StoreFailed,
    /// This server's own heartbeat is stale (see
    /// [`Store::registered`]): the worker is told to reconnect to another
    /// server, and keeps its leases.
    Unregistered,
}

impl<S: Store> LeaseHub<S> {
    /// A hub over `store`; `shutdown` ends every stream without reclaiming.
    /// It subscribes to the store's lease-ended events.
    pub fn new(store: Arc<S>, config: Arc<Config>, shutdown: CancellationToken) -> Arc<Self> {
        let hub = Arc::new(LeaseHub {
            store: Arc::clone(&store),
            config,
            shutdown,
            registry: Mutex::new(Registry::default()),
            next_stream: AtomicU64::new(1),
            tasks: Arc::new(watch::Sender::new(0)),
        });
        let weak: Weak<LeaseHub<S>> = Arc::downgrade(&hub);
        store.on_lease_ended(Arc::new(move |ended: &LeaseEnded| {
            if let Some(hub) = weak.upgrade() {
                hub.lease_ended(ended);
            }
        }));
        hub
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        lock(&self.registry)
    }

    /// Opens a stream for a validated Lease request and starts its task;
    /// returns its events and its token. `permit` is held while the
    /// stream lives: what counts it against `--max-waiters` and its
    /// token's `--max-streams-per-token`.
    ///
    /// `refused` is asked, under the registry's lock, just before the
    /// stream is registered: whether its token is still allowed (a tokens
    /// reload may have swept the streams since the call's checks). A
    /// reload swaps the tokens before it takes that lock to sweep, so it
    /// either finds this stream or `refused` sees the new tokens.
    ///
    /// # Errors
    /// What `refused` says; nothing is registered or started then.
    pub fn open(
        self: &Arc<Self>,
        mut spec: StreamSpec,
        permit: impl Send + 'static,
        refused: impl FnOnce() -> Option<Error>,
    ) -> Result<(LeaseEvents, String), Error> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        // A lease declared twice counts once, for its first job.
        let mut declared = HashSet::new();
        spec.held.retain(|(_, lease)| declared.insert(*lease));
        // Room for revocations; leased jobs wait for the transport one at
        // a time (see the module docs).
        let (tx, rx) = mpsc::channel(spec.capacity.clamp(4, 64));
        let (notices_tx, notices) = mpsc::unbounded_channel();
        let pipe = Arc::new(Pipe::default());
        let token = format!("{:032x}", rand::random::<u128>());
        {
            let mut reg = self.registry();
            if let Some(err) = refused() {
                return Err(err);
            }
            reg.streams.insert(
                id,
                StreamEntry {
                    worker_id: spec.take.worker_id.clone(),
                    token: token.clone(),
                    caller: spec
                        .caller
                        .take()
                        .map(|caller| (caller, spec.take.queues.clone())),
                    notices: notices_tx,
                    pipe: Arc::clone(&pipe),
                    expired: HashSet::new(),
                },
            );
            reg.tokens.insert(token.clone(), id);
            // Owned before they are checked, so an ack that lands meanwhile
            // still finds (and frees) them. What they displace is kept, and
            // put back if the check fails: a declaration that does not
            // match (a wrong job id) must not take a lease from the stream
            // that holds it, nor from the orphans waiting to be reclaimed.
            for (job, lease) in &spec.held {
                let owner = reg.owners.insert(*lease, (id, *job));
                let orphan = reg.orphans.remove(lease);
                reg.displaced.insert(*lease, Displaced { owner, orphan });
            }
        }
        let span = tracing::info_span!("lease_stream", stream = id, worker.id = %spec.take.worker_id, capacity = spec.capacity);
        let hub = Arc::clone(self);
        let task_pipe = Arc::clone(&pipe);
        /// Counts the task until it ends, however it ends.
        struct Running(Arc<watch::Sender<usize>>);
        impl Drop for Running {
            fn drop(&mut self) {
                self.0.send_modify(|n| *n -= 1);
            }
        }
        self.tasks.send_modify(|n| *n += 1);
        let running = Running(Arc::clone(&self.tasks));
        tokio::spawn(
            async move {
                let _running = running;
                hub.run_stream(id, spec, tx, notices, task_pipe, Box::new(permit))
                    .await;
            }
            .instrument(span),
        );
        let liveness = self.store.liveness();
        Ok((
            LeaseEvents {
                rx,
                pipe,
                liveness,
                ended: false,
            },
            token,
        ))
    }

    /// The store ended a lease: the stream that held it frees its slot, and
    /// is told when the lease was taken away.
    fn lease_ended(&self, ended: &LeaseEnded) {
        let mut reg = self.registry();
        reg.orphans.remove(&ended.lease);
        let owner = reg.owners.remove(&ended.lease).map(|(stream, _)| stream);
        if owner.is_none() {
            // Perhaps a take that has not registered it yet.
            reg.in_flight.ended_unowned(ended.lease);
        }
        // Declared by a stream that has not checked it yet: the stream it
        // was taken over from (if the declaration was wrong, the one that
        // really holds it) hears of it too.
        let before = reg
            .displaced
            .remove(&ended.lease)
            .and_then(|d| d.owner)
            .map(|(stream, _)| stream);
        let streams: Vec<_> = owner
            .into_iter()
            .chain(before.filter(|b| Some(*b) != owner))
            .filter_map(|s| reg.streams.get(&s))
            .collect();
        // A lease still waiting in a stream's channel is never sent now
        // (the transport skips it), and its worker, who never saw it, is
        // not told.
        let mut unsent = false;
        for entry in &streams {
            entry.pipe.claimed().remove(&ended.lease);
            unsent |= entry.pipe.unpulled().remove(&ended.lease);
        }
        if streams.is_empty() {
            return;
        }
        let notice = match ended.outcome {
            // Declared by the same worker on another server's stream: the
            // worker learns it there; this stream frees its slot.
            _ if ended.moved => Notice::Revoked {
                job: ended.job,
                lease: ended.lease,
                reason: MOVED_AWAY,
                stall: false,
                tell: true,
                cancelled: false,
            },
            Some(Outcome::Acked | Outcome::Failed | Outcome::Snoozed) => {
                Notice::Released(ended.lease)
            }
            // A stream forgets its own leases before it reclaims them, so
            // one still owned was taken from a live stream (another server
            // decided this one was gone): its worker must stop.
            Some(outcome @ Outcome::WorkerDisconnected) => Notice::Revoked {
                job: ended.job,
                lease: ended.lease,
                reason: outcome.reason(),
                stall: false,
                tell: true,
                cancelled: false,
            },
            Some(outcome @ (Outcome::LeaseExpired | Outcome::Revoked)) => Notice::Revoked {
                job: ended.job,
                lease: ended.lease,
                reason: outcome.reason(),
                stall: outcome == Outcome::LeaseExpired,
                tell: true,
                cancelled: outcome == Outcome::Revoked,
            },
            // Given back without an attempt: the worker never pulled it.
            None => Notice::Revoked {
                job: ended.job,
                lease: ended.lease,
                reason: "not delivered",
                stall: false,
                tell: false,
                cancelled: false,
            },
        };
        let notice = match notice {
            Notice::Revoked {
                job, lease, reason, ..
            } if unsent => Notice::Revoked {
                job,
                lease,
                reason,
                stall: false,
                tell: false,
                cancelled: false,
            },
            notice => notice,
        };
        for entry in streams {
            let _ = entry.notices.send(notice.clone());
        }
        let Some(owner) = owner else {
            return;
        };
        match ended.outcome {
            Some(Outcome::LeaseExpired) if !ended.moved => {
                if let Some(entry) = reg.streams.get_mut(&owner) {
                    entry.expired.insert(ended.lease);
                    reg.expired.insert(ended.lease, owner);
                }
            }
            // Its worker is alive (the notice un-stalls the stream).
            Some(Outcome::Acked | Outcome::Failed | Outcome::Snoozed) => {
                reg.heard_from(owner, None)
            }
            _ => {}
        }
    }

    /// Checks leases this server's streams hold against the store (all of
    /// them, or those of `leases`), and ends, as the store would have, every
    /// one whose job no longer holds it: its lease-ended event was missed
    /// (a shared store's notification connection broke meanwhile), and its
    /// stream would otherwise keep the slot for good. Returns how many.
    pub async fn reconcile(&self, leases: Option<&[(JobId, LeaseId)]>) -> usize {
        // Each lease with the job its stream took it with, never a job a
        // request names (a heartbeat with a wrong job id must not end a
        // lease that is fine); a lease declared by a stream that has not
        // checked it yet is left to that check.
        let settled = |reg: &Registry, lease: &LeaseId| -> Option<JobId> {
            if reg.displaced.contains_key(lease) {
                return None;
            }
            reg.owners.get(lease).map(|(_, job)| *job)
        };
        let owned: Vec<(JobId, LeaseId)> = {
            let reg = self.registry();
            match leases {
                None => reg
                    .owners
                    .keys()
                    .filter_map(|lease| Some((settled(&reg, lease)?, *lease)))
                    .collect(),
                Some(leases) => leases
                    .iter()
                    .filter(|(job, lease)| settled(&reg, lease) == Some(*job))
                    .copied()
                    .collect(),
            }
        };
        let mut ended = 0;
        for (job, lease) in owned {
            // Lease ids are never reused: a job that does not hold this one
            // now never will again.
            let event = match self.store.peek(job).await {
                Ok(j) if j.lease_id() == Some(lease) => continue,
                Ok(j) => LeaseEnded {
                    job,
                    lease,
                    outcome: j
                        .history
                        .iter()
                        .rev()
                        .find(|a| a.lease_id == lease)
                        .and_then(|a| a.outcome),
                    queue: j.queue,
                    status: j.status,
                    moved: false,
                },
                // Gone (deleted or purged once finished): taken away.
                Err(Error::NotFound(_)) => LeaseEnded {
                    job,
                    lease,
                    outcome: Some(Outcome::Revoked),
                    queue: String::new(),
                    status: Status::Done,
                    moved: false,
                },
                Err(err) => {
                    warn!(cause = %err, job.id = %job, "could not check a stream's lease; will check again");
                    continue;
                }
            };
            let still = settled(&self.registry(), &lease) == Some(job);
            if still {
                self.lease_ended(&event);
                ended += 1;
            }
        }
        if ended > 0 {
            info!(
                leases = ended,
                "freed stream slots whose lease-ended events were missed"
            );
        }
        ended
    }

    /// Whether a lease's job is still waiting in its stream, never pulled
    /// by the transport: its expiry is then no attempt of the worker's.
    /// Claims it: from now on the transport skips it, so a job given back
    /// for this reason never reaches that worker after all (it may be
    /// another's by then).
    pub fn undelivered(&self, lease: LeaseId) -> bool {
        let reg = self.registry();
        let Some(entry) = reg
            .owners
            .get(&lease)
            .and_then(|(stream, _)| reg.streams.get(stream))
        else {
            return false;
        };
        if entry.pipe.unpulled().remove(&lease) {
            entry.pipe.claimed().insert(lease);
            return true;
        }
        let claimed = entry.pipe.claimed().contains(&lease);
        claimed
    }

    /// A heartbeat arrived for these leases: any that belonged to a stream
    /// that ended within the grace are kept (not reclaimed). The stream
    /// named by `token` learns its worker is alive, and with `draining`
    /// pushes no more jobs. Without a token (an older client), the
    /// worker's streams learn it is alive, and `draining` does nothing:
    /// worker ids are not unique enough to stop other workers' streams.
    /// Either way only streams opened with the heartbeat's own secret
    /// (`caller`; `None` with tokens off) are touched: another token's
    /// heartbeat cannot wake a stalled worker's stream.
    pub fn heartbeat(
        &self,
        worker_id: &str,
        leases: &[(JobId, LeaseId)],
        draining: bool,
        token: &str,
        caller: Option<&Caller>,
    ) {
        let mut reg = self.registry();
        for (_, lease) in leases {
            reg.orphans.remove(lease);
        }
        if token.is_empty() {
            let ids: Vec<StreamId> = reg
                .streams
                .iter()
                .filter(|(_, e)| e.worker_id == worker_id && e.opened_by(caller))
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                reg.heard_from(id, Some(Notice::Heartbeat { draining: false }));
            }
        } else if let Some(id) = reg.tokens.get(token).copied() {
            if reg.streams.get(&id).is_some_and(|e| e.opened_by(caller)) {
                reg.heard_from(id, Some(Notice::Heartbeat { draining }));
            }
        }
    }

    /// A worker acked or failed `lease` (whether or not the store took it):
    /// a worker whose one handler hung past its lease and then finished is
    /// alive, so the stream whose lease that was, if it was stalled by that
    /// lease's expiry, takes jobs again. Only a stream opened with the
    /// report's own secret (`caller`) is touched.
    pub fn reported(&self, lease: LeaseId, caller: Option<&Caller>) {
        let mut reg = self.registry();
        let Some(&id) = reg.expired.get(&lease) else {
            return;
        };
        if reg.streams.get(&id).is_some_and(|e| e.opened_by(caller)) {
            reg.heard_from(id, Some(Notice::Heartbeat { draining: false }));
        }
    }

    /// Ends every stream whose token `refused` now turns away (see
    /// [`crate::auth::Auth::stream_refused`]), after a tokens reload: the
    /// worker gets the error, and the stream's jobs come back as a gone
    /// worker's do. Returns how many streams it ended.
    pub fn refuse_streams(&self, refused: impl Fn(&Caller, &[String]) -> Option<Error>) -> usize {
        let reg = self.registry();
        let mut ended = 0;
        for entry in reg.streams.values() {
            let Some((caller, queues)) = &entry.caller else {
                continue;
            };
            if let Some(err) = refused(caller, queues) {
                if entry.notices.send(Notice::Refused(err.into())).is_ok() {
                    ended += 1;
                }
            }
        }
        ended
    }

    /// How many streams are open.
    pub fn open_streams(&self) -> usize {
        self.registry().streams.len()
    }

    /// How many stream tasks have not finished: a closed stream's task
    /// still gives back and reclaims its jobs after it left
    /// [`LeaseHub::open_streams`].
    pub fn stream_tasks(&self) -> usize {
        *self.tasks.borrow()
    }

    /// Waits until every stream task has finished (after a shutdown: each
    /// ends its stream, and gives back what its worker never received),
    /// or until `deadline`. Returns how many are left.
    pub async fn streams_finished(&self, deadline: tokio::time::Instant) -> usize {
        let mut tasks = self.tasks.subscribe();
        let _ = tokio::time::timeout_at(deadline, tasks.wait_for(|n| *n == 0)).await;
        self.stream_tasks()
    }

    /// Checks the leases a new stream declared: those it still holds count
    /// against its capacity; the others are dropped, and whatever their
    /// declaration displaced is put back.
    ///
    /// A declared lease is kept only under the worker id that holds it: a
    /// stream of another worker cannot take it over. The stream it is taken
    /// from (the same worker's older stream, still open) frees its slot and
    /// is told `revoked`, as for any other lease-ended event.
    ///
    /// Without `admit` (this server's heartbeat is stale, and the stream is
    /// about to end) nothing is adopted: the leases stay where they were,
    /// for the worker to declare on another server.
    async fn adopt(
        &self,
        id: StreamId,
        worker_id: &str,
        held: &[(JobId, LeaseId)],
        admit: bool,
    ) -> HashMap<LeaseId, JobId> {
        let mut adopted = HashMap::new();
        for &(job, lease) in held {
            let holds = admit
                && matches!(
                    self.store.peek(job).await,
                    Ok(j) if j.lease.as_ref().is_some_and(|l| l.id == lease && l.worker_id == worker_id)
                );
            let mut reg = self.registry();
            // An event that ended the lease meanwhile removed the owner
            // (and told the displaced one).
            let owned = reg.owners.get(&lease) == Some(&(id, job));
            let before = if owned {
                reg.displaced.remove(&lease)
            } else {
                None
            };
            if holds && owned {
                adopted.insert(lease, job);
                let from = before
                    .and_then(|b| b.owner)
                    .map(|(stream, _)| stream)
                    .filter(|stream| *stream != id);
                if let Some(entry) = from.and_then(|stream| reg.streams.get(&stream)) {
                    // Never pushed there now, if it was still waiting.
                    entry.pipe.unpulled().remove(&lease);
                    let _ = entry.notices.send(Notice::Revoked {
                        job,
                        lease,
                        reason: MOVED_HERE,
                        stall: false,
                        tell: true,
                        cancelled: false,
                    });
                }
            } else if owned {
                reg.owners.remove(&lease);
                let Some(before) = before else {
                    continue;
                };
                if let Some(owner) = before.owner.filter(|(s, _)| reg.streams.contains_key(s)) {
                    reg.owners.insert(lease, owner);
                }
                if before.orphan {
                    reg.orphans.insert(lease);
                }
            }
        }
        // With a shared store the leases may have come from a server that
        // died: this server holds them now, so they are not reclaimed as
        // that server's orphans.
        let pairs: Vec<(JobId, LeaseId)> = adopted.iter().map(|(l, j)| (*j, *l)).collect();
        if let Err(err) = self.store.adopt(&pairs).await {
            warn!(cause = %err, "could not record adopted leases; if their old server died they will be reclaimed");
        }
        adopted
    }

    async fn run_stream(
        self: Arc<Self>,
        id: StreamId,
        spec: StreamSpec,
        tx: mpsc::Sender<Outgoing>,
        mut notices: mpsc::UnboundedReceiver<Notice>,
        pipe: Arc<Pipe>,
        permit: Box<dyn Send>,
    ) {
        debug!("lease stream opened");
        let liveness = self.store.liveness();
        let StreamSpec {
            take,
            capacity,
            held,
            caller: _,
        } = spec;
        let admit = *self.store.registered().borrow();
        let mut held = self.adopt(id, &take.worker_id, &held, admit).await;
        if !held.is_empty() {
            debug!(adopted = held.len(), "lease stream adopted held leases");
        }
        let mut changes = self.store.changes();
        let mut registered = self.store.registered();
        let (mut draining, mut stalled) = (false, false);
        // The due version of this stream's queues when it last looked, and
        // whether only a change woke it since: a change to other queues
        // leaves the version as it was, and then there is nothing new to
        // take (on PostgreSQL, a take's transaction saved per stream).
        let (mut seen, mut by_change) = (None, false);
        let mut retake: Option<tokio::time::Instant> = None;
        // After a transient store failure: no look before this, and the
        // next failure's wait.
        let (mut retry_at, mut retry_wait) = (None::<tokio::time::Instant>, STORE_RETRY_FIRST);
        let end = 'stream: loop {
            // No take begins after a shutdown (one under way finishes, and
            // what it took is given back below).
            if self.shutdown.is_cancelled() {
                break 'stream End::Shutdown;
            }
            if !*registered.borrow_and_update() {
                break 'stream End::Unregistered;
            }
            let waiting_for_pull = !pipe.unpulled().is_empty();
            let hungry = held.len() < capacity && !draining && !stalled && !waiting_for_pull;
            let now = tokio::time::Instant::now();
            let timer_due = retake.is_some_and(|at| at <= now);
            let backing_off = retry_at.is_some_and(|at| at > now);
            let look = hungry
                && !backing_off
                && !(by_change && !timer_due && seen == Some(self.store.due_version(&take.queues)));
            by_change = false;
            if look {
                changes.borrow_and_update();
                seen = Some(self.store.due_version(&take.queues));
                let permit = match tx.try_reserve() {
                    Ok(permit) => Some(permit),
                    // Full of revocations the worker has not read yet.
                    Err(mpsc::error::TrySendError::Full(())) => None,
                    Err(mpsc::error::TrySendError::Closed(())) => break 'stream End::WorkerGone,
                };
                if let Some(permit) = permit {
                    let in_flight = TakeInFlight::begin(&self.registry);
                    let epoch = liveness.epoch();
                    match self
                        .store
                        .take_streamed(
                            &take.queues,
                            &take.worker_id,
                            take.owner.as_deref(),
                            take.lease,
                            SystemTime::now(),
                        )
                        .await
                    {
                        Ok(Some(leased)) => {
                            (retry_at, retry_wait) = (None, STORE_RETRY_FIRST);
                            let (job, lease) = (leased.job.id, leased.lease_id);
                            {
                                let mut reg = self.registry();
                                if in_flight.finish(&mut reg, lease) {
                                    // Ended before it was ours (cancelled
                                    // right after the take): not pushed,
                                    // and the slot stays free.
                                    debug!(job.id = %job, lease.id = %lease, "lease ended before it was pushed");
                                    continue;
                                }
                                // Owned before it is sent, so an ack that
                                // races the send still finds its stream.
                                reg.owners.insert(lease, (id, job));
                            }
                            pipe.unpulled().insert(lease);
                            held.insert(lease, job);
                            debug!(job.id = %job, lease.id = %lease, "pushed");
                            permit.send(Outgoing {
                                lease: Some(lease),
                                epoch,
                                item: Ok(pb::LeaseEvent {
                                    event: Some(Event::Leased(leased.into())),
                                }),
                            });
                            continue;
                        }
                        Ok(None) => (retry_at, retry_wait) = (None, STORE_RETRY_FIRST),
                        // Retried, not an end of the stream: its worker
                        // keeps its place and its leases.
                        Err(err) if err.transient() => {
                            warn!(cause = %err, retry_in = ?retry_wait, "a stream's take failed; retrying");
                            retry_at = Some(tokio::time::Instant::now() + retry_wait);
                            retake = retry_at;
                            retry_wait = (retry_wait * 2).min(STORE_RETRY_MAX);
                            continue;
                        }
                        Err(err) => {
                            permit.send(Outgoing {
                                lease: None,
                                epoch: 0,
                                item: Err(err.into()),
                            });
                            break 'stream End::StoreFailed;
                        }
                    }
                }
            }
            let wake = if look {
                retake = match self.store.next_run_at(&take.queues).await {
                    // Not at once: the take just found nothing (a due row
                    // held by another transaction), or the channel is full.
                    Ok(at) => at.map(retake_at),
                    Err(err) if err.transient() => {
                        warn!(cause = %err, retry_in = ?retry_wait, "a stream could not find its next due job; retrying");
                        retry_at = Some(tokio::time::Instant::now() + retry_wait);
                        retry_wait = (retry_wait * 2).min(STORE_RETRY_MAX);
                        retry_at
                    }
                    Err(err) => {
                        let _ = tx.try_send(Outgoing {
                            lease: None,
                            epoch: 0,
                            item: Err(err.into()),
                        });
                        break 'stream End::StoreFailed;
                    }
                };
                retake
            } else if hungry {
                // Woken for other queues: the last look's timer stands.
                retake
            } else {
                None
            };
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break 'stream End::Shutdown,
                () = tx.closed() => break 'stream End::WorkerGone,
                Some(notice) = notices.recv() => match notice {
                    Notice::Released(lease) => {
                        held.remove(&lease);
                        stalled = false;
                    }
                    Notice::Revoked { job, lease, reason, stall, tell, cancelled } => {
                        if held.remove(&lease).is_some() && tell {
                            stalled |= stall;
                            if stall {
                                info!(job.id = %job, "a delivered lease expired without a heartbeat; no new jobs for this stream until its worker heartbeats");
                            }
                            let reason = if cancelled {
                                self.cancel_reason(job, lease, reason).await
                            } else {
                                reason.to_owned()
                            };
                            let revoked = pb::LeaseRevoked { job_id: job.to_string(), lease_id: lease.to_string(), reason };
                            // A worker that does not read cannot be told;
                            // its next heartbeat or ack learns it instead.
                            let _ = tx.try_send(Outgoing {
                                lease: None,
                                epoch: 0,
                                item: Ok(pb::LeaseEvent { event: Some(Event::Revoked(revoked)) }),
                            });
                        }
                    }
                    Notice::Heartbeat { draining: d } => {
                        stalled = false;
                        draining |= d;
                    }
                    Notice::Refused(status) => {
                        info!(cause = status.message(), "lease stream ended: its token no longer allows it");
                        // The channel may be full of revocations the worker
                        // has not read: wait a little for room, so that the
                        // stream ends with this status rather than OK.
                        let last = Outgoing {
                            lease: None,
                            epoch: 0,
                            item: Err(status),
                        };
                        let _ = tokio::time::timeout(REFUSAL_ROOM, tx.send(last)).await;
                        break 'stream End::WorkerGone;
                    }
                },
                () = pipe.pulled.notified(), if waiting_for_pull => {}
                changed = registered.changed() => {
                    if changed.is_err() {
                        break 'stream End::Shutdown;
                    }
                }
                changed = changes.changed(), if hungry => {
                    if changed.is_err() {
                        break 'stream End::Shutdown;
                    }
                    by_change = true;
                }
                () = sleep_until_opt(wake), if wake.is_some() => {}
            }
        };
        // The outgoing side ended itself on a stale heartbeat: not a worker
        // gone, whose sent leases would be reclaimed, but a server that
        // must hand its workers to another.
        let end = if end == End::WorkerGone && pipe.stale.load(Ordering::Relaxed) {
            End::Unregistered
        } else {
            end
        };
        // What the transport never pulled is never sent now (taking it out
        // makes the event stream skip it): it goes back without an attempt.
        let (never_sent, sent): (HashMap<_, _>, HashMap<_, _>) = {
            let mut reg = self.registry();
            if let Some(entry) = reg.streams.remove(&id) {
                reg.tokens.remove(&entry.token);
                for lease in &entry.expired {
                    reg.expired.remove(lease);
                }
            }
            // A lease a newer stream declared (the worker reconnected) is
            // that stream's now: neither freed nor reclaimed here.
            held.retain(|lease, _| match reg.owners.get(lease) {
                Some((owner, _)) if *owner == id => {
                    reg.owners.remove(lease);
                    true
                }
                _ => false,
            });
            let split: (HashMap<_, _>, HashMap<_, _>) = match end {
                End::WorkerGone | End::StoreFailed | End::Unregistered => {
                    // Claimed ones too: the reaper's give-back of them may
                    // have failed, or not be published yet.
                    let unpulled = std::mem::take(&mut *pipe.unpulled());
                    let claimed = std::mem::take(&mut *pipe.claimed());
                    held.iter()
                        .map(|(lease, job)| (*lease, *job))
                        .partition(|(lease, _)| unpulled.contains(lease) || claimed.contains(lease))
                }
                // Only what never left the server: the workers keep the
                // rest, to finish and ack through another server or this
                // one after its restart.
                End::Shutdown => {
                    let unpulled = std::mem::take(&mut *pipe.unpulled());
                    let claimed = std::mem::take(&mut *pipe.claimed());
                    let never_sent = held
                        .iter()
                        .map(|(lease, job)| (*lease, *job))
                        .filter(|(lease, _)| unpulled.contains(lease) || claimed.contains(lease))
                        .collect();
                    (never_sent, HashMap::new())
                }
            };
            // Orphans from this moment, before the stream's place is freed
            // below: a worker that reconnects at once and declares them
            // must find them here to keep them.
            if matches!(end, End::WorkerGone) && self.config.disconnect_grace > Duration::ZERO {
                reg.orphans.extend(split.1.keys().copied());
            }
            split
        };
        // The stream's place (--max-waiters, --max-streams-per-token) is
        // free now, not after the disconnect grace below: the worker that
        // reconnects within it to keep its leases must find room.
        drop(permit);
        match end {
            End::WorkerGone if !held.is_empty() => {
                self.give_back(never_sent).await;
                self.reclaim_orphans(sent).await;
            }
            End::WorkerGone => debug!("lease stream closed by the worker"),
            End::Shutdown => {
                let _ = tx.try_send(Outgoing {
                    lease: None,
                    epoch: 0,
                    item: Err(tonic::Status::unavailable(
                        "the server is shutting down; reconnect to another or retry",
                    )),
                });
                debug!(
                    held = held.len(),
                    given_back = never_sent.len(),
                    "lease stream ended by shutdown; leases kept"
                );
                self.give_back(never_sent).await;
            }
            End::Unregistered => {
                let _ = tx.try_send(Outgoing {
                    lease: None,
                    epoch: 0,
                    item: Err(tonic::Status::unavailable(STALE_SERVER)),
                });
                info!(
                    held = sent.len(),
                    "lease stream ended: this server's heartbeat is stale; leases kept for the worker to declare elsewhere"
                );
                self.give_back(never_sent).await;
            }
            End::StoreFailed => {
                // If the store cannot take the give-back either, the job's
                // expiry returns it, spending an attempt.
                warn!(
                    held = sent.len(),
                    "lease stream ended by a store failure; leases kept"
                );
                self.give_back(never_sent).await;
            }
        }
    }

    /// `reason` with the operator's words: "revoked (cancelled: <why>)",
    /// from the error of the attempt the lease ran; `reason` alone if it
    /// cannot be read within [`CANCEL_REASON_WAIT`].
    async fn cancel_reason(&self, job: JobId, lease: LeaseId, reason: &str) -> String {
        // Bounded: the stream does nothing else meanwhile.
        let peek = tokio::time::timeout(CANCEL_REASON_WAIT, self.store.peek(job)).await;
        let why = match peek {
            Ok(Ok(Job { history, .. })) => history
                .into_iter()
                .find(|a| a.lease_id == lease)
                .and_then(|a| a.error),
            _ => None,
        };
        match why {
            Some(why) => format!("{reason} ({why})"),
            None => reason.to_owned(),
        }
    }

    /// Gives back jobs that never left the server: no attempt is spent.
    async fn give_back(&self, leases: HashMap<LeaseId, JobId>) {
        for (lease, job) in leases {
            match self.store.give_back(job, lease, SystemTime::now()).await {
                Ok(_) => debug!(job.id = %job, "given back: the worker left before it was sent"),
                Err(err) if err.code() != tonic::Code::Internal => {
                    debug!(job.id = %job, cause = %err, "nothing to give back")
                }
                Err(err) => {
                    warn!(job.id = %job, cause = %err, "give-back failed; the lease will expire")
                }
            }
        }
    }

    /// Reclaims the leases of a stream whose worker went away, after the
    /// disconnect grace, except those a heartbeat adopted meanwhile.
    async fn reclaim_orphans(&self, held: HashMap<LeaseId, JobId>) {
        if held.is_empty() {
            return;
        }
        let grace = self.config.disconnect_grace;
        let mut held: Vec<(LeaseId, JobId)> = held.into_iter().collect();
        if grace > Duration::ZERO {
            // Registered as orphans by the stream's end, before its place
            // was freed (see `run_stream`).
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(grace) => {}
            }
            let mut reg = self.registry();
            held.retain(|(lease, _)| reg.orphans.remove(lease));
        }
        for (lease, job) in held {
            match self
                .store
                .reclaim(job, lease, Outcome::WorkerDisconnected, SystemTime::now())
                .await
            {
                Ok(after) => {
                    info!(job.id = %job, queue = %after.queue, kind = %after.kind, attempts = after.attempts, status = %after.status, "reclaimed: worker disconnected")
                }
                // Acked, failed or expired meanwhile, or adopted by another
                // server's stream: nothing to take back.
                Err(err) if err.code() != tonic::Code::Internal => {
                    info!(job.id = %job, cause = %err, "not reclaimed: the lease is no longer this stream's")
                }
                Err(err) => {
                    warn!(job.id = %job, cause = %err, "reclaim after disconnect failed; the lease will expire")
                }
            }
        }
    }
}

/// Runs [`LeaseHub::reconcile`] over every held lease whenever the store
/// says lease-ended events may have been missed, until `shutdown`.
pub async fn reconcile_on_resync<S: Store>(hub: Arc<LeaseHub<S>>, shutdown: CancellationToken) {
    let mut resyncs = hub.store.resyncs();
    resyncs.borrow_and_update();
    loop {
        tokio::select! {
            changed = resyncs.changed() => {
                if changed.is_err() {
                    return;
                }
                // A pass reads one job per held lease: a shutdown does
                // not wait for it.
                tokio::select! {
                    _ = hub.reconcile(None) => {}
                    () = shutdown.cancelled() => return,
                }
            }
            () = shutdown.cancelled() => return,
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
