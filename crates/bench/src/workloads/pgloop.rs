//! The yardstick on PostgreSQL: a plain `SKIP LOCKED` job loop, run by the
//! bench itself against the same database as the server under test, in
//! the same run, so the two can be compared side by side
//! (docs/src/benchmarks.md).
//!
//! One table of its own (`jobq_bench_loop`: id, queue, status, payload,
//! run_at, with a partial index of the pending jobs like jobq's), one
//! connection per producer and per worker, every statement its own
//! transaction with `synchronous_commit` as the database has it:
//! - A: `INSERT` one job at a time;
//! - B: `SELECT … FOR UPDATE SKIP LOCKED LIMIT 1` and `UPDATE` to take (one
//!   transaction), `UPDATE` to ack (another), capacity 1; before and after
//!   `ANALYZE`;
//! - C: the producer `INSERT`s at `--rate` with a `pg_notify` in the same
//!   statement; each worker `LISTEN`s, takes until the queue is empty, then
//!   waits for a notification (or 100 ms).

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use tokio::task::JoinSet;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use super::{join_all, Tickets};
use crate::{hist::Latencies, progress::Progress, stamp, BenchArgs, Outcome, Workload};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS jobq_bench_loop ( \
       id bigserial PRIMARY KEY, queue text NOT NULL, status text NOT NULL DEFAULT 'pending', \
       payload bytea NOT NULL, run_at timestamptz NOT NULL DEFAULT now(), \
       taken_at timestamptz, worker text); \
     CREATE INDEX IF NOT EXISTS jobq_bench_loop_due ON jobq_bench_loop (queue, run_at, id) \
       WHERE status = 'pending'";

const INSERT: &str = "INSERT INTO jobq_bench_loop (queue, payload) VALUES ($1, $2)";

const TAKE: &str = "SELECT id, payload FROM jobq_bench_loop WHERE status = 'pending' \
     AND queue = $1 AND run_at <= now() ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED";

const MARK: &str =
    "UPDATE jobq_bench_loop SET status = 'running', taken_at = now(), worker = $2 WHERE id = $1";

const ACK: &str = "UPDATE jobq_bench_loop SET status = 'done' WHERE id = $1";

/// The channel the loop's C notifies.
const CHANNEL: &str = "jobq_bench_loop";

/// Connects one session (its driver runs in a task of its own).
async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .context("connecting to the --pg database")?;
    tokio::spawn(connection);
    Ok(client)
}

/// Creates the loop's table (kept between runs; each run uses queues of
/// its own).
async fn schema(url: &str) -> anyhow::Result<()> {
    connect(url).await?.batch_execute(SCHEMA).await?;
    Ok(())
}

/// Runs `ANALYZE` on `table`.
pub async fn analyze(url: &str, table: &str) -> anyhow::Result<()> {
    connect(url)
        .await?
        .batch_execute(&format!("ANALYZE {table}"))
        .await?;
    Ok(())
}

/// Runs one of the loop's workloads against `url`.
pub async fn run(
    workload: Workload,
    args: &BenchArgs,
    url: &str,
    queue: &str,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    schema(url).await?;
    match workload {
        Workload::LoopEnqueue => enqueue(workload, args, url, queue, progress).await,
        Workload::LoopDrain => drain(workload, args, url, queue, false, progress).await,
        Workload::LoopDrainAnalyzed => drain(workload, args, url, queue, true, progress).await,
        Workload::LoopLatency => latency(workload, args, url, queue, progress).await,
        other => anyhow::bail!("{} is not a loop workload", other.name()),
    }
}

