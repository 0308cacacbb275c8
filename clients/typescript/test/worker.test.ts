// The Worker against a real `jobq serve`, in process: ack, retry (with and
// without a delay), progress, fatal, an unknown kind, cancel, the drain deadline, a
// refused stream, heartbeats, $JOBQ_SERVER and trace context.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  Client,
  HandlerError,
  JobFailedError,
  type JobContext,
  JobqError,
  JobStatus,
  WaitTimeoutError,
  Worker,
  type WorkerOptions,
} from "../src/index.js";
import { outcomes, removeDir, Server, tempDir, waitFor } from "./harness.js";

type Kinds = { "send-email": { order: string }; k: unknown };

let dir: string;
let server: Server;
let client: Client<Kinds>;

before(async () => {
  dir = tempDir("worker");
  server = await Server.start(dir);
  client = new Client<Kinds>({ server: server.url });
  await client.waitReady();
});

after(async () => {
  client?.close();
  await server?.stop();
  removeDir(dir);
});

/** Runs a worker until `body` returns, then drains it. */
async function running<T>(options: WorkerOptions<Kinds>, body: (w: Worker<Kinds>) => Promise<T>, on: Client<Kinds> = client): Promise<T> {
  const worker = new Worker(on, { handleSignals: false, ...options });
  const run = worker.run();
  try {
    return await body(worker);
  } finally {
    worker.stop();
    await run;
  }
}

const status = async (id: string, c: Client<Kinds> = client): Promise<JobStatus | -1> => {
  try {
    return (await c.getJob(id)).status;
  } catch {
    return -1; // the server is coming back
  }
};

test("ack: a handler that resolves acks its job; the context is typed and attempt is 1-based", async () => {
  const seen: JobContext<Kinds["send-email"]>[] = [];
  const { job, created } = await client.enqueue("ack", "send-email", { order: "order-1" }, { key: "order-1" });
  assert.ok(created);
  await running({ queues: ["ack"], handlers: { "send-email": async (ctx) => void seen.push(ctx) }, leaseMs: 10_000 }, () =>
    waitFor(async () => (await status(job.id)) === JobStatus.DONE, 20_000, "the job DONE"),
  );
  const ctx = seen[0]!;
  assert.equal(seen.length, 1);
  assert.deepEqual([ctx.id, ctx.queue, ctx.kind, ctx.key, ctx.attempt], [job.id, "ack", "send-email", "order-1", 1]);
  assert.deepEqual(ctx.data, { order: "order-1" });
  assert.ok(ctx.leaseId !== "" && ctx.leaseExpiresAt.getTime() > Date.now() - 60_000 && !ctx.cancelled);
  assert.deepEqual(outcomes(await client.getJob(job.id)), ["ACKED"]);
  // The same key again: the existing job, nothing added.
  const again = await client.enqueue("ack", "send-email", { order: "order-1" }, { key: "order-1" });
  assert.equal(again.created, false);
  assert.equal(again.job.id, job.id);
});

test("retry: a handler that throws fails its job retryably; a retry delay is the server's run_at", async () => {
  const attempts: number[] = [];
  const { job } = await client.enqueue("retry", "k", {});
  const { job: later } = await client.enqueue("retry-later", "k", {});
  await running(
    {
      queues: ["retry", "retry-later"],
      handlers: {
        k: async (ctx) => {
          if (ctx.queue === "retry-later") throw HandlerError.retryAfter("smtp said 421", 60_000);
          attempts.push(ctx.attempt);
          if (ctx.attempt === 1) throw new Error("first attempt fails");
        },
      },
      leaseMs: 10_000,
    },
    () =>
      waitFor(
        async () => (await status(job.id)) === JobStatus.DONE && (await client.getJob(later.id)).history.length === 1 && (await status(later.id)) === JobStatus.PENDING,
        30_000,
        "the job DONE on its second run, the other PENDING after one",
      ),
  );
  assert.deepEqual(attempts, [1, 2]);
  const j = await client.getJob(job.id);
  assert.deepEqual(outcomes(j), ["FAILED", "ACKED"]);
  assert.equal(j.history[0]!.error, "Error: first attempt fails");
  const l = await client.getJob(later.id);
  assert.equal(l.lastError, "smtp said 421");
  const due = Number(l.runAt!.seconds) * 1000 - Date.now();
  assert.ok(due > 50_000 && due <= 60_000, `due in ${due} ms, not about 60 s`);
  await client.cancelJob(later.id, "test over");
});

