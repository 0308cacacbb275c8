//! Connections that send nothing, too many
//! connections, running out of file descriptors, and a shutdown that must
//! not wait on peers that are idle or do not read.

use std::time::{Duration, Instant};

use jobq_client::{Client, EnqueueOptions};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::harness::{until, ServerProcess, TestServer};

/// Reads until the server closes the connection (EOF or reset), failing
/// the test after `limit`.
async fn closed_within(conn: &mut TcpStream, limit: Duration) {
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, read_all)
        .await
        .expect("the server closes the connection");
}

/// The HTTP/2 client preface and an empty SETTINGS frame: a connection
/// that has said hello and then goes quiet.
const H2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Regression: a TCP connection that sends nothing stayed open
/// forever.
#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let server = TestServer::with(|c| c.handshake_timeout = Duration::from_secs(1)).await;
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    let started = Instant::now();
    closed_within(&mut silent, Duration::from_secs(15)).await;
    assert!(started.elapsed() >= Duration::from_millis(900));
    // Clients that speak are served as before.
    let c = server.client().await;
    c.stats(None).await.expect("stats");
}

/// Regression: a connection with no call in flight is closed after
/// `--idle-timeout`, even when it completed its handshake.
#[tokio::test]
async fn an_idle_connection_is_closed() {
    let server = TestServer::with(|c| {
        c.handshake_timeout = Duration::from_secs(60);
        c.idle_timeout = Duration::from_secs(1);
    })
    .await;
    // A Lease stream is a call in flight: its connection is not idle.
    let c = server.client().await;
    let mut stream = c
        .lease(["q"], "w1", 1, Some(Duration::from_secs(60)))
        .await
        .expect("lease");
    let mut idle = TcpStream::connect(server.addr).await.expect("connect");
    idle.write_all(H2_HELLO).await.expect("hello");
    closed_within(&mut idle, Duration::from_secs(15)).await;
    // The idle timeout has passed for the stream's connection too (it was
    // opened first), and it still delivers.
    c.enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect("enqueue");
    let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event")
        .expect("the stream is still open")
        .expect("an event, not the end");
    assert!(event.event.is_some());
}

/// Regression: over `--max-connections`, a connection is closed at
/// once, with a log line; once one closes, new clients get in again.
#[tokio::test]
async fn connections_over_the_limit_are_closed_with_a_log_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(
        dir.path(),
        &[
            "--max-connections",
            "2",
            "--max-connections-per-peer",
            "2",
            "--handshake-timeout",
            "60s",
        ],
    );
    let first = TcpStream::connect(server.addr).await.expect("connect");
    let mut second = TcpStream::connect(server.addr).await.expect("connect");
    second.write_all(H2_HELLO).await.expect("hello");
    let mut third = TcpStream::connect(server.addr).await.expect("connect");
    closed_within(&mut third, Duration::from_secs(10)).await;
    until(
        Duration::from_secs(10),
        "the refusal to be logged",
        || async { server.logged("--max-connections reached").then_some(()) },
    )
    .await;
    drop(first);
    // The slot frees when the server sees the close.
    until(
        Duration::from_secs(15),
        "a client to get in again",
        || async {
            let c = Client::connect(server.url()).await.ok()?;
            c.stats(None).await.ok()
        },
    )
    .await;
}

/// utime + stime of a process, in clock ticks (/proc/PID/stat).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .expect("fields")
        .split_whitespace()
        .collect();
    // After the command name: state is field 3, utime 14 and stime 15.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Regression: at the fd limit (EMFILE) the server spun at 100 % CPU,
