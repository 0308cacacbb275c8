//! LISTEN/NOTIFY: how one server hears of the others' changes.
//!
//! Two channels:
//! - [`DUE`] (payload: the queue): a job was created or became PENDING
//!   (maybe with a delay); waiters and Lease streams re-check, and sleep
//!   until the next `run_at` if nothing is due yet. Sent after the commit
//!   that made the job due (docs/src/design.md §5, notify after durable),
//!   by this task on its own connection, never inside the change's
//!   transaction: PostgreSQL holds a database-wide lock from the commit of
//!   a notifying transaction until its WAL flush ends, so transactions
//!   that notify commit one at a time, and every enqueue and every retry
//!   would queue behind the others' fsyncs. The queues handed over while a
//!   send is under way go together in the next one (one statement, in
//!   autocommit, `synchronous_commit = off`: a wake-up needs no flush).
//!   This server ignores its own (its waiters were woken locally).
//! - [`LEASE_ENDED`] (payload: see [`encode`]): a lease that another
//!   server's stream held ended; that server's [`crate::leases::LeaseHub`]
//!   frees the stream's slot. Sent inside the transaction that ended the
//!   lease, so it is delivered exactly when it commits.
//!
//! A wake-up sent after the commit is lost if this server dies between the
//! two: the other servers look again (every waiter of every queue) when
//! their heartbeat finds a server that went silent
//! ([`super::cluster::heartbeat`]).
//!
//! One dedicated connection per server listens (a pooled one would be
//! recycled). If it breaks, the task reconnects with a backoff and then
//! wakes everything once, since notifications sent meanwhile are lost: the
//! waiters and the reaper re-check, and the lease hub checks every lease
//! its streams hold against the database (an ack or cancel made on another
//! server meanwhile would otherwise never free its slot). Wake-ups not yet
//! sent when it broke are sent after it reconnects.

use std::{
    collections::BTreeSet,
    sync::atomic::{AtomicI32, Ordering},
    time::Duration,
};

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{AsyncMessage, NoTls};
use tracing::{debug, warn};

use crate::{
    job::{JobId, LeaseId, Outcome, Status},
    store::{LeaseEnded, Remote},
};

/// The channel of "a job may be due in this queue".
pub const DUE: &str = "jobq_due";
/// The channel of "a lease ended".
pub const LEASE_ENDED: &str = "jobq_lease_ended";

/// The wait before reconnecting after the listening connection broke.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(500);

/// The outcome word of a lease that moved to another server's stream.
const MOVED: &str = "moved";

fn outcome_word(outcome: Option<Outcome>) -> &'static str {
    outcome.map_or("none", Outcome::label)
}

/// The [`LEASE_ENDED`] payload: `server job lease outcome status queue`
/// (the queue last, as the only free text). A moved lease's outcome is
/// `moved`.
pub fn encode(server: &str, e: &LeaseEnded) -> String {
    format!(
        "{server} {} {} {} {} {}",
        e.job,
        e.lease,
        if e.moved {
            MOVED
        } else {
            outcome_word(e.outcome)
        },
        e.status.label(),
        e.queue
    )
}

/// Parses a [`LEASE_ENDED`] payload into (sending server, event).
pub fn decode(payload: &str) -> Option<(&str, LeaseEnded)> {
    let mut parts = payload.splitn(6, ' ');
    let server = parts.next()?;
    let job = JobId(parts.next()?.parse().ok()?);
    let lease = LeaseId(parts.next()?.parse().ok()?);
    let word = parts.next()?;
    let moved = word == MOVED;
    let outcome = match word {
        "none" | MOVED => None,
        word => Some(Outcome::from_label(word)?),
    };
    let status = Status::from_label(parts.next()?)?;
    let queue = parts.next()?.to_owned();
    Some((
        server,
        LeaseEnded {
            job,
            lease,
            queue,
            outcome,
            status,
            moved,
        },
    ))
}

/// What the store hands the notifier.
#[derive(Debug)]
pub enum Outgoing {
    /// A job of this queue became due, committed.
    Due(String),
    /// Answered once every wake-up handed over before it has been sent.
    Flush(oneshot::Sender<()>),
}

/// Where the store hands the notifier its wake-ups.
pub type Outbox = mpsc::UnboundedSender<Outgoing>;

/// The notifier's end of the [`Outbox`].
pub type Inbox = mpsc::UnboundedReceiver<Outgoing>;

/// What the notifier has yet to send or answer.
#[derive(Default)]
struct Unsent {
    queues: BTreeSet<String>,
    flushes: Vec<oneshot::Sender<()>>,
}

