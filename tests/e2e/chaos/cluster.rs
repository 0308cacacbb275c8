//! The fault suite's servers and the faults it injects into them.

#[allow(unused_imports)]
use super::*;

/// One of the three servers: it comes back on the same port after a kill.
pub(super) struct Slot {
    pub(super) port: u16,
    pub(super) data: PathBuf,
    pub(super) skewed: bool,
    pub(super) process: Option<ServerProcess>,
}

#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub(super) what: String,
    /// A server kill, freeze or exit: attempts spent meanwhile are
    /// explained by it.
    pub(super) server: bool,
    pub(super) from: u64,
    pub(super) to: u64,
}

pub(super) struct Cluster {
    pub(super) url: String,
    pub(super) db: tokio_postgres::Client,
    pub(super) slots: Vec<Slot>,
    pub(super) faults: Vec<Fault>,
    pub(super) dir: tempfile::TempDir,
}

pub(super) fn start_server(slot: &Slot, url: &str) -> ServerProcess {
    let timeout = humantime::format_duration(SERVER_TIMEOUT).to_string();
    let args = [
        "--store",
        url,
        "--server-timeout",
        &timeout,
        "--min-lease",
        "10ms",
    ];
    let listen = format!("127.0.0.1:{}", slot.port);
    let skewed = slot.skewed.then(libfaketime);
    tokio::task::block_in_place(|| {
        ServerProcess::start_with(&slot.data, &listen, &args, |c| {
            if let Some(lib) = skewed {
                c.env("LD_PRELOAD", lib)
                    .env("FAKETIME", format!("+{}s", AHEAD.as_secs()))
                    .env("DONT_FAKE_MONOTONIC", "1");
            }
        })
    })
}

/// The local TCP ports of `pid`'s sockets (its connections to PostgreSQL
/// among them), from /proc.
pub(super) fn local_ports(pid: u32) -> HashSet<i32> {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                {
                    inodes.insert(inode.to_owned());
                }
            }
        }
    }
    let mut ports = HashSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && inodes.contains(cols[9]) {
                if let Some(port) = cols[1].rsplit(':').next() {
                    if let Ok(port) = i32::from_str_radix(port, 16) {
                        ports.insert(port);
                    }
                }
            }
        }
    }
    ports
}

impl Cluster {
    pub(super) async fn start(dir: tempfile::TempDir) -> Cluster {
        let url = testing::fresh_database("jobq_chaos").await;
        let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test database");
        tokio::spawn(connection);
        let mut slots: Vec<Slot> = (0..3)
            .map(|i| Slot {
                port: free_port(),
                data: dir.path().join(format!("s{i}")),
                // The third server's clock runs ahead of everyone else's.
                skewed: i == 2,
                process: None,
            })
            .collect();
        for slot in &mut slots {
            slot.process = Some(start_server(slot, &url));
        }
        let cluster = Cluster {
            url,
            db,
            slots,
            faults: Vec::new(),
            dir,
        };
        // The skew took: the server logs its own clock, 30 s ahead.
        let skewed = cluster.slots[2].process.as_ref().expect("running");
        crate::clocks::assert_clock_ahead(skewed).await;
        cluster
    }

    pub(super) fn urls(&self) -> Vec<String> {
        self.slots
            .iter()
            .map(|s| format!("http://127.0.0.1:{}", s.port))
            .collect()
    }

    pub(super) fn process(&mut self, slot: usize) -> &mut ServerProcess {
        self.slots[slot].process.as_mut().expect("running")
    }

    /// The id a running server registered under (`jobq <id> <kind>` names
    /// its sessions), found through the ports of its connections.
    pub(super) async fn server_id(&self, slot: usize) -> String {
        let pid = self.slots[slot]
            .process
            .as_ref()
            .expect("running")
            .child
            .id();
        until(
            Duration::from_secs(20),
            "the server's sessions",
            || async move {
                let ports: Vec<i32> = local_ports(pid).into_iter().collect();
                let rows = self
                .db
                .query(
                    "SELECT DISTINCT split_part(application_name, ' ', 2) FROM pg_stat_activity \
                     WHERE client_port = ANY($1) AND application_name LIKE 'jobq %'",
                    &[&ports],
                )
                .await
                .ok()?;
                match rows.as_slice() {
                    [one] => Some(one.get::<_, String>(0)),
                    _ => None,
                }
            },
        )
        .await
    }

    pub(super) fn record(&mut self, what: String, server: bool, from: u64) {
        self.faults.push(Fault {
            what,
            server,
            from,
            to: now_ns(),
        });
    }

    pub(super) async fn kill_server(&mut self, slot: usize, down: Duration) {
        let from = now_ns();
        self.process(slot).kill9();
        tokio::time::sleep(down).await;
        let restarted = start_server(&self.slots[slot], &self.url);
        self.slots[slot].process = Some(restarted);
        self.record(
            format!("SIGKILL server {slot}, restarted after {down:?}"),
            true,
            from,
        );
    }

    pub(super) async fn freeze_server(&mut self, slot: usize, frozen: Duration) {
        let from = now_ns();
        signal(&self.process(slot).child, libc::SIGSTOP);
        tokio::time::sleep(frozen).await;
        signal(&self.process(slot).child, libc::SIGCONT);
        self.record(
            format!("SIGSTOP server {slot} for {frozen:?}, then SIGCONT"),
            true,
            from,
        );
    }

    /// Ends the server's sessions of one kind (`pool`, `heartbeat`,
    /// `listen`; every kind when `None`).
    pub(super) async fn terminate_sessions(&mut self, slot: usize, kind: Option<&str>) {
        let from = now_ns();
        let id = self.server_id(slot).await;
        let pattern = match kind {
            Some(kind) => format!("jobq {id} {kind}%"),
            None => format!("jobq {id} %"),
        };
        let ended: i64 = self
            .db
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name LIKE $1",
                &[&pattern],
            )
            .await
            .expect("pg_terminate_backend")
            .get(0);
        self.record(
            format!(
                "pg_terminate_backend of server {slot}'s {} sessions ({ended})",
                kind.unwrap_or("every")
            ),
            false,
            from,
        );
    }

    /// A server that exited by itself is a finding; it is restarted so the
    /// run goes on, and its exit explains the attempts spent meanwhile.
    pub(super) fn restart_exited(&mut self, findings: &mut Vec<String>) {
        for slot in 0..self.slots.len() {
            let exited = self.process(slot).child.try_wait().expect("try_wait");
            if let Some(status) = exited {
                let from = now_ns();
                findings.push(format!("server {slot} exited by itself: {status}"));
                let restarted = start_server(&self.slots[slot], &self.url);
                self.slots[slot].process = Some(restarted);
                self.record(format!("server {slot} exited ({status})"), true, from);
            }
        }
    }
}