test("snooze: a snoozed job is PENDING again after its delay, its attempt not counted", async () => {
  const { job } = await client.enqueue("snooze", "k", {});
  await running(
    { queues: ["snooze"], handlers: { k: async () => { throw HandlerError.snooze("429: Retry-After 60", 60_000); } }, leaseMs: 10_000 },
    () =>
      waitFor(
        async () => (await client.getJob(job.id)).history.length === 1 && (await status(job.id)) === JobStatus.PENDING,
        20_000,
        "the job snoozed",
      ),
  );
  const j = await client.getJob(job.id);
  assert.deepEqual(outcomes(j), ["SNOOZED"]);
  assert.equal(j.attempts, 0, "no attempt spent");
  assert.equal(j.snoozes, 1);
  assert.equal(j.maxSnoozes, 100);
  assert.equal(j.history[0]!.error, "429: Retry-After 60");
  const due = Number(j.runAt!.seconds) * 1000 - Date.now();
  assert.ok(due > 50_000 && due <= 60_000, `due in ${due} ms, not about 60 s`);
  await client.cancelJob(job.id, "test over");
});

test("snooze: past maxSnoozes a snooze is a failed attempt", async () => {
  const { job } = await client.enqueue("snooze-capped", "k", {}, { maxAttempts: 1, maxSnoozes: 1 });
  await running(
    { queues: ["snooze-capped"], handlers: { k: async () => { throw HandlerError.snooze("429", 10); } }, leaseMs: 10_000 },
    () => waitFor(async () => (await status(job.id)) === JobStatus.FAILED, 20_000, "the job failed at its second snooze"),
  );
  const j = await client.getJob(job.id);
  assert.deepEqual(outcomes(j), ["SNOOZED", "FAILED"]);
  assert.equal(j.attempts, 1);
  assert.equal(j.snoozes, 1);
  assert.match(j.lastError, /max_snoozes/);
});

test("keys: replace debounces a PENDING job, keyScope active frees a finished one's key", async () => {
  const first = await client.enqueue("keys", "k", { v: 1 }, { key: "doc-9", delayMs: 3_600_000 });
  assert.equal(first.outcome, "CREATED");
  const again = await client.enqueue("keys", "k", { v: 2 }, { key: "doc-9" });
  assert.equal(again.outcome, "EXISTING");
  const replaced = await client.enqueue("keys", "k", { v: 3 }, { key: "doc-9", replace: true });
  assert.equal(replaced.outcome, "REPLACED");
  assert.equal(replaced.job.id, first.job.id);
  assert.deepEqual(JSON.parse(Buffer.from((await client.getJob(first.job.id)).payload).toString()), { v: 3 });
  await client.cancelJob(first.job.id, "finished");
  const fresh = await client.enqueue("keys", "k", {}, { key: "doc-9", keyScope: "active" });
  assert.equal(fresh.outcome, "CREATED");
  assert.notEqual(fresh.job.id, first.job.id);
  const windowed = await client.enqueue("keys", "k", {}, { key: "digest-7", uniqueForMs: 60_000 });
  assert.equal(windowed.outcome, "CREATED");
  await assert.rejects(client.enqueue("keys", "k", {}, { uniqueForMs: 1_000 }), /key/);
});

