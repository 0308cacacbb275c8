//! `jobq work -- CMD ARGS...`: a worker that runs a command per job, so any
//! language can be a worker without a client library.
//!
//! Leasing, heartbeats, reconnects and graceful drain are the client crate's
//! [`Worker`]; this module only turns a job into a child process and its
//! exit status into an ack or a fail:
//! - the payload goes to the child's stdin; the job's id, kind, key,
//!   attempt and queue go into `JOBQ_JOB_*` environment variables;
//! - exit 0 acks; anything else fails the job (retryably) with the exit
//!   status and the last [`STDERR_TAIL`] bytes of stderr as its error,
//!   except a `--fatal-exit-code`, which fails it fatally (dead letter at
//!   once), and a `--snooze-exit-code`, which puts it back for `--snooze`
//!   without spending an attempt;
//! - the child runs in its own process group, so a Ctrl-C at the terminal
//!   reaches only `jobq work` (which drains) and not the running jobs; at
//!   `--timeout`, or when the drain deadline passes, the group gets
//!   SIGTERM, and `--kill-grace` later SIGKILL; when a job's lease is lost
//!   the Worker drops the job's future and [`KillOnDrop`] SIGKILLs the
//!   whole group at once (another worker may hold the job now);
//! - the command's exit ends the run even when something it started in the
//!   background still holds its stderr;
//! - `JOBQ_TOKEN` is not passed on to the command;
//! - when `jobq work` itself dies (SIGKILL, OOM), each command gets SIGKILL
//!   from the kernel (`PR_SET_PDEATHSIG`) and the [`Watchdog`] kills the
//!   rest of its process group.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use jobq_client::{HandlerError, HandlerResult, JobContext};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::watchdog::Watchdog;

/// How much of the child's stderr becomes the job's error.
const STDERR_TAIL: usize = 2048;
/// How much longer than `--drain-timeout` + `--kill-grace` the Worker's
/// drain waits, so that the commands' own SIGTERM and SIGKILL come first
/// and their jobs are failed as "stopped", not left to be reclaimed.
const DRAIN_SLACK: Duration = Duration::from_secs(1);
/// After the command exits, how long its stderr is still read: something
/// it started in the background may hold the pipe open for good.
const STDERR_LINGER: Duration = Duration::from_millis(200);

/// Options of `jobq work`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Queue to take jobs from; repeat for several, in priority order.
    #[arg(long = "queue", value_name = "QUEUE", required = true)]
    queues: Vec<String>,

    /// Only run jobs of this kind; repeat for several. Without it, every
    /// job of the queues runs the command (its kind is in JOBQ_JOB_KIND).
    /// With it, a job of another kind is failed (retryably) with
    /// "no handler for kind".
    #[arg(long = "kind", value_name = "KIND")]
    kinds: Vec<String>,

    /// How many jobs run at once (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    capacity: u32,

    /// Lease per job; heartbeats renew it every third of it while the
    /// command runs.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,

    /// The id the server records on the jobs (default: <hostname>-<pid>-<hex>).
    #[arg(long)]
    worker_id: Option<String>,

    /// On SIGINT/SIGTERM, how long running commands get to finish; then
    /// they get SIGTERM, and `--kill-grace` later SIGKILL (their jobs are
    /// left for the server to reclaim).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,

    /// Most time one run of the command may take; then it gets SIGTERM,
    /// `--kill-grace` later SIGKILL, and the job fails (retryably) with
    /// "timed out". Default: no limit (the lease is heartbeated while it
    /// runs).
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,

    /// How long a command told to stop (SIGTERM, at `--timeout` or the
    /// drain deadline) gets before SIGKILL, for its whole process group.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    kill_grace: Duration,

    /// An exit code that means "never retry": the job is dead-lettered
    /// (FAILED) at once whatever its attempts, e.g. for a payload the
    /// command cannot parse. Repeat for several. Other non-zero exits are
    /// retried while attempts are left.
    #[arg(long = "fatal-exit-code", value_name = "N", value_parser = clap::value_parser!(i32).range(1..=255))]
    fatal_exit_codes: Vec<i32>,

    /// An exit code that means "not now": the job is put back, due again
    /// after `--snooze`, without spending an attempt (its history entry
    /// reads SNOOZED), e.g. for a command told "429, try again later".
    /// Repeat for several.
    #[arg(long = "snooze-exit-code", value_name = "N", value_parser = clap::value_parser!(i32).range(1..=255))]
    snooze_exit_codes: Vec<i32>,

    /// How long a job snoozed by a `--snooze-exit-code` waits.
    #[arg(long = "snooze", default_value = "30s", value_parser = humantime::parse_duration)]
    snooze: Duration,

    /// The command to run for each job, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs `jobq work` until SIGINT/SIGTERM and the drain are over.
