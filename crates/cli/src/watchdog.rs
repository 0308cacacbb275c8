//! The watchdog of `jobq work`: a small process that outlives it, so that
//! when `jobq work` dies without cleaning up (SIGKILL, the OOM killer, a
//! crash) its commands die too, and a job the server hands to another
//! worker never runs twice at once (issue 11 hole 9).
//!
//! `PR_SET_PDEATHSIG` (see `work.rs`) reaches each command itself, but not
//! what the command started (a shell script's children), which shares the
//! command's process group. So `jobq work` starts `jobq __watchdog` with a
//! pipe as its stdin and writes `+PGID` when it starts a command and
//! `-PGID` once that command is reaped (or killed). Only `jobq work` holds
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
            .stderr(Stdio::inherit());
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

    /// A command was started as the leader of process group `pgid`.
    pub fn started(&self, pgid: u32) {
        self.tell(&format!("+{pgid}\n"));
    }

    /// The command leading `pgid` was reaped or killed: its id may be
    /// reused, so the watchdog forgets it.
    pub fn ended(&self, pgid: u32) {
        self.tell(&format!("-{pgid}\n"));
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