test("result: what a handler resolves to is stored by its ack; one over --max-result-bytes fails the job", async () => {
  const { job: json } = await client.enqueue("results", "k", {}, { key: "json" });
  const { job: text } = await client.enqueue("results", "k", {}, { key: "text" });
  const { job: huge } = await client.enqueue("results", "k", {}, { key: "huge", maxAttempts: 5 });
  await running(
    {
      queues: ["results"],
      handlers: {
        k: async (ctx) => {
          if (ctx.key === "huge") return new Uint8Array(1024 * 1024 + 1);
          if (ctx.key === "text") return "sent";
          return { order: "order-4711", messageId: "<4711@mail.example>" };
        },
      },
      leaseMs: 10_000,
    },
    () =>
      waitFor(
        async () => (await status(json.id)) === JobStatus.DONE && (await status(text.id)) === JobStatus.DONE && (await status(huge.id)) === JobStatus.FAILED,
        20_000,
        "two jobs DONE, the huge one FAILED",
      ),
  );
  const decoded = JSON.parse(new TextDecoder().decode((await client.getJob(json.id)).result));
  assert.deepEqual(decoded, { order: "order-4711", messageId: "<4711@mail.example>" });
  assert.equal(new TextDecoder().decode((await client.getJob(text.id)).result), "sent");
  const failed = await client.getJob(huge.id);
  assert.equal(failed.attempts, 1);
  assert.match(failed.lastError, /the server refused the result/);
  assert.equal(failed.result.length, 0);
});

test("progress: ctx.progress() reaches the producer with the heartbeats; a server with a lower limit cuts the message", async () => {
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const { job } = await client.enqueue("progress", "k", {});
  await running(
    {
      queues: ["progress"],
      handlers: {
        k: async (ctx) => {
          ctx.progress(140, "row 4,000 of 10,000");
          await released;
        },
      },
      leaseMs: 3_000,
    },
    async () => {
      await waitFor(async () => (await client.getJob(job.id)).progress !== undefined, 20_000, "the report");
      const p = (await client.getJob(job.id)).progress;
      assert.equal(p?.percent, 100);
      assert.equal(p?.message, "row 4,000 of 10,000");
      assert.ok(p?.reportedAt !== undefined);
      release();
      await waitFor(async () => (await status(job.id)) === JobStatus.DONE, 20_000, "the ack");
    },
  );
  assert.equal((await client.getJob(job.id)).progress?.percent, 100, "kept after the ack");

  const strict = await Server.start(dir, ["--max-progress-message-bytes", "8"], "strict");
  const sc = new Client<Kinds>({ server: strict.url });
  try {
    await sc.waitReady();
    let go!: () => void;
    const gone = new Promise<void>((resolve) => (go = resolve));
    const { job: wordy } = await sc.enqueue("progress", "k", {});
    await running(
      {
        queues: ["progress"],
        handlers: {
          k: async (ctx) => {
            ctx.progress(10, "a message longer than eight bytes");
            await gone;
          },
        },
        leaseMs: 3_000,
      },
      async () => {
        await waitFor(async () => (await sc.getJob(wordy.id)).progress !== undefined, 20_000, "the cut report");
        assert.equal((await sc.getJob(wordy.id)).progress?.message, "a mes…");
        go();
        await waitFor(async () => (await status(wordy.id, sc)) === JobStatus.DONE, 20_000, "the ack");
      },
      sc,
    );
  } finally {
    sc.close();
    await strict.stop();
  }
});

