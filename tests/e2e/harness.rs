//! Test servers and processes: a real `jobq serve` child process (for
//! crashes), an in-process server (for speed), and waiting on conditions.

use std::{
    future::Future,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

use jobq_client::Client;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

/// The `jobq` binary under test.
pub const JOBQ: &str = env!("CARGO_BIN_EXE_jobq");

/// A port free now on 127.0.0.1 (for a server that must come back on the
/// same address, or a helper process that takes a port flag).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Takes the next due job of `queue` and fails it for good: a dead letter.
pub async fn dead_letter(client: &Client, queue: &str) -> jobq::pb::Job {
    let leased = client
        .dequeue([queue], "test", None, None)
        .await
        .expect("dequeue")
        .expect("a job is due");
    let job = leased.job.expect("job");
    client
        .fail(
            &job.id,
            &leased.lease_id,
            "broken",
            jobq_client::FailOptions::fatal(),
        )
        .await
        .expect("fail")
}

/// Runs `jobq serve --listen 127.0.0.1:0 --http-listen off --data DATA
/// EXTRA...` to its end, for a start that is refused: its exit status and
/// output.
pub fn serve_refused(data: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(JOBQ)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "off",
            "--data",
        ])
        .arg(data)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("run jobq serve")
}

/// Polls `cond` every 10 ms until it returns `Some`, failing the test after
/// `limit`. Waits on a condition, never on a fixed sleep.
pub async fn until<T, F, Fut>(limit: Duration, what: &str, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let poll = async {
        loop {
            if let Some(v) = cond().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(limit, poll)
        .await
        .unwrap_or_else(|_| panic!("timed out after {limit:?} waiting for {what}"))
}

/// A `jobq serve` child process on 127.0.0.1:0. Killed on drop.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
    /// The HTTP listener (`/metrics`, dashboard).
    pub http: SocketAddr,
    /// Every line the server logged so far.
    log: Arc<Mutex<Vec<String>>>,
}

impl ServerProcess {
    /// Starts `jobq serve --data DATA --listen 127.0.0.1:0 EXTRA...` and
    /// waits for its "jobq serving" log line to learn the port.
    pub fn start(data: &Path, extra: &[&str]) -> ServerProcess {
        ServerProcess::start_at(data, "127.0.0.1:0", extra)
    }

    /// Like [`start`](Self::start) on a given address (to restart a server
    /// where its clients will reconnect).
    pub fn start_at(data: &Path, listen: &str, extra: &[&str]) -> ServerProcess {
        ServerProcess::start_with(data, listen, extra, |_| {})
    }

    /// Like [`start_at`](Self::start_at), with `tweak` applied to the
    /// command first (e.g. a `pre_exec` that lowers a resource limit).
    pub fn start_with(
        data: &Path,
        listen: &str,
        extra: &[&str],
        tweak: impl FnOnce(&mut Command),
    ) -> ServerProcess {
        let mut command = Command::new(JOBQ);
        tweak(&mut command);
        let mut child = command
            .arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--data")
            .arg(data)
            .arg("--http-listen")
            .arg("127.0.0.1:0")
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("JOBQ_LISTEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn jobq serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            let (mut addr, mut http) = (None, None);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                // The two listeners log from different tasks, in either
                // order: report once both are known.
                if let Some(found) = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("http="))
                {
                    http = found.parse::<SocketAddr>().ok();
                }
                if let Some(found) = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("addr="))
                {
                    addr = found.parse::<SocketAddr>().ok();
                }
                if let (Some(addr), Some(http)) = (addr, http) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send((addr, Some(http)));
                    }
                }
                // Keep draining so the server never blocks on a full pipe;
                // echo for failing tests' output.
                eprintln!("[jobq serve] {line}");
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let (addr, http) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("jobq serve did not report its address");
        let http = http.expect("jobq serve did not report its HTTP address");
        ServerProcess {
            child,
            addr,
            http,
            log,
        }
    }

    /// Whether the server has logged a line containing `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|line| line.contains(needle))
    }

    /// The first line the server logged containing `needle`, if any.
    pub fn first_logged(&self, needle: &str) -> Option<String> {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|line| line.contains(needle))
            .cloned()
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A connected client.
    pub async fn client(&self) -> Client {
        Client::connect(self.url()).await.expect("connect")
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        signal(&self.child, libc::SIGTERM);
        self.child.wait().expect("wait")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `sig` to a child process.
pub fn signal(child: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on a pid we spawned and have not reaped.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// An in-process server on 127.0.0.1:0 over a temporary sled; stopped and
/// awaited on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    task: Option<JoinHandle<jobq_server::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

impl TestServer {
    /// A server with default settings except millisecond-friendly leases.
    pub async fn start() -> TestServer {
        TestServer::with(|_| {}).await
    }

    /// A server whose config `tweak` adjusts.
    pub async fn with(tweak: impl FnOnce(&mut jobq_server::Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = jobq_server::Config::with_data(dir.path().join("data"));
        config.min_lease = Duration::from_millis(10);
        tweak(&mut config);
        TestServer::on(config, Some(dir)).await
    }

    /// A server over an existing data folder (to restart on the same data).
    pub async fn at(data: &Path) -> TestServer {
        let mut config = jobq_server::Config::with_data(data);
        config.min_lease = Duration::from_millis(10);
        TestServer::on(config, None).await
    }

    async fn on(config: jobq_server::Config, dir: Option<tempfile::TempDir>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(jobq_server::serve(config, listener, shutdown.clone()));
        TestServer {
            addr,
            shutdown,
            task: Some(task),
            _dir: dir,
        }
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A connected client.
    pub async fn client(&self) -> Client {
        Client::connect(self.url()).await.expect("connect")
    }

    /// Fires shutdown and waits for the server to finish.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server result");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A plain HTTP/1.1 GET (the dashboard and `/metrics` speak HTTP/1.1):
/// the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, _head, body) = http(addr, "GET", path, &[], "").await;
    (status, body)
}

/// One HTTP/1.1 request: (status, head, body).
pub async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    // The address it went to, unless the test names another.
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    conn.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, head.to_owned(), body.to_owned())
}
