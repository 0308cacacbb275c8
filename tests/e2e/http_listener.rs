//! The HTTP listener (`--http-listen`) under strangers: more idle
//! connections than its cap must not take the file descriptors the store
//! needs, connections that send nothing or trickle a request head are
//! closed, idle kept-alive ones too, and `/metrics` reuses its counts.

use std::{
    os::unix::process::CommandExt,
    time::{Duration, Instant},
};

use jobq_client::EnqueueOptions;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::harness::{http_get, serve_refused, until, ServerProcess};

/// Reads until the server closes the connection (EOF or reset), failing
/// the test after `limit`; returns what was read.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let read_all = async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read_all)
        .await
        .expect("the server closes the connection");
    got
}

/// Whether the server has closed `conn` (EOF or reset), without waiting.
fn closed_now(conn: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match conn.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// About a thousand idle connections to the HTTP port used to take every
/// file descriptor, and the store's next flush failed: the server
/// fail-stopped ("cannot list sled's blobs: Too many open files"). With a
/// low fd limit, more idle HTTP connections than the limit itself: the
/// ones over `--http-max-connections` are closed at once, and the store
/// and gRPC go on.
#[tokio::test]
async fn idle_http_connections_over_the_cap_leave_the_store_its_fds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nofile: libc::rlim_t = 256;
    let cap = 16;
    let mut server = ServerProcess::start_with(
        dir.path(),
        "127.0.0.1:0",
        &[
            "--http-max-connections",
            "16",
            "--http-header-timeout",
            "120s",
            "--http-idle-timeout",
            "120s",
        ],
        move |cmd| {
            // SAFETY: setrlimit is async-signal-safe; it only lowers the
            // child's own limits (soft and hard), between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: nofile,
                        rlim_max: nofile,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        },
    );
    let pid = server.child.id();
    let c = server.client().await;
    let (first, _) = c
        .enqueue("q", "k1", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect("enqueue");

    let flood = nofile as usize + 44;
    let mut conns = Vec::with_capacity(flood);
    for _ in 0..flood {
        conns.push(TcpStream::connect(server.http).await.expect("connect"));
    }
    // The server has dealt with every one of them: all but the cap are
    // closed (or, without a cap, it ran into its fd limit).
    until(
        Duration::from_secs(30),
        "the connections over the cap to be closed",
        || async {
            let refused = conns.iter().filter(|c| closed_now(c)).count();
            (refused == flood - cap || open_fds(pid) + 4 >= nofile as usize).then_some(())
        },
    )
    .await;

    // The store can still flush: an enqueue is durable, the server alive.
    let (second, _) = c
        .enqueue("q", "k2", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect("an enqueue while the HTTP connections are held");
    assert!(
        server.child.try_wait().expect("wait").is_none(),
        "the server exited"
    );
    assert!(!server.logged("fail-stop"), "the store fail-stopped");
    for id in [&first.id, &second.id] {
        c.get_job(id.clone()).await.expect("get");
    }
    let stats = c.stats(Some("q")).await.expect("stats");
    assert_eq!(stats.first().map(|s| s.pending), Some(2));
    // A new gRPC connection gets in too.
    let fresh = server.client().await;
    fresh.stats(None).await.expect("stats on a new connection");
    assert!(
        server.logged("--http-max-connections reached"),
        "the refusals are logged"
    );

    // Once the idle ones go, HTTP serves again.
    drop(conns);
    until(
        Duration::from_secs(30),
        "/metrics to answer again",
        || async {
            let (status, body) =
                tokio::time::timeout(Duration::from_secs(5), http_get(server.http, "/metrics"))
                    .await
                    .ok()?;
            (status == 200 && body.contains("jobq_")).then_some(())
        },
    )
    .await;
}

/// A connection that sends nothing, and one that sends half a request
/// head and stops, are closed after `--http-header-timeout`, well before
/// the idle timeout; one that trickles a head a byte at a time too.
#[tokio::test]
async fn http_connections_that_send_nothing_or_a_slow_head_are_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(
        dir.path(),
        &["--http-header-timeout", "1s", "--http-idle-timeout", "120s"],
    );
    let started = Instant::now();
    let mut silent = TcpStream::connect(server.http).await.expect("connect");
    let mut half = TcpStream::connect(server.http).await.expect("connect");
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("half a head");
    closed_within(&mut silent, Duration::from_secs(20)).await;
    closed_within(&mut half, Duration::from_secs(20)).await;
    assert!(started.elapsed() >= Duration::from_millis(900));

    // A byte every 100 ms: the connection is never silent, its head never
    // ends.
    let trickle = TcpStream::connect(server.http).await.expect("connect");
    let (mut reader, mut writer) = trickle.into_split();
    let started = Instant::now();
    let feeder = tokio::spawn(async move {
        writer.write_all(b"GET / HTTP/1.1\r\n").await.ok()?;
        let mut every = tokio::time::interval(Duration::from_millis(100));
        loop {
            every.tick().await;
            writer.write_all(b"X").await.ok()?;
        }
        #[allow(unreachable_code)]
        Some(())
    });
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    feeder.abort();
    assert!(closed.is_ok(), "a trickled head is closed");
    assert!(started.elapsed() >= Duration::from_millis(900));

    // Whole requests are served as before.
    let (status, _) = http_get(server.http, "/metrics").await;
    assert_eq!(status, 200);
}

/// A request whose body never finishes is answered 503 after
/// `--http-request-timeout`, and its connection closed.
#[tokio::test]
async fn a_request_body_that_never_ends_is_cut_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(
        dir.path(),
        &[
            "--http-request-timeout",
            "1s",
            "--http-idle-timeout",
            "120s",
        ],
    );
    let mut conn = TcpStream::connect(server.http).await.expect("connect");
    let head = format!(
        "POST /login HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=",
        server.http
    );
    conn.write_all(head.as_bytes()).await.expect("send");
    let started = Instant::now();
    let got = closed_within(&mut conn, Duration::from_secs(20)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("--http-request-timeout"), "{text}");
    assert!(started.elapsed() >= Duration::from_millis(900));
}