test("wait and watchJob: the DONE job with its result, JobFailedError, WaitTimeoutError", async () => {
  const { job } = await client.enqueue("waits", "k", {}, { key: "order-4711" });
  const { job: refunded } = await client.enqueue("waits", "k", {}, { key: "order-4712" });
  const { job: never } = await client.enqueue("nobody-works-here", "k", {});
  await client.cancelJob(refunded.id, "order refunded");
  const watched = (async () => {
    const seen: JobStatus[] = [];
    for await (const j of client.watchJob([job.id], { timeoutMs: 20_000 })) seen.push(j.status);
    return seen;
  })();
  const waited = client.wait(job.id, 20_000);
  await running({ queues: ["waits"], handlers: { k: async (ctx) => ({ sent: ctx.key }) }, leaseMs: 10_000 }, async () => {
    await waited;
  });
  const done = await waited;
  assert.deepEqual(JSON.parse(new TextDecoder().decode(done.result)), { sent: "order-4711" });
  const seen = await watched;
  assert.equal(seen.at(-1), JobStatus.DONE, String(seen));
  await assert.rejects(client.wait(refunded.id, 5_000), (err: unknown) => {
    assert.ok(err instanceof JobFailedError);
    assert.equal(err.job.lastError, "cancelled: order refunded");
    return true;
  });
  await assert.rejects(client.wait(never.id, 300), WaitTimeoutError);
});

test("fatal: a fatal HandlerError, or a payload that is not JSON, fails the job for good", async () => {
  const { job } = await client.enqueue("fatal", "k", {}, { maxAttempts: 5, key: "fatal" });
  const { job: garbled } = await client.enqueue("fatal", "k", new TextEncoder().encode("not json"), { maxAttempts: 5 });
  await running(
    {
      queues: ["fatal"],
      handlers: {
        k: async (ctx) => {
          if (ctx.key === "fatal") throw HandlerError.fatal("no such customer");
          void ctx.data;
        },
      },
      leaseMs: 10_000,
    },
    () =>
      waitFor(
        async () => (await status(job.id)) === JobStatus.FAILED && (await status(garbled.id)) === JobStatus.FAILED,
        20_000,
        "both jobs FAILED",
      ),
  );
  const j = await client.getJob(job.id);
  assert.deepEqual(outcomes(j), ["FAILED"]);
  assert.equal(j.lastError, "no such customer");
  const g = await client.getJob(garbled.id);
  assert.deepEqual(outcomes(g), ["FAILED"]);
  assert.match(g.lastError, /^payload is not JSON/);
});

test("capacity: a worker never runs more handlers at once than its capacity, and uses all of it", async () => {
  let now = 0;
  let most = 0;
  const ids: string[] = [];
  for (let i = 0; i < 12; i++) ids.push((await client.enqueue("capacity", "k", { i })).job.id);
  await running(
    {
      queues: ["capacity"],
      // One handler for every kind.
      handlers: async () => {
        most = Math.max(most, ++now);
        await new Promise((r) => setTimeout(r, 150));
        now--;
      },
      capacity: 3,
      leaseMs: 10_000,
    },
    () => waitFor(async () => (await client.stats("capacity"))["capacity"]?.done === 12, 30_000, "12 jobs DONE"),
  );
  assert.equal(most, 3);
});

test("odd throws fail the job too: a string, null, an error whose message cannot be read", async () => {
  const odd: Record<string, () => unknown> = {
    string: () => "plain words",
    null: () => null,
    unreadable: () =>
      Object.defineProperty(new Error(), "message", {
        get(): string {
          throw new Error("no message");
        },
      }),
  };
  const ids = await Promise.all(Object.keys(odd).map(async (key) => (await client.enqueue("odd", "k", {}, { key, maxAttempts: 1 })).job.id));
  await running({ queues: ["odd"], handlers: { k: async (ctx) => { throw odd[ctx.key!]!(); } }, leaseMs: 10_000 }, () =>
    waitFor(async () => (await Promise.all(ids.map((id) => status(id)))).every((st) => st === JobStatus.FAILED), 20_000, "every job FAILED"),
  );
  const errors = await Promise.all(ids.map(async (id) => (await client.getJob(id)).lastError));
  assert.deepEqual(errors, ["plain words", "Error: the handler threw a nullish value", "the handler threw a value whose message could not be read"]);
});