impl Unsent {
    fn add(&mut self, out: Outgoing) {
        match out {
            Outgoing::Due(queue) => {
                self.queues.insert(queue);
            }
            Outgoing::Flush(done) => self.flushes.push(done),
        }
    }
}

/// Listens until aborted, passing the other servers' events to `remote`,
/// and sends the wake-ups handed to `outbox` on a connection of its own
/// (`notify_config`).
pub async fn run(
    config: tokio_postgres::Config,
    notify_config: tokio_postgres::Config,
    me: String,
    remote: Remote,
    outbox: Inbox,
) {
    // The notifier's backend pid: its notifications are this server's own.
    let own = AtomicI32::new(0);
    tokio::join!(
        listen(&config, &me, &remote, &own),
        notify(&notify_config, outbox, &own)
    );
}

/// Sends the wake-ups handed over, reconnecting with a backoff, until the
/// store is gone.
async fn notify(config: &tokio_postgres::Config, mut outbox: Inbox, own: &AtomicI32) {
    let mut unsent = Unsent::default();
    loop {
        match notify_once(config, &mut outbox, own, &mut unsent).await {
            Ok(()) => return,
            Err(err) => warn!(cause = %err, "the notifying connection failed; reconnecting"),
        }
        tokio::time::sleep(RECONNECT_BACKOFF).await;
    }
}

async fn notify_once(
    config: &tokio_postgres::Config,
    outbox: &mut Inbox,
    own: &AtomicI32,
    unsent: &mut Unsent,
) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    let driver = tokio::spawn(connection);
    let _driver = AbortOnDrop(driver);
    client.batch_execute("SET synchronous_commit = off").await?;
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .try_get(0)?;
    own.store(pid, Ordering::Relaxed);
    let send = client
        .prepare("SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q")
        .await?;
    loop {
        while let Ok(out) = outbox.try_recv() {
            unsent.add(out);
        }
        if !unsent.queues.is_empty() {
            let queues: Vec<&String> = unsent.queues.iter().collect();
            client.execute(&send, &[&DUE, &queues]).await?;
            unsent.queues.clear();
        }
        for done in unsent.flushes.drain(..) {
            let _ = done.send(());
        }
        match outbox.recv().await {
            Some(out) => unsent.add(out),
            // The store is gone.
            None => return Ok(()),
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Listens, reconnecting with a backoff, until aborted.
async fn listen(config: &tokio_postgres::Config, me: &str, remote: &Remote, own: &AtomicI32) {
    let mut first = true;
    loop {
        match listen_once(config, me, remote, first, own).await {
            Ok(()) => warn!("the LISTEN connection closed; reconnecting"),
            Err(err) => warn!(cause = %err, "the LISTEN connection failed; reconnecting"),
        }
        first = false;
        tokio::time::sleep(RECONNECT_BACKOFF).await;
    }
}

async fn listen_once(
    config: &tokio_postgres::Config,
    me: &str,
    remote: &Remote,
    first: bool,
    own: &AtomicI32,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n).is_err() {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    client
        .batch_execute(&format!("LISTEN {DUE}; LISTEN {LEASE_ENDED}"))
        .await?;
    // What was notified before we listened is lost: waiters look again,
    // now that what is notified from here on is heard (the first time too:
    // a waiter may have looked before this connection listened).
    remote.due();
    if !first {
        remote.rearm();
        remote.resync();
    }
    debug!("listening for other servers' changes");
    while let Some(n) = rx.recv().await {
        match n.channel() {
            // This server's own wake-ups: its waiters were woken already.
            DUE if n.process_id() == own.load(Ordering::Relaxed) => {}
            DUE => remote.due_in(n.payload()),
            LEASE_ENDED => match decode(n.payload()) {
                Some((server, _)) if server == me => {}
                Some((_, ended)) => remote.lease_ended(&ended),
                None => warn!(payload = n.payload(), "unreadable lease-ended notification"),
            },
            _ => {}
        }
    }
    drop(client);
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ended_round_trips_with_spaces_in_the_queue() {
        let e = LeaseEnded {
            job: JobId(7),
            lease: LeaseId(u64::MAX),
            queue: "a queue".into(),
            outcome: Some(Outcome::WorkerDisconnected),
            status: Status::Pending,
            moved: false,
        };
        let payload = encode("srv-1", &e);
        assert_eq!(decode(&payload), Some(("srv-1", e)));
        let e = LeaseEnded {
            outcome: None,
            ..decode(&payload).unwrap().1
        };
        assert_eq!(decode(&encode("s", &e)).map(|d| d.1), Some(e.clone()));
        let e = LeaseEnded {
            moved: true,
            status: Status::Running,
            ..e
        };
        assert_eq!(decode(&encode("s", &e)).map(|d| d.1), Some(e));
    }
}