/// answered nobody and logged nothing. Now it backs off and logs, and
/// serves again once fds are free.
#[tokio::test]
async fn out_of_file_descriptors_the_server_backs_off_and_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The server settles its connection caps under its fd limit at start
    // (fds.rs), so a cap over the limit is refused. Here it starts with
    // its usual limit and caps, and the limit is lowered afterwards, as
    // if something else had taken the fds: the caps no longer protect it.
    let server = ServerProcess::start(dir.path(), &["--handshake-timeout", "120s"]);
    let pid = server.child.id();
    let nofile: libc::rlim_t = 96;
    let limit = libc::rlimit {
        rlim_cur: nofile,
        rlim_max: nofile,
    };
    // SAFETY: prlimit on our own child; it reads `limit` and writes nothing.
    let rc = unsafe {
        libc::prlimit(
            libc::pid_t::try_from(pid).expect("pid"),
            libc::RLIMIT_NOFILE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    let c = server.client().await;
    c.enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect("enqueue");
    let mut conns = Vec::new();
    for _ in 0..(nofile as usize + 20) {
        conns.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    until(
        Duration::from_secs(20),
        "the server to run out of fds",
        || async { server.logged("out of file descriptors").then_some(()) },
    )
    .await;
    assert!(
        open_fds(pid) >= nofile as usize - 2,
        "{} fds",
        open_fds(pid)
    );
    // Out of fds, it waits instead of spinning.
    let (ticks, started) = (cpu_ticks(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_ticks(pid) - ticks;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let wall = started.elapsed().as_secs_f64();
    let busy = used as f64 / hz as f64 / wall;
    assert!(
        busy < 0.25,
        "the server used {:.0} % CPU while out of fds",
        busy * 100.0
    );
    // Once fds are free, it serves again.
    drop(conns);
    until(
        Duration::from_secs(30),
        "the server to serve again",
        || async {
            let c = Client::connect(server.url()).await.ok()?;
            c.stats(Some("q")).await.ok()
        },
    )
    .await;
}

/// Regression: SIGTERM waited the whole `--shutdown-timeout` (10 s)
/// for one idle connection or one Lease stream whose client did not read.
#[tokio::test]
async fn sigterm_does_not_wait_for_idle_or_non_reading_peers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(dir.path(), &["--handshake-timeout", "60s"]);
    let c = server.client().await;
    c.enqueue("q", "k", vec![b'x'; 256 * 1024], EnqueueOptions::new())
        .await
        .expect("enqueue");
    // A worker whose stream window is tiny and that never reads: the
    // server cannot finish sending it the job, let alone the stream's end.
    let channel = tonic::transport::Endpoint::from_shared(server.url())
        .expect("url")
        .initial_stream_window_size(1024)
        .initial_connection_window_size(1024)
        .connect()
        .await
        .expect("connect");
    let stuck = Client::from_channel(channel);
    let _stream = stuck
        .lease(["q"], "w1", 1, Some(Duration::from_secs(60)))
        .await
        .expect("lease");
    until(Duration::from_secs(10), "the job to be taken", || async {
        let stats = c.stats(Some("q")).await.ok()?;
        (stats.first()?.running == 1).then_some(())
    })
    .await;
    // An idle connection, and one that said hello and nothing more; each
    // is accepted once the server sends its HTTP/2 SETTINGS.
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    let mut hello = TcpStream::connect(server.addr).await.expect("connect");
    hello.write_all(H2_HELLO).await.expect("hello");
    for conn in [&mut silent, &mut hello] {
        let mut first = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut first))
            .await
            .expect("the server speaks first");
        assert_eq!(read.expect("read"), 1, "accepted, not closed");
    }

    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("join");
    let took = started.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took < Duration::from_secs(5),
        "SIGTERM took {took:?} (the shutdown timeout is 10 s)"
    );
}

/// `Connect::timeout` bounds every unary call, on the client and (by the
/// `grpc-timeout` header) on the server: an Enqueue stuck behind a disk
/// that takes 60 s to sync fails DEADLINE_EXCEEDED in about the timeout.
/// A Lease stream opened by the same client outlives it.
#[tokio::test]
async fn a_client_timeout_bounds_unary_calls_but_not_lease_streams() {
    let dir = tempfile::tempdir().unwrap();
    let slow = ServerProcess::start(&dir.path().join("slow"), &["--fault-sync-delay", "60s"]);
    let bounded = Client::builder(slow.url())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    let started = std::time::Instant::now();
    let err = bounded
        .enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect_err("the sync takes 60 s");
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let server = TestServer::start().await;
    let bounded = Client::builder(server.url())
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    // A Dequeue's wait comes on top of the timeout: an empty long-poll
    // answers None.
    let none = bounded
        .dequeue(["empty"], "w", None, Some(Duration::from_millis(600)))
        .await
        .expect("a long-poll longer than the timeout");
    assert!(none.is_none(), "{none:?}");
    let mut stream = bounded
        .lease(["q"], "w", 1, Some(Duration::from_secs(30)))
        .await
        .expect("lease");
    // Well past the timeout, the stream still delivers.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (job, _) = bounded
        .enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect("a quick enqueue is within the timeout");
    let event = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("an event within 30 s")
        .expect("the stream is still open")
        .expect("an event");
    let Some(jobq::pb::lease_event::Event::Leased(leased)) = event.event else {
        panic!("expected a leased job, got {event:?}");
    };
    assert_eq!(leased.job.expect("job").id, job.id);
}