test("a retry delay the server refuses (over its --max-delay) is sent again with the server's backoff", async () => {
  const own = await Server.start(dir, ["--max-delay", "10s"], "max-delay");
  const c = new Client<Kinds>({ server: own.url });
  try {
    await c.waitReady();
    const { job } = await c.enqueue("late", "k", {});
    await running({ queues: ["late"], handlers: { k: async () => { throw HandlerError.retryAfter("try tomorrow", 86_400_000); } }, leaseMs: 10_000 }, () =>
      waitFor(async () => (await c.getJob(job.id)).history.length === 1 && (await status(job.id, c)) === JobStatus.PENDING, 20_000, "the attempt failed"),
    c);
    const j = await c.getJob(job.id);
    assert.equal(j.lastError, "try tomorrow");
    assert.ok(Number(j.runAt!.seconds) * 1000 < Date.now() + 11_000, "run_at is the server's backoff, not a day away");
  } finally {
    c.close();
    await own.stop();
  }
});

test("a kind with no handler fails retryably, with a clear message", async () => {
  const { job } = await client.enqueue("rolling", "new-kind" as "k", {}, { maxAttempts: 5 });
  await running({ queues: ["rolling"], handlers: { "send-email": async () => {} }, leaseMs: 10_000 }, () =>
    waitFor(async () => (await client.getJob(job.id)).history.length >= 1 && (await status(job.id)) !== JobStatus.RUNNING, 20_000, "the first attempt to end"),
  );
  const j = await client.getJob(job.id);
  assert.equal(outcomes(j)[0], "FAILED");
  assert.equal(j.status, JobStatus.PENDING, j.lastError);
  assert.equal(j.lastError, 'no handler for kind "new-kind"');
  await client.cancelJob(job.id, "test over");
});

test("cancel: CancelJob aborts the running handler's signal within 1 s; the late ack is ABORTED", async () => {
  const runs: { attempt: number; leaseId: string; abortedAt?: number; reason?: string }[] = [];
  let started!: () => void;
  const isStarted = new Promise<void>((r) => (started = r));
  const { job } = await client.enqueue("cancel", "k", {});
  await running(
    {
      queues: ["cancel"],
      handlers: {
        k: async (ctx) => {
          const run: (typeof runs)[number] = { attempt: ctx.attempt, leaseId: ctx.leaseId };
          runs.push(run);
          if (runs.length > 1) return; // after Retry: done
          started();
          await new Promise<void>((resolve) =>
            ctx.signal.addEventListener("abort", () => {
              run.abortedAt = Date.now();
              run.reason = ctx.cancelReason;
              resolve();
            }),
          );
        },
      },
      leaseMs: 30_000,
    },
    async () => {
      await isStarted;
      const t0 = Date.now();
      const cancelled = await client.cancelJob(job.id, "refunded");
      assert.equal(cancelled.lastError, "cancelled: refunded");
      await waitFor(() => runs[0]!.abortedAt, 5_000, "the handler to see the cancellation");
      const took = runs[0]!.abortedAt! - t0;
      assert.ok(took < 1000, `cancellation seen after ${took} ms`);
      assert.match(runs[0]!.reason!, /revoked/);
      await assert.rejects(client.ack(job.id, runs[0]!.leaseId), (e: unknown) => e instanceof JobqError && e.code === "ABORTED");
      const j = await client.getJob(job.id);
      assert.equal(j.status, JobStatus.FAILED);
      assert.deepEqual(outcomes(j), ["REVOKED"]);
      await client.retry(job.id);
      await waitFor(async () => (await status(job.id)) === JobStatus.DONE, 20_000, "the retried job DONE");
      console.log(`  cancellation seen by the handler ${took} ms after CancelJob`);
    },
  );
  assert.deepEqual(
    runs.map((r) => r.attempt),
    [1, 1],
  );
  assert.equal(outcomes(await client.getJob(job.id)).at(-1), "ACKED");
});

