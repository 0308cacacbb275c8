//! `jobq enqueue`: add one job, or many from a JSON-lines file.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use jobq_client::{pb, Client, EnqueueOptions, EnqueueOutcome, KeyScope};
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;

use crate::cli::usage;
use crate::output::{receipt_json, status_name, Out, Table};
use jobq::code_name;

/// Most entries per EnqueueBatch call (the server's default `--max-batch`).
const BATCH_CHUNK: usize = 1000;

/// Most request bytes per EnqueueBatch call, a quarter of the server's
/// default `--max-message-bytes`: big payloads go in smaller calls instead
/// of one the server refuses whole.
const BATCH_BYTES: usize = 4 * 1024 * 1024;

/// About what one entry adds to an EnqueueBatch request.
fn entry_bytes(req: &pb::EnqueueRequest) -> usize {
    let metadata: usize = req
        .metadata
        .iter()
        .map(|(k, v)| k.len() + v.len() + 8)
        .sum();
    req.payload.len() + req.queue.len() + req.kind.len() + req.key.len() + metadata + 64
}

/// Options of `jobq enqueue`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The queue to add the job to.
    #[arg(required_unless_present = "batch_file")]
    queue: Option<String>,

    /// The job's kind (which handler runs it).
    #[arg(required_unless_present = "batch_file")]
    kind: Option<String>,

    /// The payload, as given. Without --payload or --payload-file the
    /// payload is read from stdin when stdin is not a terminal, and is empty
    /// otherwise.
    #[arg(long, conflicts_with = "payload_file")]
    payload: Option<String>,

    /// Read the payload from FILE.
    #[arg(long, value_name = "FILE")]
    payload_file: Option<PathBuf>,

    /// Domain key: when a retained job in the queue has it, that job is
    /// returned and nothing is added.
    #[arg(long)]
    key: Option<String>,

    /// Which jobs hold the key: `retained` (any job until it is deleted or
    /// purged; the default) or `active` (PENDING and RUNNING ones: "unique
    /// until finished").
    #[arg(long, value_name = "SCOPE", value_parser = ["retained", "active"], requires = "key")]
    key_scope: Option<String>,

    /// Debounce: a PENDING job with the key takes this payload and
    /// metadata, and is due after --delay (a RUNNING one gets a successor,
    /// a new job that takes the key over).
    #[arg(long, requires = "key")]
    replace: bool,

    /// Throttle: the key is held this long after its job's enqueue
    /// (1h, 10m), whatever the job's state, and no longer.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, requires = "key")]
    unique_for: Option<Duration>,

    /// Attempts before the job is dead-lettered (default: the server's).
    #[arg(long, value_name = "N")]
    max_attempts: Option<u32>,

    /// Snoozes its handlers may take before a snooze counts as a failed
    /// attempt (default 100; 0: every snooze counts).
    #[arg(long, value_name = "N")]
    max_snoozes: Option<u32>,

    /// Run no earlier than this from now (30s, 5m, 2h).
    #[arg(long, value_parser = humantime::parse_duration)]
    delay: Option<Duration>,

    /// Delivery priority, -100..=100: among the due jobs of the queue,
    /// higher goes first (default 0).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    priority: i32,

    /// The job's group (a tenant, a customer id): a queue policy's
    /// --group-max-running limits how many of one group run at once.
    #[arg(long)]
    group: Option<String>,

    /// Attach metadata (repeatable): a request id, a tenant tag. Stored with
    /// the job and shown by `jobq get`.
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = key_value)]
    meta: Vec<(String, String)>,

    /// Enqueue every line of FILE ("-" for stdin), JSON objects with
    /// "queue", "kind" and optional "payload" (a string), "key",
    /// "max_attempts", "max_snoozes", "delay" ("30s"), "priority", "group",
    /// "key_scope" ("active"), "replace" (true), "unique_for" ("1h").
    /// Sent with EnqueueBatch, 1000 per call; prints one result per line.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["queue", "kind", "payload", "payload_file", "key", "key_scope", "replace", "unique_for", "max_attempts", "max_snoozes", "delay", "meta", "priority", "group"]
    )]
    batch_file: Option<PathBuf>,
}