async fn enqueue(
    workload: Workload,
    args: &BenchArgs,
    url: &str,
    queue: &str,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    let bar = progress.bar(workload.name(), args.jobs);
    let mut clients = Vec::new();
    for _ in 0..args.producers.max(1) {
        clients.push(connect(url).await?);
    }
    let tickets = Tickets::new(args.jobs);
    let start = Instant::now();
    let mut set = JoinSet::new();
    for client in clients {
        let (queue, tickets, bar) = (queue.to_owned(), tickets.clone(), bar.clone());
        let payload = vec![b'x'; args.payload_bytes];
        set.spawn(async move {
            let stmt = client.prepare(INSERT).await?;
            let mut rpc = Latencies::default();
            while tickets.take(1).is_some() {
                let sent = Instant::now();
                client.execute(&stmt, &[&queue, &payload]).await?;
                rpc.record(sent.elapsed());
                bar.inc(1);
            }
            anyhow::Ok(rpc)
        });
    }
    let mut rpc = Latencies::default();
    for r in join_all(set).await? {
        rpc.merge(&r);
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    Ok(
        Outcome::new(workload, args.jobs, elapsed, "insert", rpc.summary())
            .param("producers", args.producers)
            .param("payload_bytes", args.payload_bytes),
    )
}

/// A worker's connection and its prepared statements.
struct Session {
    client: Client,
    take: tokio_postgres::Statement,
    mark: tokio_postgres::Statement,
    ack: tokio_postgres::Statement,
}

impl Session {
    async fn of(client: Client) -> anyhow::Result<Session> {
        let take = client.prepare(TAKE).await?;
        let mark = client.prepare(MARK).await?;
        let ack = client.prepare(ACK).await?;
        Ok(Session {
            client,
            take,
            mark,
            ack,
        })
    }

    /// Takes one job in a transaction of its own: its id and payload.
    async fn take(&mut self, queue: &str, worker: &str) -> anyhow::Result<Option<(i64, Vec<u8>)>> {
        let tx = self.client.transaction().await?;
        let Some(row) = tx.query_opt(&self.take, &[&queue]).await? else {
            tx.commit().await?;
            return Ok(None);
        };
        let id: i64 = row.try_get(0)?;
        tx.execute(&self.mark, &[&id, &worker]).await?;
        tx.commit().await?;
        Ok(Some((id, row.try_get(1)?)))
    }

    /// Acks a job (its own transaction); the time it took.
    async fn ack(&self, id: i64) -> anyhow::Result<Duration> {
        let sent = Instant::now();
        self.client.execute(&self.ack, &[&id]).await?;
        Ok(sent.elapsed())
    }
}

async fn drain(
    workload: Workload,
    args: &BenchArgs,
    url: &str,
    queue: &str,
    analyzed: bool,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    // The fill, untimed: batches of --batch-size rows.
    let filler = connect(url).await?;
    let payload = vec![b'x'; args.payload_bytes];
    let mut left = args.jobs;
    while left > 0 {
        let n = left.min(args.batch_size.max(1) as u64);
        filler
            .execute(
                "INSERT INTO jobq_bench_loop (queue, payload) \
                 SELECT $1, $2 FROM generate_series(1, $3::bigint)",
                &[&queue, &payload, &(n as i64)],
            )
            .await?;
        left -= n;
    }
    if analyzed {
        filler.batch_execute("ANALYZE jobq_bench_loop").await?;
    }
    let bar = progress.bar(workload.name(), args.jobs);
    let mut clients = Vec::new();
    for _ in 0..args.workers.max(1) {
        clients.push(connect(url).await?);
    }
    let start = Instant::now();
    let mut set = JoinSet::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (queue, bar) = (queue.to_owned(), bar.clone());
        let mut session = Session::of(client).await?;
        set.spawn(async move {
            let worker = format!("loop-{i}");
            let (mut acks, mut n) = (Latencies::default(), 0u64);
            while let Some((id, _)) = session.take(&queue, &worker).await? {
                acks.record(session.ack(id).await?);
                bar.inc(1);
                n += 1;
            }
            anyhow::Ok((acks, n))
        });
    }
    let (mut acks, mut total) = (Latencies::default(), 0);
    for (a, n) in join_all(set).await? {
        acks.merge(&a);
        total += n;
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    anyhow::ensure!(
        total == args.jobs,
        "the loop drained {total} of {} jobs",
        args.jobs
    );
    Ok(
        Outcome::new(workload, total, elapsed, "ack", acks.summary())
            .param("workers", args.workers)
            .param("capacity", 1)
            .param("analyzed", analyzed),
    )
}

async fn latency(
    workload: Workload,
    args: &BenchArgs,
    url: &str,
    queue: &str,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    anyhow::ensure!(args.rate > 0, "--rate must be at least 1");
    let total = args.latency_jobs;
    let bar = progress.bar(workload.name(), total);
    let done = tokio_util::sync::CancellationToken::new();
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = JoinSet::new();
    let mut ready = Vec::new();
    for i in 0..args.latency_workers.max(1) {
        let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
        let (notes_tx, mut notes) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(m)) = messages.next().await {
                if let AsyncMessage::Notification(_) = m {
                    let _ = notes_tx.send(());
                }
            }
        });
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        let mut session = Session::of(client).await?;
        let (queue, bar, done, taken) =
            (queue.to_owned(), bar.clone(), done.clone(), taken.clone());
        let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
        ready.push(go_tx);
        workers.spawn(async move {
            let _ = go.await;
            let worker = format!("loop-{i}");
            let (mut delivered, mut acked) = (Latencies::default(), Latencies::default());
            loop {
                while let Some((id, payload)) = session.take(&queue, &worker).await? {
                    if let Some(age) = stamp::age(&payload) {
                        delivered.record(age);
                    }
                    session.ack(id).await?;
                    if let Some(age) = stamp::age(&payload) {
                        acked.record(age);
                    }
                    bar.inc(1);
                    if taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 >= total {
                        done.cancel();
                    }
                }
                tokio::select! {
                    () = done.cancelled() => break,
                    _ = notes.recv() => {}
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                while notes.try_recv().is_ok() {}
            }
            anyhow::Ok((delivered, acked))
        });
    }
    for go in ready {
        let _ = go.send(());
    }
    let producer = std::sync::Arc::new(connect(url).await?);
    let insert = producer
        .prepare(&format!(
            "WITH j AS (INSERT INTO jobq_bench_loop (queue, payload) VALUES ($1, $2) RETURNING id) \
             SELECT pg_notify('{CHANNEL}', '') FROM j"
        ))
        .await?;
    let rpc = std::sync::Arc::new(std::sync::Mutex::new(Latencies::default()));
    let mut lag = Latencies::default();
    let period = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let start = Instant::now();
    // Open loop, as jobq's C: send `k` goes out at `start + k / rate`
    // whatever the replies do (one connection, statements pipelined).
    let mut sends = JoinSet::new();
    for seq in 0..total {
        let due = start + period.mul_f64(seq as f64);
        tokio::time::sleep_until(due.into()).await;
        let payload = stamp::payload(args.payload_bytes, seq);
        let sent = Instant::now();
        lag.record(sent.saturating_duration_since(due));
        let (producer, insert, queue, rpc) = (
            producer.clone(),
            insert.clone(),
            queue.to_owned(),
            rpc.clone(),
        );
        sends.spawn(async move {
            producer.query(&insert, &[&queue, &payload]).await?;
            rpc.lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(sent.elapsed());
            anyhow::Ok(())
        });
        while let Some(done) = sends.try_join_next() {
            done??;
        }
    }
    join_all(sends).await?;
    let rpc = rpc.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let sent_in = start.elapsed();
    let (mut delivered, mut acked) = (Latencies::default(), Latencies::default());
    for (d, a) in join_all(workers).await? {
        delivered.merge(&d);
        acked.merge(&a);
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    Ok(Outcome::new(
        workload,
        total,
        elapsed,
        "enqueue_to_delivered",
        delivered.summary(),
    )
    .extra("enqueue_rpc", rpc.summary())
    .extra("enqueue_to_acked", acked.summary())
    .extra("send_lag", lag.summary())
    .param("rate", args.rate)
    .param(
        "achieved_rate",
        (total as f64 / sent_in.as_secs_f64()).round(),
    )
    .param("workers", args.latency_workers)
    .param("capacity", 1))
}