test("a handler still running at the drain deadline is aborted and its job given back, no attempt spent", async () => {
  const { job } = await client.enqueue("drain-deadline", "k", {});
  let started!: () => void;
  const isStarted = new Promise<void>((r) => (started = r));
  const worker = new Worker(client, {
    queues: ["drain-deadline"],
    handlers: {
      k: (ctx) => {
        started();
        return new Promise<void>((r) => ctx.signal.addEventListener("abort", () => r()));
      },
    },
    leaseMs: 30_000,
    drainTimeoutMs: 500,
    handleSignals: false,
  });
  const run = worker.run();
  await isStarted;
  worker.stop();
  await run;
  const j = await client.getJob(job.id);
  // Given back at once (a snooze of zero), as the Rust worker does: PENDING,
  // no attempt spent, its history saying SNOOZED.
  assert.equal(JobStatus[j.status], "PENDING");
  assert.equal(outcomes(j).join(), "SNOOZED");
  assert.equal(j.attempts, 0);
  assert.equal(j.snoozes, 1);
  assert.match(j.history[0]?.error ?? "", /drain deadline/);
  await client.cancelJob(job.id, "test over");
});

test("a first Lease stream refused for good rejects run() with its JobqError", async () => {
  const worker = new Worker(client, { queues: ["bad queue!"], handlers: async () => {}, handleSignals: false });
  await assert.rejects(worker.run(), (e: unknown) => e instanceof JobqError && e.code === "INVALID_ARGUMENT");
});

test("heartbeats keep a 4 s job's 1.5 s lease", async () => {
  const { job } = await client.enqueue("slow", "k", {});
  await running(
    { queues: ["slow"], handlers: { k: () => new Promise((r) => setTimeout(r, 4000)) }, leaseMs: 1500 },
    () => waitFor(async () => (await status(job.id)) === JobStatus.DONE, 20_000, "the slow job DONE"),
  );
  const j = await client.getJob(job.id);
  assert.equal(j.attempts, 0);
  assert.deepEqual(outcomes(j), ["ACKED"]);
});

test("$JOBQ_SERVER is read when no server is given", async () => {
  const old = process.env["JOBQ_SERVER"];
  process.env["JOBQ_SERVER"] = server.url;
  try {
    const fromEnv = new Client();
    const { job } = await fromEnv.enqueue("env", "k", {});
    fromEnv.close();
    assert.equal((await client.getJob(job.id)).queue, "env");
  } finally {
    if (old === undefined) delete process.env["JOBQ_SERVER"];
    else process.env["JOBQ_SERVER"] = old;
  }
});

test("the producer's trace continues in the handler's span, on every attempt", async () => {
  const api = await import("@opentelemetry/api");
  const { AsyncLocalStorageContextManager } = await import("@opentelemetry/context-async-hooks");
  const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = await import("@opentelemetry/sdk-trace-base");
  const exporter = new InMemorySpanExporter();
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  api.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  try {
    const tracer = api.trace.getTracer("test");
    const { job, producer } = await tracer.startActiveSpan("checkout", async (span) => {
      const { job } = await client.enqueue("traced", "k", {}, { metadata: { "request-id": "r-1" } });
      span.end();
      return { job, producer: span.spanContext() };
    });
    assert.equal(job.metadata["request-id"], "r-1");
    assert.match(job.metadata["traceparent"] ?? "", new RegExp(`^00-${producer.traceId}-${producer.spanId}-0[01]$`));
    let runs = 0;
    await running({ queues: ["traced"], handlers: { k: async () => {
      if (++runs === 1) throw new Error("smtp timeout");
    } }, leaseMs: 10_000 }, () =>
      waitFor(async () => (await status(job.id)) === JobStatus.DONE, 30_000, "the traced job DONE on its second run"),
    );
    const spans = exporter.getFinishedSpans().filter((s) => s.name === "job");
    assert.equal(spans.length, 2);
    for (const s of spans) {
      assert.equal(s.spanContext().traceId, producer.traceId);
      assert.equal(s.parentSpanContext?.spanId, producer.spanId);
    }
    assert.deepEqual(spans.map((s) => s.attributes["job.attempt"]).sort(), [1, 2]);
  } finally {
    api.trace.disable();
    api.context.disable();
  }
});
