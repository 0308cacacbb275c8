//! Rendering for the client commands: aligned tables for people, JSON for
//! scripts (`--json`), and the readable names of the wire enums.
//!
//! Everything goes through [`Out`], which writes to stdout and returns
//! errors instead of panicking, so `jobq list | head` ends quietly (see
//! `exit.rs`, which treats a broken pipe as success).

use std::io::{self, Write};
use std::time::{Duration, SystemTime};

use jobq_client::pb;
use serde_json::{json, Value};

/// Where command output goes, and in which form.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    /// `--json`: one JSON document per result instead of text.
    pub json: bool,
}

impl Out {
    /// Writes one line of text to stdout.
    pub fn line(&self, text: impl AsRef<str>) -> io::Result<()> {
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "{}", text.as_ref())?;
        stdout.flush()
    }

    /// Writes `text` to stdout as it is (no newline).
    pub fn raw(&self, text: &str) -> io::Result<()> {
        let mut stdout = io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()
    }

    /// Writes `value` as one line of JSON to stdout.
    pub fn json(&self, value: &Value) -> io::Result<()> {
        self.line(value.to_string())
    }

    /// Writes `table` to stdout.
    pub fn table(&self, table: &Table) -> io::Result<()> {
        let mut stdout = io::stdout().lock();
        table.write(&mut stdout)?;
        stdout.flush()
    }
}

/// A table whose columns are padded to their widest cell.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<I, S>(header: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (one cell per column). Control characters in a cell
    /// (a multi-line error, a payload with escape sequences) are shown
    /// escaped (`\n`, `\u{1b}`): a row stays one line, the columns stay
    /// aligned, and a job's text cannot drive the terminal. `--json` has
    /// the exact text.
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows
            .push(cells.into_iter().map(|c| one_line(c.into())).collect());
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Writes the header and rows, columns separated by two spaces; the last
    /// column is not padded, so lines carry no trailing blanks.
    pub fn write(&self, w: &mut impl Write) -> io::Result<()> {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                let n = cell.chars().count();
                match widths.get_mut(i) {
                    Some(w) => *w = (*w).max(n),
                    None => widths.push(n),
                }
            }
        }
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 < row.len() {
                    line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
                } else {
                    line.push_str(cell);
                }
            }
            writeln!(w, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// `PENDING`, `RUNNING`, `DONE`, `FAILED` (or `UNSPECIFIED`).
pub fn status_name(status: i32) -> &'static str {
    match pb::JobStatus::try_from(status) {
        Ok(pb::JobStatus::Pending) => "PENDING",
        Ok(pb::JobStatus::Running) => "RUNNING",
        Ok(pb::JobStatus::Done) => "DONE",
        Ok(pb::JobStatus::Failed) => "FAILED",
        Ok(pb::JobStatus::Unspecified) | Err(_) => "UNSPECIFIED",
    }
}

/// `ACKED`, `FAILED`, `LEASE_EXPIRED`, ...; `RUNNING` for an attempt that
/// has not ended (the proto's UNSPECIFIED).
pub fn outcome_name(outcome: i32) -> &'static str {
    match pb::AttemptOutcome::try_from(outcome) {
        Ok(pb::AttemptOutcome::Acked) => "ACKED",
        Ok(pb::AttemptOutcome::Failed) => "FAILED",
        Ok(pb::AttemptOutcome::LeaseExpired) => "LEASE_EXPIRED",
        Ok(pb::AttemptOutcome::WorkerDisconnected) => "WORKER_DISCONNECTED",
        Ok(pb::AttemptOutcome::Revoked) => "REVOKED",
        Ok(pb::AttemptOutcome::Snoozed) => "SNOOZED",
        Ok(pb::AttemptOutcome::Unspecified) | Err(_) => "RUNNING",
    }
}

fn system_time(ts: Option<&prost_types::Timestamp>) -> Option<SystemTime> {
    ts.and_then(|ts| SystemTime::try_from(*ts).ok())
}

/// RFC 3339 with the server's precision, or JSON `null` when unset.
pub fn timestamp_json(ts: Option<&prost_types::Timestamp>) -> Value {
    match system_time(ts) {
        Some(t) => Value::String(humantime::format_rfc3339(t).to_string()),
        None => Value::Null,
    }
}

/// RFC 3339 to the second, or `-` when unset: for tables.
pub fn timestamp_text(ts: Option<&prost_types::Timestamp>) -> String {
    match system_time(ts) {
        Some(t) => humantime::format_rfc3339_seconds(t).to_string(),
        None => "-".to_owned(),
    }
}

/// A protobuf duration as std, negative ones as zero.
pub fn std_duration(d: Option<&prost_types::Duration>) -> Option<Duration> {
    d.map(|d| Duration::try_from(*d).unwrap_or_default())
}

/// A duration for people, rounded to whole seconds (`1h 2m 3s`), or `-`.
pub fn duration_text(d: Option<Duration>) -> String {
    match d {
        Some(d) => humantime::format_duration(Duration::from_secs(d.as_secs())).to_string(),
        None => "-".to_owned(),
    }
}

