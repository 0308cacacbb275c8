//! The server under test: a `jobq serve` child process on a temporary data
//! dir (its own process, so the bench's CPU and memory are not mixed into
//! the server's), or an external server given by URL.

use std::{
    collections::VecDeque,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{bail, Context};
use tokio::sync::oneshot;

/// How long a spawned server gets to report its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Server log lines kept to explain a failure.
const LOG_TAIL: usize = 40;

/// The server's memory, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory {
    /// Resident set size now (VmRSS), MiB.
    pub rss_mib: f64,
    /// Peak resident set size so far (VmHWM), MiB.
    pub peak_rss_mib: f64,
}

/// A spawned or attached server.
pub struct Server {
    url: String,
    child: Option<Spawned>,
    /// An external server's process id (`--server-pid`), for its memory.
    pid: Option<u32>,
}

struct Spawned {
    child: Child,
    data: tempfile::TempDir,
    log_tail: Arc<Mutex<VecDeque<String>>>,
}

impl Server {
    /// A server someone else runs; with its `pid` (on this host) its
    /// memory is measured too.
    pub fn attach(url: String, pid: Option<u32>) -> Server {
        Server {
            url,
            child: None,
            pid,
        }
    }

    /// Starts this very binary as `jobq serve --listen 127.0.0.1:0 --data
    /// <tmp>` and waits for its `jobq serving addr=…` log line.
    pub async fn spawn(parent: Option<&Path>, extra: &[String]) -> anyhow::Result<Server> {
        let exe = std::env::current_exe().context("cannot find the jobq binary")?;
        let data = match parent {
            Some(dir) => tempfile::Builder::new()
                .prefix("jobq-bench-")
                .tempdir_in(dir),
            None => tempfile::Builder::new().prefix("jobq-bench-").tempdir(),
        }
        .context("cannot make the server's temporary data dir")?;
        let mut command = Command::new(&exe);
        die_with_bench(&mut command);
        let mut child = command
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data")
            .arg(data.path().join("data"))
            .arg("--http-listen")
            .arg("127.0.0.1:0")
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot spawn {} serve", exe.display()))?;
        let stderr = child.stderr.take().context("child stderr")?;
        let log_tail = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = oneshot::channel();
        let tail = Arc::clone(&log_tail);
        // A thread, not a task: the pipe is blocking, and it must be read
        // for the server's whole life or the server blocks on a full pipe.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = serving_addr(&line) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == LOG_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let spawned = Spawned {
            child,
            data,
            log_tail,
        };
        let addr = match tokio::time::timeout(START_TIMEOUT, rx).await {
            Ok(Ok(addr)) => addr,
            Ok(Err(_)) => bail!("jobq serve exited before serving:\n{}", spawned.tail()),
            Err(_) => bail!(
                "jobq serve did not report its address in {START_TIMEOUT:?}:\n{}",
                spawned.tail()
            ),
        };
        Ok(Server {
            url: format!("http://{addr}"),
            child: Some(spawned),
            pid: None,
        })
    }

    /// The URL clients connect to.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// One line for the report's header.
    pub fn describe(&self) -> String {
        match &self.child {
            None => match self.pid {
                Some(pid) => format!("external server (pid {pid}) at {}", self.url),
                None => format!("external server at {}", self.url),
            },
            Some(s) => {
                let dir = s.data.path();
                format!(
                    "spawned `jobq serve` (pid {}) at {}, data in {} ({})",
                    s.child.id(),
                    self.url,
                    dir.display(),
                    filesystem(dir).unwrap_or("unknown filesystem")
                )
            }
        }
    }

    /// The server's process id: the spawned child's, or `--server-pid`.
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|s| s.child.id()).or(self.pid)
    }

    /// The server's memory now; `None` for an external server without
    /// `--server-pid`, or off Linux.
    pub fn memory(&self) -> Option<Memory> {
        let pid = self.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        parse_memory(&status)
    }

    /// Starts the peak (VmHWM) again from the current RSS, so the next
    /// [`memory`](Self::memory) reports the peak since now (Linux 4.0+:
    /// `5` written to `/proc/PID/clear_refs`). Best effort: without the
    /// permission the peak stays the process's lifetime peak.
    pub fn reset_peak(&self) {
        if let Some(pid) = self.pid() {
            if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
                // Said every time: each workload's peak is then the
                // lifetime peak, which a reader cannot tell from the output.
                eprintln!(
                    "jobq bench: cannot reset the server's peak RSS ({e}); \
                     peaks are since the server started"
                );
            }
        }
    }

    /// Kills a spawned server (its data is temporary) and removes its data.
    pub async fn stop(mut self) {
        if let Some(spawned) = self.child.take() {
            let _ = tokio::task::spawn_blocking(move || drop(spawned)).await;
        }
    }
}

/// The spawned server gets SIGKILL when the bench dies, however it dies
/// (a SIGKILL or a `timeout` included): a server left running would take
/// the cores and the disk of every later run. The bench's other ways out
/// drop [`Spawned`], which also removes the data.
#[cfg(target_os = "linux")]
fn die_with_bench(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid), allocating nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The bench may have died between fork and prctl.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::other("jobq bench exited"));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_bench(_: &mut Command) {}

/// The server dies with its handle, however the bench ends: SIGKILL is
/// enough, as the data dir is thrown away right after.
impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Spawned {
    fn tail(&self) -> String {
        let tail = self.log_tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// The address in the server's `jobq serving addr=127.0.0.1:PORT …` line.
fn serving_addr(line: &str) -> Option<SocketAddr> {
    if !line.contains("jobq serving") {
        return None;
    }
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .and_then(|a| a.parse().ok())
}

/// VmRSS and VmHWM (in kB) from a `/proc/PID/status` text.
fn parse_memory(status: &str) -> Option<Memory> {
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
        Some(kb / 1024.0)
    };
    Some(Memory {
        rss_mib: field("VmRSS:")?,
        peak_rss_mib: field("VmHWM:")?,
    })
}

/// The name of the filesystem `dir` is on, for the few that matter here.
#[cfg(target_os = "linux")]
fn filesystem(dir: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs(2) fills the zeroed struct we own from a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // f_type's integer type differs by libc
    Some(match st.f_type as i64 {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs: fsync is free here, figures are not disk figures",
        0x794C_7630 => "overlayfs",
        0x2FC1_2FC1 => "zfs",
        _ => "other filesystem",
    })
}

#[cfg(not(target_os = "linux"))]
fn filesystem(_dir: &Path) -> Option<&'static str> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_address_in_the_serving_line() {
        let line = "2026-01-01T00:00:00Z  INFO jobq_server::server: jobq serving addr=127.0.0.1:40123 data=/tmp/x";
        assert_eq!(serving_addr(line), Some("127.0.0.1:40123".parse().unwrap()));
        assert_eq!(serving_addr("INFO something else addr=127.0.0.1:1"), None);
        assert_eq!(serving_addr("jobq serving addr=nonsense"), None);
    }

    #[test]
    fn reads_rss_and_peak_from_proc_status() {
        let status =
            "Name:\tjobq\nVmPeak:\t  900000 kB\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(
            parse_memory(status),
            Some(Memory {
                rss_mib: 10.0,
                peak_rss_mib: 20.0
            })
        );
        assert_eq!(parse_memory("Name:\tjobq\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn own_process_has_memory_figures() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let m = parse_memory(&status).unwrap();
        assert!(m.rss_mib > 0.0 && m.peak_rss_mib >= m.rss_mib);
    }
}