/// A kept-alive connection with no request in flight is closed after
/// `--http-idle-timeout`, not the (shorter) header timeout; a request on
/// it before then is served.
#[tokio::test]
async fn an_idle_kept_alive_http_connection_is_closed_after_the_idle_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(
        dir.path(),
        &["--http-header-timeout", "1s", "--http-idle-timeout", "3s"],
    );
    let mut conn = TcpStream::connect(server.http).await.expect("connect");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {}\r\n\r\n", server.http);
    conn.write_all(request.as_bytes()).await.expect("send");
    // Read the whole response (it is kept alive: no EOF after it).
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let answered = loop {
        let n = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf))
            .await
            .expect("a response")
            .expect("read");
        assert!(n > 0, "closed before the response ended");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .expect("a content-length");
            if body.len() >= length {
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                break Instant::now();
            }
        }
    };
    closed_within(&mut conn, Duration::from_secs(20)).await;
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_millis(2500),
        "closed after {idle:?} idle: the header timeout (1 s), not the idle timeout (3 s)"
    );
}

/// `/metrics` reuses its counts for `--stats-cache`: within the period a
/// scrape shows the counts of the first, however many jobs came since.
#[tokio::test]
async fn metrics_reuse_their_counts_for_the_stats_cache_period() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cached = ServerProcess::start(&dir.path().join("a"), &["--stats-cache", "1h"]);
    let fresh = ServerProcess::start(&dir.path().join("b"), &["--stats-cache", "0s"]);
    let pending = |body: &str| {
        body.lines().any(|l| {
            l.starts_with("jobq_jobs{")
                && l.contains("queue=\"q\"")
                && l.contains("status=\"pending\"")
                && l.ends_with(" 1")
        })
    };
    for server in [&cached, &fresh] {
        let (status, body) = http_get(server.http, "/metrics").await;
        assert_eq!(status, 200);
        assert!(!pending(&body), "{body}");
        server
            .client()
            .await
            .enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
            .await
            .expect("enqueue");
    }
    let (_, body) = http_get(fresh.http, "/metrics").await;
    assert!(pending(&body), "counted again: {body}");
    let (_, body) = http_get(cached.http, "/metrics").await;
    assert!(!pending(&body), "reused: {body}");
}

/// Caps that would leave the store fewer descriptors than its reserve are
/// refused at start, naming the flags, before the store is opened.
#[test]
fn connection_caps_over_the_fd_limit_are_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let out = serve_refused(&data, &["--max-connections", "100000000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {stderr}");
    assert!(
        stderr.contains("--max-connections 100000000") && stderr.contains("--reserved-fds"),
        "{stderr}"
    );
    assert!(!data.exists(), "opened the data folder first: {stderr}");
}