pub async fn run(conn: &crate::conn::Conn, args: Args) -> anyhow::Result<()> {
    // A command that cannot start would fail every job it is given (each
    // retryably, so the whole queue would be dead-lettered within seconds):
    // refuse to start instead. `which` looks where the spawn will: PATH for
    // a bare name, the path itself otherwise, and checks it is executable.
    if let Some(code) = args
        .snooze_exit_codes
        .iter()
        .find(|c| args.fatal_exit_codes.contains(c))
    {
        return Err(crate::cli::usage(format!(
            "exit code {code} is both a --fatal-exit-code and a --snooze-exit-code"
        )));
    }
    if let Some(program) = args.command.first() {
        if let Err(err) = which::which(program) {
            return Err(crate::cli::usage(format!(
                "cannot run {program:?}: {err} (a bare name is looked up in PATH; a path must name an executable file)"
            )));
        }
    }
    hide_environment();
    let watchdog = match Watchdog::start() {
        Ok(w) => Some(Arc::new(w)),
        Err(err) => {
            tracing::warn!(cause = %err, "cannot start the watchdog; if jobq work is killed, what its commands started may live on");
            None
        }
    };
    let shutdown = crate::shutdown::on_signal();
    let drain_began = Arc::new(std::sync::OnceLock::new());
    tokio::spawn({
        let (shutdown, began) = (shutdown.clone(), Arc::clone(&drain_began));
        async move {
            shutdown.cancelled().await;
            began.get_or_init(tokio::time::Instant::now);
        }
    });
    let command = Job {
        command: args.command.into(),
        fatal_exit_codes: args.fatal_exit_codes.into(),
        snooze_exit_codes: args.snooze_exit_codes.into(),
        snooze: args.snooze,
        watchdog,
        timeout: args.timeout,
        kill_grace: args.kill_grace,
        drain: shutdown.clone(),
        drain_began,
        drain_timeout: args.drain_timeout,
    };
    let command = Arc::new(command);
    let mut builder = conn
        .worker()?
        .queues(args.queues)
        .capacity(args.capacity)
        .lease(args.lease)
        // The commands still running at the drain deadline get SIGTERM
        // then (see `run_job`), `--kill-grace` later SIGKILL, and their
        // jobs are failed; the Worker waits a little longer than that
        // before it gives up on them (then `KillOnDrop` sends SIGKILL).
        .drain_timeout(
            args.drain_timeout
                .saturating_add(args.kill_grace)
                .saturating_add(DRAIN_SLACK),
        )
        .shutdown(shutdown);
    if let Some(id) = args.worker_id {
        builder = builder.worker_id(id);
    }
    if args.kinds.is_empty() {
        let command = Arc::clone(&command);
        builder = builder.fallback(move |ctx: JobContext| {
            let command = Arc::clone(&command);
            async move { run_job(&command, ctx).await }
        });
    }
    for kind in args.kinds {
        let command = Arc::clone(&command);
        builder = builder.handler(kind, move |ctx: JobContext| {
            let command = Arc::clone(&command);
            async move { run_job(&command, ctx).await }
        });
    }
    let worker = builder.build();
    tracing::info!(worker.id = worker.worker_id(), command = ?command.command, "jobq work starting");
    worker.run().await.context("jobq work")
}

/// Keeps the commands (same user) from reading `jobq work`'s environment,
/// `JOBQ_TOKEN` included, through `/proc/<pid>/environ`: a process that is
/// not dumpable has its `/proc` files owned by root. Also no core dumps
/// and no ptrace by the same user, which a worker does not need.
fn hide_environment() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_DUMPABLE) only changes a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        tracing::warn!(cause = %std::io::Error::last_os_error(), "cannot make jobq work undumpable; its commands may read its environment");
    }
}

