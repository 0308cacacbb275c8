//! The fault suite's own PostgreSQL cluster: the suite restarts it
//! (`pg_ctl restart -m fast`), so it is not the cluster the other tests
//! share. Made with the binaries and the user that `scripts/pg-test.sh`
//! names (`JOBQ_TEST_PG_BIN`, `JOBQ_TEST_PG_OWNER`).

#[allow(unused_imports)]
use super::*;

pub(super) struct PgCluster {
    /// Holds `data/`, the log and the socket; owned by the cluster's user.
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The user that runs the cluster when the suite runs as root (initdb
    /// refuses root).
    owner: Option<String>,
    pub(super) port: u16,
}

const HOW: &str = "the fault suite runs a PostgreSQL cluster of its own (it restarts it): \
    run it under `scripts/pg-test.sh`, which sets JOBQ_TEST_PG_BIN (the directory of \
    initdb and pg_ctl) and JOBQ_TEST_PG_OWNER (the user that runs a cluster)";

impl PgCluster {
    /// initdb and start, on a free port of 127.0.0.1.
    pub(super) fn start() -> PgCluster {
        let bin = PathBuf::from(
            std::env::var("JOBQ_TEST_PG_BIN")
                .ok()
                .filter(|b| !b.is_empty())
                .unwrap_or_else(|| panic!("JOBQ_TEST_PG_BIN is not set: {HOW}")),
        );
        assert!(bin.join("pg_ctl").exists(), "no pg_ctl in {bin:?}: {HOW}");
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let owner = root.then(|| {
            std::env::var("JOBQ_TEST_PG_OWNER")
                .ok()
                .filter(|o| !o.is_empty() && o != "root")
                .unwrap_or_else(|| panic!("JOBQ_TEST_PG_OWNER is not set (or root): {HOW}"))
        });
        let dir = tempfile::Builder::new()
            .prefix("jobq-chaos-pg.")
            .tempdir()
            .expect("a folder for the cluster");
        let pg = PgCluster {
            dir,
            bin,
            owner,
            port: free_port(),
        };
        if let Some(owner) = &pg.owner {
            let status = Command::new("chown")
                .arg(owner)
                .arg(pg.dir.path())
                .status()
                .expect("chown");
            assert!(status.success(), "chown {owner} {:?}", pg.dir.path());
        }
        pg.run(
            "initdb",
            &[
                "-D",
                "data",
                "-U",
                "jobq",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
            pg.port,
            pg.dir.path().display()
        );
        pg.run(
            "pg_ctl",
            &[
                "-D",
                "data",
                "-l",
                "server.log",
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        );
        pg
    }

    /// Runs one of the cluster's programs as its user, in its folder;
    /// panics with the program's output when it fails.
    fn run(&self, program: &str, args: &[&str]) {
        let path = self.bin.join(program);
        let mut command = match &self.owner {
            Some(owner) => {
                let mut c = Command::new("runuser");
                c.args(["-u", owner, "--"]).arg(&path);
                c
            }
            None => Command::new(&path),
        };
        let out = command
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {path:?}: {e}"));
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}\n{}{}\nserver log:\n{log}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The cluster's `postgres` database.
    pub(super) fn admin_url(&self) -> String {
        format!("postgres://jobq@127.0.0.1:{}/postgres", self.port)
    }

    /// A database of its own for the suite, and its URL on `port` (the
    /// cluster's, or a proxy's in front of it).
    pub(super) async fn database(&self) -> String {
        let (client, connection) =
            tokio_postgres::connect(&self.admin_url(), tokio_postgres::NoTls)
                .await
                .expect("connect to the suite's cluster");
        let driver = tokio::spawn(connection);
        client
            .batch_execute("CREATE DATABASE jobq_chaos")
            .await
            .expect("CREATE DATABASE jobq_chaos");
        drop(client);
        let _ = driver.await;
        self.url_via(self.port)
    }

    /// The suite's database through `port`.
    pub(super) fn url_via(&self, port: u16) -> String {
        format!("postgres://jobq@127.0.0.1:{port}/jobq_chaos")
    }

    /// `pg_ctl restart -m fast`: every session ends, and the cluster is
    /// back (accepting connections) when this returns. How long it took.
    pub(super) fn restart(&self) -> Duration {
        let began = Instant::now();
        tokio::task::block_in_place(|| {
            self.run(
                "pg_ctl",
                &[
                    "-D",
                    "data",
                    "-l",
                    "server.log",
                    "-w",
                    "-t",
                    "60",
                    "-m",
                    "fast",
                    "restart",
                ],
            );
        });
        began.elapsed()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let path = self.bin.join("pg_ctl");
        let mut command = match &self.owner {
            Some(owner) => {
                let mut c = Command::new("runuser");
                c.args(["-u", owner, "--"]).arg(&path);
                c
            }
            None => Command::new(&path),
        };
        let _ = command
            .args(["-D", "data", "-m", "immediate", "stop"])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
