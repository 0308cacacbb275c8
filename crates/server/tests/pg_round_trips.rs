//! How many statements and round trips an enqueue, a stream's take and an
//! ack cost on PostgreSQL, counted on the wire (not timed), so the hot
//! paths cannot grow back unnoticed (docs/src/internals/postgres.md, "Round
//! trips"). The store talks to the database through a proxy that reads the
//! frontend protocol of its pooled sessions: each simple query (`Q`) and
//! each `Sync` (the end of one extended-protocol statement, a prepare
//! included) is a statement; a message sent while no reply is outstanding
//! starts a round trip. Needs `JOBQ_TEST_PG` (see `scripts/pg-test.sh`).

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use jobq_server::store::{
    postgres::{testing, PgStore},
    Store,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// What the proxy counted over every pooled session.
#[derive(Default)]
struct Counts {
    statements: AtomicU64,
    round_trips: AtomicU64,
}

impl Counts {
    fn take(&self) -> (u64, u64) {
        (
            self.statements.swap(0, Ordering::SeqCst),
            self.round_trips.swap(0, Ordering::SeqCst),
        )
    }
}

/// Forwards one session, counting its frontend messages when it is a
/// pooled one (`application_name` `jobq <id> pool`).
async fn session(client: TcpStream, upstream: String, counts: Arc<Counts>) {
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // Statements sent and not yet answered by ReadyForQuery: the startup
    // message is answered by one too.
    let outstanding = Arc::new(AtomicI64::new(1));
    let pooled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (out, ours) = (Arc::clone(&outstanding), Arc::clone(&pooled));
    let backward = tokio::spawn(async move {
        // Server to client: count ReadyForQuery ('Z') messages.
        let mut parser = Parser::new(true);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for (tag, _) in parser.feed(&buf[..n]) {
                if tag == b'Z' {
                    out.fetch_sub(1, Ordering::SeqCst);
                }
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let mut parser = Parser::new(false);
    let mut buf = vec![0u8; 64 * 1024];
    // The statements of the counts' fold (a background task on a pooled
    // session, every 200 ms): not part of any operation counted here.
    let mut background: HashSet<Vec<u8>> = HashSet::new();
    let mut skip_sync = false;
    loop {
        let n = match cr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if parser.startup.is_none() {
            let seen = &buf[..n];
            let text = String::from_utf8_lossy(seen);
            if text.contains("application_name") && text.contains(" pool") {
                ours.store(true, Ordering::SeqCst);
            }
        }
        for (tag, body) in parser.feed(&buf[..n]) {
            let name = |at: usize| body.split(|&b| b == 0).nth(at).unwrap_or(&[]).to_vec();
            if tag == b'P' && String::from_utf8_lossy(&body).contains("jobq_count_deltas") {
                background.insert(name(0));
            }
            if tag == b'B' && background.contains(&name(1)) {
                skip_sync = true;
            }
            if tag == b'Q' || tag == b'S' {
                let skip = std::mem::take(&mut skip_sync);
                if ours.load(Ordering::SeqCst) && !skip {
                    counts.statements.fetch_add(1, Ordering::SeqCst);
                    if outstanding.load(Ordering::SeqCst) <= 0 {
                        counts.round_trips.fetch_add(1, Ordering::SeqCst);
                    }
                }
                outstanding.fetch_add(1, Ordering::SeqCst);
            }
        }
        if sw.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    backward.abort();
}

/// Splits a byte stream into protocol messages (a type byte and a length),
/// the client's untyped startup message first.
struct Parser {
    buf: Vec<u8>,
    /// Whether the startup message was seen (client side only).
    startup: Option<()>,
}

impl Parser {
    fn new(server_side: bool) -> Parser {
        Parser {
            buf: Vec::new(),
            startup: server_side.then_some(()),
        }
    }

    /// The type bytes and bodies of the whole messages completed by
    /// `bytes`.
    fn feed(&mut self, bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        self.buf.extend_from_slice(bytes);
        let mut tags = Vec::new();
        loop {
            if self.startup.is_none() {
                if self.buf.len() < 8 {
                    break;
                }
                let len = u32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
                let code = u32::from_be_bytes(self.buf[4..8].try_into().unwrap());
                if self.buf.len() < len {
                    break;
                }
                self.buf.drain(..len);
                // An SSL or GSS request is answered by one byte and
                // followed by the real startup message.
                if code != 80_877_103 && code != 80_877_104 {
                    self.startup = Some(());
                }
                continue;
            }
            if self.buf.len() < 5 {
                break;
            }
            let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
            if self.buf.len() < len + 1 {
                break;
            }
            tags.push((self.buf[0], self.buf[5..=len].to_vec()));
            self.buf.drain(..=len);
        }
        tags
    }
}

/// A proxy in front of `url`'s server; returns the URL through it.
async fn proxy(url: &str, counts: Arc<Counts>) -> String {
    let config: tokio_postgres::Config = url.parse().expect("test URL");
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let upstream = format!("{host}:{port}");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let local = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(session(client, upstream.clone(), Arc::clone(&counts)));
        }
    });
    url.replacen(&format!("{host}:{port}"), &local.to_string(), 1)
}

/// The fewest (statements, round trips) of five runs of `op`, after one
/// run that warms the statement caches.
async fn counted<F, Fut>(counts: &Counts, mut op: F) -> (u64, u64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    op().await;
    let mut best = (u64::MAX, u64::MAX);
    for _ in 0..5 {
        counts.take();
        op().await;
        let got = counts.take();
        best = (best.0.min(got.0), best.1.min(got.1));
    }
    best
}

// One thread: a pipelined statement's messages then reach the wire together
// (the connection's task runs once the caller has queued them all), so the
// count does not depend on how two threads happened to interleave.
#[tokio::test(flavor = "current_thread")]
async fn enqueue_take_and_ack_cost_a_fixed_few_round_trips() {
    let url = testing::fresh_database("jobq_round_trips").await;
    let counts = Arc::new(Counts::default());
    let through = proxy(&url, Arc::clone(&counts)).await;
    let store: Arc<PgStore> = Arc::new(testing::store(testing::options(&through)).await);
    // Let the LISTEN session and the first heartbeat settle.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queues = vec!["q".to_owned()];
    let lease = Duration::from_secs(60);

    let enqueue = counted(&counts, || {
        let store = Arc::clone(&store);
        async move {
            store
                .enqueue(testing::job("q"), SystemTime::now())
                .await
                .expect("enqueue");
        }
    })
    .await;

    let keys = Arc::new(AtomicU64::new(0));
    let keyed = counted(&counts, || {
        let (store, keys) = (Arc::clone(&store), Arc::clone(&keys));
        async move {
            let mut job = testing::job("keyed");
            job.key = Some(format!("k{}", keys.fetch_add(1, Ordering::SeqCst)));
            store
                .enqueue(job, SystemTime::now())
                .await
                .expect("keyed enqueue");
        }
    })
    .await;

    let leases = Arc::new(std::sync::Mutex::new(Vec::new()));
    let take = counted(&counts, || {
        let (store, queues, leases) = (Arc::clone(&store), queues.clone(), Arc::clone(&leases));
        async move {
            let leased = store
                .take_streamed(&queues, "w", None, lease, SystemTime::now())
                .await
                .expect("take")
                .expect("a due job");
            leases
                .lock()
                .unwrap()
                .push((leased.job.id, leased.lease_id));
        }
    })
    .await;

    let ack = counted(&counts, || {
        let (store, leases) = (Arc::clone(&store), Arc::clone(&leases));
        async move {
            let (id, lease) = leases.lock().unwrap().pop().expect("a lease to ack");
            store.ack(id, lease, SystemTime::now()).await.expect("ack");
        }
    })
    .await;

    // (statements, round trips). The enqueue: the ids and BEGIN, then the
    // insert and COMMIT. The take: BEGIN, its checks (the queues' pauses
    // and policies among them) and the dequeue; the history; the update
    // and the attempt; COMMIT. The ack: BEGIN, the
    // clock and the locked row; the history; the update and the attempt;
    // COMMIT.
    assert_eq!(enqueue, (4, 2), "enqueue (statements, round trips)");
    // With a key, the COMMIT waits for the insert's reply (a key already
    // held is read before the commit).
    assert_eq!(keyed, (4, 3), "keyed enqueue (statements, round trips)");
    assert_eq!(take, (12, 4), "stream take (statements, round trips)");
    assert_eq!(ack, (7, 4), "ack (statements, round trips)");
}
