//! The fault suite's servers and the faults it injects into them.

#[allow(unused_imports)]
use super::*;

/// The server whose PostgreSQL traffic goes through the suite's proxy.
pub(super) const PROXIED: usize = 1;

/// One of the three servers: it comes back on the same port after a kill.
pub(super) struct Slot {
    pub(super) port: u16,
    pub(super) data: PathBuf,
    pub(super) skewed: bool,
    /// The DSN it is started with (the proxy's port, for the proxied one).
    pub(super) store: String,
    pub(super) process: Option<ServerProcess>,
}

#[derive(Debug, Clone)]
pub(super) struct Fault {
    pub(super) what: String,
    /// A server kill, freeze or exit: attempts spent meanwhile are
    /// explained by it.
    pub(super) server: bool,
    /// The server slot it struck (a kill, freeze, exit or session cut).
    pub(super) slot: Option<usize>,
    /// A PostgreSQL restart: every server lost the database meanwhile.
    pub(super) pg_restart: bool,
    pub(super) from: u64,
    pub(super) to: u64,
}

impl Fault {
    /// A server gone for the others (killed, frozen, black-holed): its
    /// streams' leases are due again within `--server-timeout` and a tick
    /// (docs/src/design.md §5). Latency may leave it alive; an exit by
    /// itself is a finding of its own.
    pub(super) fn server_gone(&self) -> bool {
        ["SIGKILL server", "SIGSTOP server", "proxy black-holes"]
            .iter()
            .any(|p| self.what.starts_with(p))
    }
}

pub(super) struct Cluster {
    pub(super) pg: PgCluster,
    /// Between server [`PROXIED`] and PostgreSQL.
    pub(super) proxy: Proxy,
    pub(super) url: String,
    pub(super) db: tokio_postgres::Client,
    pub(super) slots: Vec<Slot>,
    pub(super) faults: Vec<Fault>,
    pub(super) dir: tempfile::TempDir,
}

pub(super) fn start_server(slot: &Slot) -> ServerProcess {
    let timeout = humantime::format_duration(SERVER_TIMEOUT).to_string();
    let args = [
        "--store",
        &slot.store,
        "--server-timeout",
        &timeout,
        "--min-lease",
        "10ms",
    ];
    let listen = format!("127.0.0.1:{}", slot.port);
    let skewed = slot.skewed.then(libfaketime);
    tokio::task::block_in_place(|| {
        ServerProcess::start_with(&slot.data, &listen, &args, |c| {
            die_with_suite(c);
            if let Some(lib) = skewed {
                c.env("LD_PRELOAD", lib)
                    .env("FAKETIME", format!("+{}s", AHEAD.as_secs()))
                    .env("DONT_FAKE_MONOTONIC", "1");
            }
        })
    })
}

impl Cluster {
    pub(super) async fn start(dir: tempfile::TempDir) -> Cluster {
        let pg = tokio::task::block_in_place(PgCluster::start);
        let url = pg.database().await;
        let db = connect(&url).await;
        let proxy = Proxy::start(pg.port).await;
        let mut slots: Vec<Slot> = (0..3)
            .map(|i| Slot {
                port: free_port(),
                data: dir.path().join(format!("s{i}")),
                // The third server's clock runs ahead of everyone else's.
                skewed: i == 2,
                store: if i == PROXIED {
                    pg.url_via(proxy.port)
                } else {
                    url.clone()
                },
                process: None,
            })
            .collect();
        for slot in &mut slots {
            slot.process = Some(start_server(slot));
        }
        let cluster = Cluster {
            pg,
            proxy,
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
    /// its sessions): a PostgreSQL store's server id begins with its
    /// process id.
    pub(super) async fn server_id(&self, slot: usize) -> String {
        let pid = self.slots[slot]
            .process
            .as_ref()
            .expect("running")
            .child
            .id();
        let pattern = format!("jobq {pid}-%");
        let db = &self.db;
        let pattern = &pattern;
        until(
            Duration::from_secs(20),
            "the server's sessions",
            || async move {
                let rows = db
                    .query(
                        "SELECT DISTINCT split_part(application_name, ' ', 2) \
                         FROM pg_stat_activity WHERE application_name LIKE $1",
                        &[pattern],
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

    pub(super) fn record(&mut self, what: String, server: bool, slot: Option<usize>, from: u64) {
        self.faults.push(Fault {
            what,
            server,
            slot,
            pg_restart: false,
            from,
            to: now_ns(),
        });
    }

    /// `pg_ctl restart -m fast` of the suite's cluster. It explains no
    /// attempt: every server's streams end while its own heartbeat fails,
    /// but their leases are kept, and after the outage no server judges
    /// another until it has heartbeated again for a whole
    /// `--server-timeout` (docs/src/design.md §3).
    pub(super) async fn restart_postgres(&mut self) {
        let from = now_ns();
        let took = self.pg.restart();
        self.db = connect(&self.url).await;
        self.faults.push(Fault {
            what: format!("pg_ctl restart -m fast (back after {took:?})"),
            server: false,
            slot: None,
            pg_restart: true,
            from,
            to: now_ns(),
        });
    }

    pub(super) async fn kill_server(&mut self, slot: usize, down: Duration) {
        let from = now_ns();
        self.process(slot).kill9();
        tokio::time::sleep(down).await;
        let restarted = start_server(&self.slots[slot]);
        self.slots[slot].process = Some(restarted);
        self.record(
            format!("SIGKILL server {slot}, restarted after {down:?}"),
            true,
            Some(slot),
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
            Some(slot),
            from,
        );
    }

    /// Slows (`Some(latency)`) or black-holes (`None`) the proxied
    /// server's traffic to PostgreSQL for `lasts`, then heals. It explains
    /// the attempts spent meanwhile as a freeze does: a server whose
    /// heartbeat cannot get through within `--server-timeout` is dead to
    /// the others (docs/src/design.md §3), and a latency of these sizes
    /// keeps its heartbeat from landing within half of it.
    pub(super) async fn proxy_fault(&mut self, latency: Option<Duration>, lasts: Duration) {
        let from = now_ns();
        self.proxy.set(match latency {
            Some(d) => Mode::Delay(d),
            None => Mode::BlackHole,
        });
        tokio::time::sleep(lasts).await;
        self.proxy.set(Mode::Forward);
        let what = match latency {
            Some(d) => {
                format!("proxy delays server {PROXIED}'s PostgreSQL traffic by {d:?} for {lasts:?}")
            }
            None => {
                format!("proxy black-holes server {PROXIED}'s PostgreSQL traffic for {lasts:?}")
            }
        };
        self.record(what, true, Some(PROXIED), from);
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
            Some(slot),
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
                let restarted = start_server(&self.slots[slot]);
                self.slots[slot].process = Some(restarted);
                self.record(
                    format!("server {slot} exited ({status})"),
                    true,
                    Some(slot),
                    from,
                );
            }
        }
    }
}

/// A connection to the suite's database, retried while PostgreSQL comes
/// back from a restart.
pub(super) async fn connect(url: &str) -> tokio_postgres::Client {
    let url = url.to_owned();
    until(
        Duration::from_secs(60),
        "a connection to PostgreSQL",
        || {
            let url = url.clone();
            async move {
                let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .ok()?;
                tokio::spawn(connection);
                Some(db)
            }
        },
    )
    .await
}