/// `KEY=VALUE` from the command line.
fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// Runs `jobq enqueue`.
pub async fn run(client: &Client, out: Out, args: Args) -> anyhow::Result<()> {
    if let Some(path) = &args.batch_file {
        return batch(client, out, path).await;
    }
    let (Some(queue), Some(kind)) = (args.queue, args.kind) else {
        return Err(usage("QUEUE and KIND are required without --batch-file"));
    };
    let payload = read_payload(args.payload, args.payload_file.as_deref())?;
    let mut opts = EnqueueOptions::new();
    if let Some(key) = args.key {
        opts = opts.key(key);
    }
    opts = key_rules(
        opts,
        args.key_scope.as_deref(),
        args.replace,
        args.unique_for,
    )?;
    if let Some(n) = args.max_attempts {
        opts = opts.max_attempts(n);
    }
    if let Some(n) = args.max_snoozes {
        opts = opts.max_snoozes(n);
    }
    if let Some(delay) = args.delay {
        opts = opts.delay(delay);
    }
    opts = opts.priority(args.priority);
    if let Some(group) = args.group {
        opts = opts.group(group);
    }
    for (key, value) in args.meta {
        opts = opts.metadata(key, value);
    }
    let enqueued = client
        .submit(queue, kind, payload, opts)
        .instrument(tracing::info_span!("jobq enqueue"))
        .await?;
    let (created, outcome) = (enqueued.created, enqueued.outcome);
    let job = enqueued.job.into_proto();
    if out.json {
        out.json(&json!({
            "created": created,
            "outcome": outcome_name(outcome),
            "job": receipt_json(&job),
        }))?;
        return Ok(());
    }
    // The id alone on stdout, so `ID=$(jobq enqueue ...)` works either way.
    out.line(&job.id)?;
    match outcome {
        EnqueueOutcome::Created => {}
        EnqueueOutcome::Existing => eprintln!(
            "existing job: key {:?} already names job {} ({}) in queue {}; nothing was enqueued",
            job.key,
            job.id,
            status_name(job.status),
            job.queue
        ),
        EnqueueOutcome::Replaced => eprintln!(
            "replaced: job {} with key {:?} in queue {} was PENDING and takes this payload",
            job.id, job.key, job.queue
        ),
    }
    Ok(())
}

/// The name of an enqueue's outcome, as `--json` prints it.
pub fn outcome_name(outcome: EnqueueOutcome) -> &'static str {
    match outcome {
        EnqueueOutcome::Created => "CREATED",
        EnqueueOutcome::Existing => "EXISTING",
        EnqueueOutcome::Replaced => "REPLACED",
    }
}

/// A key's rules from `--key-scope`, `--replace` and `--unique-for` (or a
/// batch line's).
fn key_rules(
    mut opts: EnqueueOptions,
    scope: Option<&str>,
    replace: bool,
    unique_for: Option<Duration>,
) -> anyhow::Result<EnqueueOptions> {
    match scope {
        None | Some("retained") => {}
        Some("active") => opts = opts.key_scope(KeyScope::Active),
        Some(other) => anyhow::bail!("key_scope {other:?}: expected \"retained\" or \"active\""),
    }
    if replace {
        opts = opts.replace();
    }
    if let Some(window) = unique_for {
        opts = opts.unique_for(window);
    }
    Ok(opts)
}

/// The payload from `--payload`, `--payload-file`, or a piped stdin.
fn read_payload(payload: Option<String>, file: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    if let Some(text) = payload {
        return Ok(text.into_bytes());
    }
    if let Some(path) = file {
        return std::fs::read(path).with_context(|| format!("read {}", path.display()));
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Ok(Vec::new());
    }
    let mut buf = Vec::new();
    stdin
        .lock()
        .read_to_end(&mut buf)
        .context("read payload from stdin")?;
    Ok(buf)
}

/// One line of a `--batch-file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchLine {
    queue: String,
    kind: String,
    #[serde(default)]
    payload: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    max_snoozes: Option<u32>,
    #[serde(default)]
    key_scope: Option<String>,
    #[serde(default)]
    replace: bool,
    #[serde(default)]
    unique_for: Option<String>,
    #[serde(default)]
    delay: Option<String>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    group: Option<String>,
}

impl BatchLine {
    fn into_request(self) -> anyhow::Result<pb::EnqueueRequest> {
        let mut opts = EnqueueOptions::new().priority(self.priority);
        if let Some(key) = self.key.filter(|k| !k.is_empty()) {
            opts = opts.key(key);
        }
        if let Some(n) = self.max_attempts {
            opts = opts.max_attempts(n);
        }
        if let Some(n) = self.max_snoozes {
            opts = opts.max_snoozes(n);
        }
        let unique_for = self
            .unique_for
            .map(|w| humantime::parse_duration(&w).with_context(|| format!("unique_for {w:?}")))
            .transpose()?;
        opts = key_rules(opts, self.key_scope.as_deref(), self.replace, unique_for)?;
        if let Some(group) = self.group.filter(|g| !g.is_empty()) {
            opts = opts.group(group);
        }
        if let Some(delay) = self.delay {
            let delay =
                humantime::parse_duration(&delay).with_context(|| format!("delay {delay:?}"))?;
            opts = opts.delay(delay);
        }
        Ok(opts.into_request(self.queue, self.kind, self.payload))
    }
}