/// Makes the command die with `jobq work`: a SIGKILLed
/// worker runs no cleanup, and the server hands its job to someone else, so
/// a command that lived on would run twice at once. The kernel sends the
/// command SIGKILL when the thread that started it ends (a tokio worker
/// thread, which lives as long as the process), through
/// `PR_SET_PDEATHSIG`.
/// With a watchdog (its pipe `watchdog`), the command also tells it its
/// process group before it runs ([`crate::watchdog::announce_self`]), and
/// says the same on `announcement`, for a spawn that fails.
#[cfg(target_os = "linux")]
fn die_with_worker(
    cmd: &mut tokio::process::Command,
    watchdog: Option<std::os::fd::RawFd>,
    announcement: Option<std::os::fd::RawFd>,
) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid, and getpid, signal
    // and write in `announce_self`) with no allocation.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The worker may have died between fork and prctl: then the
            // signal will never come, so do not start at all.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::other("jobq work exited"));
            }
            for fd in [watchdog, announcement].into_iter().flatten() {
                crate::watchdog::announce_self(fd);
            }
            Ok(())
        });
    }
}

/// What runs each job: the command, and the watchdog that kills it if
/// `jobq work` dies.
struct Job {
    command: Box<[String]>,
    /// Exit codes that dead-letter the job at once.
    fatal_exit_codes: Box<[i32]>,
    /// Exit codes that snooze the job for `snooze`.
    snooze_exit_codes: Box<[i32]>,
    snooze: Duration,
    watchdog: Option<Arc<Watchdog>>,
    /// Most time one run may take (`--timeout`).
    timeout: Option<Duration>,
    /// SIGTERM to SIGKILL (`--kill-grace`).
    kill_grace: Duration,
    /// Cancelled when the drain starts, at `drain_began`...
    drain: tokio_util::sync::CancellationToken,
    drain_began: Arc<std::sync::OnceLock<tokio::time::Instant>>,
    /// ...and the commands get this long before SIGTERM.
    drain_timeout: Duration,
}

/// Why a command was told to stop before it finished.
enum Stop {
    TimedOut(Duration),
    Drained,
}