/// `text` with its control characters escaped, as Rust writes them.
fn one_line(text: String) -> String {
    if !text.chars().any(char::is_control) {
        return text;
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `text`, or `-` when empty: tables show no blank cells.
pub fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}

/// A progress report as `40% row 4,000 of 10,000` (a message of several
/// lines on one).
pub fn progress_text(p: &pb::Progress) -> String {
    let message = p.message.replace(['\n', '\r'], " ");
    if message.is_empty() {
        format!("{}%", p.percent)
    } else {
        format!("{}% {message}", p.percent)
    }
}

/// `text` cut to `max` characters with an ellipsis, on one line.
pub fn truncate(text: &str, max: usize) -> String {
    let one_line = text.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The payload as text when it is UTF-8; otherwise `None`.
fn payload_text(payload: &[u8]) -> Option<&str> {
    std::str::from_utf8(payload).ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A job as a JSON object: readable status and outcome names, RFC 3339
/// times (`null` when unset), `key`/`worker_id`/`last_error` as `null` when
/// empty. The payload is `payload` (a string) when it is UTF-8, otherwise
/// `payload_hex`; a DONE job's result (GetJob only) is `result` or
/// `result_hex` alike, and absent when there is none.
pub fn job_json(job: &pb::Job) -> Value {
    let empty_null = |s: &str| {
        if s.is_empty() {
            Value::Null
        } else {
            Value::String(s.to_owned())
        }
    };
    let history: Vec<Value> = job
        .history
        .iter()
        .map(|a| {
            json!({
                "worker_id": a.worker_id,
                "started_at": timestamp_json(a.started_at.as_ref()),
                "ended_at": timestamp_json(a.ended_at.as_ref()),
                "outcome": outcome_name(a.outcome),
                "error": empty_null(&a.error),
            })
        })
        .collect();
    let mut v = json!({
        "id": job.id,
        "queue": job.queue,
        "kind": job.kind,
        "key": empty_null(&job.key),
        "status": status_name(job.status),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "snoozes": job.snoozes,
        "max_snoozes": job.max_snoozes,
        "priority": job.priority,
        "group": empty_null(&job.group),
        "enqueued_at": timestamp_json(job.enqueued_at.as_ref()),
        "run_at": timestamp_json(job.run_at.as_ref()),
        "taken_at": timestamp_json(job.taken_at.as_ref()),
        "lease_expires_at": timestamp_json(job.lease_expires_at.as_ref()),
        "finished_at": timestamp_json(job.finished_at.as_ref()),
        "worker_id": empty_null(&job.worker_id),
        "last_error": empty_null(&job.last_error),
        "history": history,
        "metadata": job.metadata.iter().collect::<std::collections::BTreeMap<_, _>>(),
    });
    match payload_text(&job.payload) {
        Some(text) => v["payload"] = Value::String(text.to_owned()),
        None => v["payload_hex"] = Value::String(hex(&job.payload)),
    }
    if let Some(p) = &job.progress {
        v["progress"] = json!({
            "percent": p.percent,
            "message": p.message,
            "reported_at": timestamp_json(p.reported_at.as_ref()),
        });
    }
    if !job.result.is_empty() {
        match payload_text(&job.result) {
            Some(text) => v["result"] = Value::String(text.to_owned()),
            None => v["result_hex"] = Value::String(hex(&job.result)),
        }
    }
    v
}

/// A job from a write's reply (enqueue) as JSON: like [`job_json`], but
/// without `payload` and `history`, which such replies never carry (the
/// server does not echo what it was sent).
pub fn receipt_json(job: &pb::Job) -> Value {
    let mut v = job_json(job);
    if let Some(fields) = v.as_object_mut() {
        for absent in ["payload", "payload_hex", "history"] {
            fields.remove(absent);
        }
    }
    v
}

/// The payload for people: the text, or `<N bytes, not UTF-8>`.
pub fn payload_display(payload: &[u8]) -> String {
    match payload_text(payload) {
        Some(text) => text.to_owned(),
        None => format!("<{} bytes, not UTF-8: {}>", payload.len(), hex(payload)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_without_trailing_blanks() {
        let mut t = Table::new(["ID", "STATUS", "KEY"]);
        t.row(["1", "PENDING", "-"]);
        t.row(["1234", "DONE", "order-1"]);
        let mut buf = Vec::new();
        t.write(&mut buf).unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "ID    STATUS   KEY\n1     PENDING  -\n1234  DONE     order-1\n"
        );
    }

    #[test]
    fn a_cell_with_control_characters_stays_on_one_line() {
        let mut t = Table::new(["#", "ERROR"]);
        t.row(["1", "exit 1\nstderr: boom\r\n\x1b[31mred"]);
        t.row(["2", "-"]);
        let mut buf = Vec::new();
        t.write(&mut buf).unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "#  ERROR\n1  exit 1\\nstderr: boom\\r\\n\\u{1b}[31mred\n2  -\n"
        );
    }

    #[test]
    fn job_json_is_readable() {
        let job = pb::Job {
            id: "j1".into(),
            queue: "q".into(),
            kind: "k".into(),
            payload: b"hi".to_vec(),
            status: pb::JobStatus::Failed as i32,
            enqueued_at: Some(prost_types::Timestamp {
                seconds: 0,
                nanos: 0,
            }),
            history: vec![pb::Attempt {
                worker_id: "w".into(),
                outcome: pb::AttemptOutcome::LeaseExpired as i32,
                error: "lease expired".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = job_json(&job);
        assert_eq!(v["status"], "FAILED");
        assert_eq!(v["payload"], "hi");
        assert_eq!(v["key"], Value::Null);
        assert_eq!(v["enqueued_at"], "1970-01-01T00:00:00Z");
        assert_eq!(v["run_at"], Value::Null);
        assert_eq!(v["history"][0]["outcome"], "LEASE_EXPIRED");
        let binary = job_json(&pb::Job {
            payload: vec![0xff, 0x00],
            ..Default::default()
        });
        assert_eq!(binary["payload_hex"], "ff00");
        assert!(binary.get("payload").is_none());
    }

    #[test]
    fn truncate_keeps_one_line() {
        assert_eq!(truncate("a\nb", 10), "a b");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }
}