/// Parses the whole file first, so a malformed line sends nothing.
fn parse_batch(text: &str) -> anyhow::Result<Vec<(usize, pb::EnqueueRequest)>> {
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: BatchLine =
            serde_json::from_str(line).with_context(|| format!("line {n}: not a job"))?;
        entries.push((
            n,
            parsed.into_request().with_context(|| format!("line {n}"))?,
        ));
    }
    Ok(entries)
}

async fn batch(client: &Client, out: Out, path: &Path) -> anyhow::Result<()> {
    let text = if path == Path::new("-") {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("read batch from stdin")?;
        s
    } else {
        std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?
    };
    let entries = parse_batch(&text).with_context(|| format!("{}", path.display()))?;
    let total = entries.len();
    let mut table = Table::new(["LINE", "ID", "RESULT"]);
    let mut rejected = 0usize;
    let mut sent = 0usize;
    let mut failure = None;
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        // Up to BATCH_CHUNK entries and BATCH_BYTES, and at least one.
        let mut chunk = Vec::new();
        let mut bytes = 0;
        while let Some((_, req)) = entries.peek() {
            let size = entry_bytes(req);
            if !chunk.is_empty() && (chunk.len() == BATCH_CHUNK || bytes + size > BATCH_BYTES) {
                break;
            }
            bytes += size;
            chunk.extend(entries.next());
        }
        let (lines, reqs): (Vec<usize>, Vec<_>) = chunk.into_iter().unzip();
        let results = match client.enqueue_batch(reqs).await {
            Ok(results) => results,
            Err(err) => {
                failure = Some((lines[0], err));
                break;
            }
        };
        sent += lines.len();
        for (line, result) in lines.into_iter().zip(results) {
            match (&result.job, result.error_code) {
                (Some(job), 0) => {
                    let outcome = EnqueueOutcome::of(result.outcome, result.created);
                    if out.json {
                        out.json(&json!({
                            "line": line,
                            "created": result.created,
                            "outcome": outcome_name(outcome),
                            "job": receipt_json(job),
                        }))?;
                    } else {
                        let what = outcome_name(outcome).to_lowercase();
                        table.row([line.to_string(), job.id.clone(), what]);
                    }
                }
                _ => {
                    rejected += 1;
                    let code = code_name(tonic::Code::from(result.error_code));
                    if out.json {
                        out.json(&json!({"line": line, "error": {"code": code, "message": result.error_message}}))?;
                    } else {
                        table.row([
                            line.to_string(),
                            "-".to_owned(),
                            format!("error: {code}: {}", result.error_message),
                        ]);
                    }
                }
            }
        }
    }
    if !out.json && !table.is_empty() {
        out.table(&table)?;
    }
    if let Some((line, err)) = failure {
        return Err(anyhow::Error::from(err).context(format!(
            "batch from line {line} not sent ({sent} of {total} entries were sent before it)"
        )));
    }
    if rejected > 0 {
        bail!("{rejected} of {total} entries were rejected");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_lines_become_requests() {
        let text = r#"{"queue":"q","kind":"k","payload":"p","key":"o-1","max_attempts":2,"delay":"5m"}

{"queue":"q","kind":"k"}"#;
        let entries = parse_batch(text).unwrap();
        assert_eq!(entries.len(), 2);
        let (line, req) = &entries[0];
        assert_eq!(*line, 1);
        assert_eq!(
            (req.key.as_str(), req.max_attempts, req.payload.as_slice()),
            ("o-1", 2, &b"p"[..])
        );
        assert_eq!(req.delay.map(|d| d.seconds), Some(300));
        assert_eq!(entries[1].0, 3);
        assert_eq!(entries[1].1.payload, b"");
    }

    #[test]
    fn malformed_lines_name_their_number() {
        let err = parse_batch("{\"queue\":\"q\",\"kind\":\"k\"}\n{\"queue\":1}").unwrap_err();
        assert!(format!("{err:#}").starts_with("line 2"), "{err:#}");
        let err = parse_batch(r#"{"queue":"q","kind":"k","delay":"soon"}"#).unwrap_err();
        assert!(format!("{err:#}").contains("delay"), "{err:#}");
    }
}