/// Runs `command` for one job and maps its exit to ack (Ok) or fail (Err).
async fn run_job(job: &Job, ctx: JobContext) -> HandlerResult {
    let (program, rest) = job
        .command
        .split_first()
        .ok_or_else(|| HandlerError::fatal("no command"))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .env("JOBQ_JOB_ID", ctx.id())
        .env("JOBQ_JOB_KIND", ctx.kind())
        .env("JOBQ_JOB_KEY", ctx.key().unwrap_or_default())
        .env("JOBQ_JOB_ATTEMPT", ctx.attempt().to_string())
        .env("JOBQ_JOB_MAX_ATTEMPTS", ctx.max_attempts().to_string())
        .env("JOBQ_JOB_QUEUE", ctx.queue())
        .env("JOBQ_WORKER_ID", ctx.worker_id())
        // The worker's own secret is not the command's to use (it may run
        // third-party code on untrusted payloads).
        .env_remove("JOBQ_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    let announcement = job
        .watchdog
        .as_ref()
        .and_then(|_| crate::watchdog::Announcement::new().ok());
    #[cfg(target_os = "linux")]
    die_with_worker(
        &mut cmd,
        job.watchdog.as_ref().map(|w| w.fd()),
        announcement.as_ref().map(crate::watchdog::Announcement::fd),
    );
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(err) => {
            // The command may have told the watchdog before exec failed.
            #[cfg(target_os = "linux")]
            if let (Some(w), Some(pid)) = (
                &job.watchdog,
                announcement.and_then(crate::watchdog::Announcement::pid),
            ) {
                w.ended(pid);
            }
            return Err(HandlerError::retry(format!(
                "cannot start {program:?}: {err}"
            )));
        }
    };
    let mut guard = KillOnDrop {
        pid: child.id(),
        watchdog: job.watchdog.clone(),
    };
    if let (Some(w), Some(pid)) = (&job.watchdog, guard.pid) {
        w.started(pid);
    }
    let stdin = child.stdin.take();
    let stderr = child.stderr.take();
    let payload = ctx.payload();
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A child that does not read its stdin closes the pipe: not an
            // error. Dropping `stdin` closes it, so the child sees EOF.
            let _ = stdin.write_all(payload).await;
        }
    };
    let mut tail = Vec::new();
    let run = async {
        let tee = tee_tail(stderr, &mut tail);
        let wait = child.wait();
        tokio::pin!(feed, tee, wait);
        let (mut fed, mut teed, mut stop) = (false, false, None);
        let mut kill_at = None;
        let stopping = stop_after(job);
        tokio::pin!(stopping);
        let status = loop {
            tokio::select! {
                status = &mut wait => {
                    if status.is_ok() {
                        // Reaped: from here on its group id may be reused
                        // (once the group is empty), so nothing is signalled
                        // after this. A command told to stop takes what it
                        // started with it now.
                        if stop.is_some() {
                            guard.signal(KILL);
                        }
                        guard.disarm();
                    }
                    break status;
                }
                () = &mut feed, if !fed => fed = true,
                () = &mut tee, if !teed => teed = true,
                why = &mut stopping, if stop.is_none() => {
                    if let Stop::TimedOut(after) = why {
                        tracing::warn!(job.id = ctx.id(), ?after, "the command timed out; SIGTERM to its process group");
                    } else {
                        tracing::warn!(job.id = ctx.id(), "drain deadline passed; SIGTERM to the command's process group");
                    }
                    guard.signal(TERM);
                    stop = Some(why);
                    kill_at = Some(tokio::time::Instant::now() + job.kill_grace);
                }
                // Then SIGKILL (by `KillOnDrop`) if it outlives the grace.
                () = sleep_until_opt(kill_at), if kill_at.is_some() => {
                    break Err(std::io::Error::other("it did not stop within --kill-grace"));
                }
            }
        };
        // Exited. Whatever it started in the background may hold stderr
        // open for good: take what is there, briefly, then go on.
        if !teed {
            let _ = tokio::time::timeout(STDERR_LINGER, &mut tee).await;
        }
        (status, stop)
    };
    let (status, stop) = tokio::select! {
        // The Worker drops this future when the lease is lost anyway; the
        // explicit arm makes the kill visible here and in the logs.
        _ = ctx.cancelled() => {
            tracing::warn!(job.id = ctx.id(), "lease lost or drain deadline passed; killing the command");
            return Err(HandlerError::retry("cancelled: lease lost"));
        }
        done = run => done,
    };
    let status = match (status, stop) {
        (Ok(status), None) => status,
        (Err(err), None) => {
            return Err(HandlerError::retry(format!("wait for {program:?}: {err}")));
        }
        // Told to stop: whatever its exit status, the run did not finish
        // (retried), and nothing it started may live on.
        // Otherwise (not reaped) `KillOnDrop` kills the group on return.
        (_, Some(why)) => {
            return Err(HandlerError::retry(match why {
                Stop::TimedOut(after) => format!(
                    "timed out after {} (--timeout)",
                    humantime::format_duration(after)
                ),
                // Due again at once: another worker takes it now.
                Stop::Drained => {
                    return Err(HandlerError::retry_after(
                        "stopped: the worker was draining and --drain-timeout passed",
                        Duration::ZERO,
                    ));
                }
            }));
        }
    };
    guard.disarm();
    if status.success() {
        return Ok(());
    }
    let tail = tail_text(&tail);
    let reason = describe(status);
    let message = if tail.is_empty() {
        reason
    } else {
        format!("{reason}: {tail}")
    };
    let code = status.code();
    if code.is_some_and(|code| job.snooze_exit_codes.contains(&code)) {
        return Err(HandlerError::snooze(message, job.snooze));
    }
    let fatal = code.is_some_and(|code| job.fatal_exit_codes.contains(&code));
    Err(if fatal {
        HandlerError::fatal(message)
    } else {
        HandlerError::retry(message)
    })
}

/// Copies the child's stderr to ours as it comes and keeps its last
/// [`STDERR_TAIL`] bytes in `tail` (also when the copy is given up midway).
async fn tee_tail(stderr: Option<impl AsyncRead + Unpin>, tail: &mut Vec<u8>) {
    let Some(mut stderr) = stderr else {
        return;
    };
    let mut buf = [0u8; 8192];
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Blocking, but stderr is unbuffered and the chunk small.
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), &buf[..n]);
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > STDERR_TAIL {
            tail.drain(..tail.len() - STDERR_TAIL);
        }
    }
}

