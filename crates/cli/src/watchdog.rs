//! The watchdog of `jobq work`: a small process that outlives it, so that
//! when `jobq work` dies without cleaning up (SIGKILL, the OOM killer, a
//! crash) its commands die too, and a job the server hands to another
//! worker never runs twice at once.
//!
//! `PR_SET_PDEATHSIG` (see `work.rs`) reaches each command itself, but not
//! what the command started (a shell script's children), which shares the
//! command's process group. So `jobq work` starts `jobq __watchdog` with a
//! pipe as its stdin; each command writes `+PGID` to it between fork and
//! exec (so before it can start anything), and `jobq work` writes `-PGID`
//! once that command is reaped (or killed). Only `jobq work` holds
//! the pipe's write end (it is close-on-exec), so when the watchdog reads
//! EOF, `jobq work` is gone: it SIGKILLs every process group still listed,
//! then exits.

use std::{
    collections::HashSet,
    io::{self, BufRead, Write},
    process::{Child, ChildStdin, Command, ExitCode, Stdio},
    sync::Mutex,
};

/// The hidden subcommand the watchdog runs as.
pub const SUBCOMMAND: &str = "__watchdog";

/// `jobq work`'s end of the watchdog.
pub struct Watchdog {
    pipe: Mutex<ChildStdin>,
    // Never waited for: it exits when `jobq work` does.
    _child: Child,
}

impl Watchdog {
    /// Starts the watchdog process (this same binary).
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn start() -> io::Result<Watchdog> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .arg(SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Not for it to hold: `jobq work` keeps its environment from
            // its commands (undumpable), and an exec is dumpable again.
            .env_remove("JOBQ_TOKEN");
        // Its own group: a Ctrl-C at the terminal, meant for `jobq work`'s
        // drain, must not stop it.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn()?;
        let pipe = child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("the watchdog has no stdin"))?;
        Ok(Watchdog {
            pipe: Mutex::new(pipe),
            _child: child,
        })
    }

    fn tell(&self, line: &str) {
        let mut pipe = self.pipe.lock().unwrap_or_else(|p| p.into_inner());
        // A short line on a pipe: one atomic write, never a partial one.
        if let Err(err) = pipe.write_all(line.as_bytes()) {
            tracing::warn!(cause = %err, "cannot reach the watchdog; commands may outlive a crash of jobq work");
        }
    }

    /// The pipe's descriptor, for a command to announce itself with
    /// [`announce_self`] before it runs.
    #[cfg(unix)]
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.pipe
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_raw_fd()
    }

    /// A command was started as the leader of process group `pgid` (on
    /// Linux it said so itself already; this covers a lost write).
    pub fn started(&self, pgid: u32) {
        self.tell(&format!("+{pgid}\n"));
    }

    /// The command leading `pgid` was reaped or killed: its id may be
    /// reused, so the watchdog forgets it.
    pub fn ended(&self, pgid: u32) {
        self.tell(&format!("-{pgid}\n"));
    }
}

/// Writes `+PID` for the calling process to the watchdog's pipe `fd`: for
/// a command between fork and exec (it leads its own process group, so its
/// pid is its group's id). Told by `jobq work` once `spawn` returned, the
/// watchdog would miss a command whose `jobq work` was SIGKILLed in
/// between, and what that command started would live on.
///
/// Async-signal-safe: no allocation, only `getpid`, `signal` and `write`.
/// SIGPIPE is ignored around the write: a watchdog that is gone must not
/// kill the command.
#[cfg(unix)]
pub fn announce_self(fd: std::os::fd::RawFd) {
    let mut line = [0u8; 16];
    let mut at = line.len() - 1;
    line[at] = b'\n';
    // SAFETY: getpid has no preconditions.
    let mut pid = unsafe { libc::getpid() }.unsigned_abs();
    loop {
        at -= 1;
        line[at] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    at -= 1;
    line[at] = b'+';
    // SAFETY: `line[at..]` is initialised memory we own; signal and write
    // are async-signal-safe, and SIGPIPE's disposition is put back.
    unsafe {
        let before = libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::write(fd, line[at..].as_ptr().cast(), line.len() - at);
        libc::signal(libc::SIGPIPE, before);
    }
}

/// A pipe a command also announces itself on, read back when its spawn
/// failed (exec did not find the program): the watchdog was told `+PID`,
/// and must be told `-PID`, or it would kill whatever group later gets
/// that id when `jobq work` exits.
#[cfg(unix)]
pub struct Announcement {
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

#[cfg(unix)]
impl Announcement {
    /// A new close-on-exec pipe, non-blocking (the read happens once the
    /// child is gone, and must not wait for other forks' copies of the
    /// write end).
    ///
    /// # Errors
    /// When the pipe cannot be made.
    pub fn new() -> io::Result<Announcement> {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`, which we then
        // own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both are fresh descriptors nothing else owns.
        let (read, write) = unsafe {
            (
                std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            )
        };
        Ok(Announcement { read, write })
    }

    /// The end the command writes to ([`announce_self`]).
    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.write.as_raw_fd()
    }

    /// After a failed spawn (the child is gone): the pid it announced, if
    /// it got that far.
    pub fn pid(self) -> Option<u32> {
        use std::io::Read;
        drop(self.write);
        // One short write, so one read has all of it.
        let mut line = [0u8; 32];
        let n = std::fs::File::from(self.read).read(&mut line).ok()?;
        std::str::from_utf8(&line[..n])
            .ok()?
            .trim()
            .strip_prefix('+')?
            .parse()
            .ok()
    }
}

/// Runs `jobq __watchdog`: reads `+PGID`/`-PGID` lines until EOF, then
/// SIGKILLs the groups still listed.
pub fn run() -> ExitCode {
    let mut groups: HashSet<libc::pid_t> = HashSet::new();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (sign, pgid) = line.split_at(line.len().min(1));
        let Ok(pgid) = pgid.parse::<libc::pid_t>() else {
            continue;
        };
        if pgid <= 1 {
            continue;
        }
        match sign {
            "+" => {
                groups.insert(pgid);
            }
            "-" => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    #[cfg(unix)]
    for pgid in groups {
        // SAFETY: kill(2) with a negative pid signals a process group that
        // `jobq work` started and had not seen end; no memory is involved.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
    ExitCode::SUCCESS
}
