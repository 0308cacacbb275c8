//! LISTEN/NOTIFY: how one server hears of the others' changes.
//!
//! Two channels, both sent inside the transaction that made the change, so
//! PostgreSQL delivers them only once it commits:
//! - [`DUE`] (payload: the queue): a job was created or became PENDING
//!   (maybe with a delay); waiters and Lease streams re-check, and sleep
//!   until the next `run_at` if nothing is due yet.
//! - [`LEASE_ENDED`] (payload: see [`encode`]): a lease ended; the
//!   [`crate::leases::LeaseHub`] frees the slot of the stream that held it,
//!   on whichever server that stream is.
//!
//! One dedicated connection per server listens (a pooled one would be
//! recycled). If it breaks, the task reconnects with a backoff and then
//! wakes everything once, since notifications sent meanwhile are lost: the
//! waiters and the reaper re-check, and the lease hub checks every lease
//! its streams hold against the database (an ack or cancel made on another
//! server meanwhile would otherwise never free its slot).

use std::time::Duration;

use futures::StreamExt;
use tokio_postgres::{AsyncMessage, NoTls};
use tracing::{debug, warn};

use super::row::status_text;
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
        status_text(e.status),
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
    let status = match parts.next()? {
        "pending" => Status::Pending,
        "running" => Status::Running,
        "done" => Status::Done,
        "failed" => Status::Failed,
        _ => return None,
    };
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

/// Listens until aborted, passing the other servers' events to `remote`.
pub async fn run(config: tokio_postgres::Config, me: String, remote: Remote) {
    let mut first = true;
    loop {
        match listen_once(&config, &me, &remote, first).await {
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