/// Sleeps until `at`; never without one.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// When a running command must be told to stop: at `--timeout`, or
/// `--drain-timeout` after the drain began. Never, without either.
async fn stop_after(job: &Job) -> Stop {
    let timeout = async {
        match job.timeout {
            Some(after) => {
                tokio::time::sleep(after).await;
                after
            }
            None => std::future::pending().await,
        }
    };
    let drained = async {
        job.drain.cancelled().await;
        // From when the drain began, not from when this job saw it (one
        // taken just before the drain sees it at its start).
        let began = *job.drain_began.get_or_init(tokio::time::Instant::now);
        tokio::time::sleep_until(began + job.drain_timeout).await;
    };
    tokio::select! {
        after = timeout => Stop::TimedOut(after),
        () = drained => Stop::Drained,
    }
}

/// The tail as trimmed text, starting at a character boundary.
fn tail_text(tail: &[u8]) -> String {
    // The cut may have split a UTF-8 sequence: skip continuation bytes.
    let start = tail
        .iter()
        .position(|b| b & 0xC0 != 0x80)
        .unwrap_or(tail.len());
    String::from_utf8_lossy(&tail[start..]).trim().to_owned()
}

/// `exit status 3`, `killed by signal 9`.
fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("killed by signal {signal}");
        }
    }
    status.to_string()
}

/// SIGKILLs a child's process group (the child and anything it started)
/// when dropped before [`disarm`](Self::disarm): the job's future was
/// dropped because its lease was lost, the drain deadline passed, or the
/// process is exiting.
struct KillOnDrop {
    pid: Option<u32>,
    watchdog: Option<Arc<Watchdog>>,
}

/// The signals [`KillOnDrop::signal`] sends.
#[cfg(unix)]
const TERM: libc::c_int = libc::SIGTERM;
#[cfg(unix)]
const KILL: libc::c_int = libc::SIGKILL;
#[cfg(not(unix))]
const TERM: i32 = 15;
#[cfg(not(unix))]
const KILL: i32 = 9;

impl KillOnDrop {
    /// Sends `signal` to the child's process group (not yet reaped).
    fn signal(&self, signal: i32) {
        let Some(pid) = self.pid else { return };
        #[cfg(unix)]
        if let Ok(pgid) = libc::pid_t::try_from(pid) {
            // SAFETY: as in `drop`: kill(2) on the group our unreaped child
            // leads; no memory is involved.
            unsafe {
                libc::kill(-pgid, signal);
            }
        }
        #[cfg(not(unix))]
        let _ = (pid, signal);
    }

    /// The child was reaped: its pid, and so its group id, may be reused.
    fn disarm(&mut self) {
        if let (Some(w), Some(pid)) = (&self.watchdog, self.pid.take()) {
            w.ended(pid);
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(pid) = self.pid else { return };
        tracing::warn!(pid, "job cancelled; killing its command");
        #[cfg(unix)]
        if let Ok(pgid) = libc::pid_t::try_from(pid) {
            // SAFETY: kill(2) with a negative pid signals the process group
            // our unreaped child leads (process_group(0) made its pgid its
            // pid); no memory is involved.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        // Elsewhere, tokio's kill_on_drop kills the child itself.
        if let Some(w) = &self.watchdog {
            w.ended(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command whose exec fails has told the watchdog its pid already:
    /// `jobq work` reads it back, to tell the watchdog it is gone.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_command_that_cannot_start_says_which_pid_it_announced() {
        let announcement = crate::watchdog::Announcement::new().unwrap();
        let mut cmd = tokio::process::Command::new("/nonexistent/jobq-test-command");
        die_with_worker(&mut cmd, None, Some(announcement.fd()));
        assert!(cmd.spawn().is_err());
        let pid = announcement.pid().expect("the child announced itself");
        assert!(pid > 1);
        assert_ne!(pid, std::process::id());
    }

    #[test]
    fn tail_starts_at_a_char_boundary() {
        let text = "é boom\n".as_bytes();
        assert_eq!(tail_text(&text[1..]), "boom");
        assert_eq!(tail_text(b""), "");
    }

    #[cfg(unix)]
    #[test]
    fn exit_statuses_read_well() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)), "exit status 3");
        assert_eq!(describe(ExitStatus::from_raw(9)), "killed by signal 9");
    }
}
