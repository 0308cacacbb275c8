//! A real server on 127.0.0.1:0 with a tokens file, and request helpers
//! (shared by the auth and limits tests).
#![allow(dead_code)]

use std::{net::SocketAddr, path::Path, time::Duration};

use jobq::pb::job_queue_client::JobQueueClient;
use jobq_server::{auth::digest_hex, Config};
use tempfile::TempDir;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{transport::Channel, Code, Request, Status};

pub type Cli = JobQueueClient<Channel>;

/// The tokens: one per role on `in.*`, a second consumer, and `root` (admin
/// on everything) to set up jobs.
pub const TOKENS: &[(&str, &str, &str)] = &[
    ("producer", "produce", "in.*"),
    ("consumer", "consume", "in.*"),
    ("consumer2", "consume", "in.*"),
    ("reader", "read", "in.*"),
    ("admin", "admin", "in.*"),
    ("root", "admin", "*"),
];

pub fn secret(name: &str) -> String {
    format!("secret-of-{name}-0123456789abcdef")
}

fn tokens_file(dir: &Path) -> std::path::PathBuf {
    let mut text = String::new();
    for (name, role, queues) in TOKENS {
        text.push_str(&format!(
            "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nqueues = [\"{queues}\"]\nroles = [\"{role}\"]\n\n",
            digest_hex(&secret(name))
        ));
    }
    let path = dir.join("tokens.toml");
    std::fs::write(&path, text).unwrap();
    path
}

pub struct TestServer {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::with(|_| {}).await
    }

    pub async fn with(tweak: impl FnOnce(&mut Config)) -> TestServer {
        let dir = TempDir::new().unwrap();
        let mut config = Config::with_data(dir.path().join("data"));
        config.auth_tokens = Some(tokens_file(dir.path()));
        config.min_lease = Duration::from_millis(10);
        tweak(&mut config);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                jobq_server::serve(config, listener, shutdown)
                    .await
                    .unwrap()
            }
        });
        TestServer {
            addr,
            shutdown,
            task: Some(task),
            _dir: dir,
        }
    }

    pub async fn client(&self) -> Cli {
        let url = format!("http://{}", self.addr);
        for _ in 0..200 {
            if let Ok(c) = JobQueueClient::connect(url.clone()).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("server did not come up");
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

/// A request as `token` (None: no header).
pub fn req<T>(msg: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", secret(t)).parse().unwrap(),
        );
    }
    r
}

pub fn code<T>(r: Result<T, Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}
