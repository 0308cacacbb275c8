// Faults with real processes: a worker SIGKILLed after sending order 4711's
// email (the job comes back within 1 s; the idempotent handler sends one
// email, not two), a server restart while acking (nothing acked twice), a
// lease deadline passing while the server is gone, and SIGTERM/SIGINT
// draining a worker process.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, JobStatus, type Logger, Worker } from "../src/index.js";
import { lines, outcomes, removeDir, Server, tempDir, waitFor, WorkerProcess } from "./harness.js";

let dir: string;
let server: Server;
let client: Client;

before(async () => {
  dir = tempDir("faults");
  server = await Server.start(dir);
  client = new Client({ server: server.url });
  await client.waitReady();
});

after(async () => {
  client?.close();
  await server?.stop();
  removeDir(dir);
});

/** Log lines, to wait on what a worker did. */
class Captured implements Logger {
  readonly messages: string[] = [];
  info = (m: string): void => void this.messages.push(m);
  warn = (m: string): void => void this.messages.push(m);
  error = (m: string): void => void this.messages.push(m);
  count(text: string): number {
    return this.messages.filter((m) => m.includes(text)).length;
  }
}

const statusOf = async (c: Client, id: string): Promise<JobStatus | -1> => {
  try {
    return (await c.getJob(id)).status;
  } catch {
    return -1; // the server is still coming back
  }
};

/** Order 4711: worker 1 sends the email and is SIGKILLed before its ack; worker 2 gets the job again. Returns the mailbox. */
async function order4711(queue: string, mode: string[]): Promise<{ mailbox: string[]; backMs: number }> {
  const mailbox = join(dir, `${queue}.mailbox`);
  const { job } = await client.enqueue(queue, "send-email", { order: "order-4711", to: "ada@example.com" }, { key: "order-4711" });
  const common = ["--server", server.url, "--queue", queue, "--mailbox", mailbox, ...mode];
  const first = new WorkerProcess([...common, "--worker-id", `${queue}-1`, "--hang-after-send"]);
  try {
    await first.expectLine("SENT order-4711");
  } finally {
    await first.kill(); // SIGKILL: no ack, no drain, no goodbye
  }
  const killed = Date.now();
  const back = await waitFor(
    async () => {
      const j = await client.getJob(job.id);
      return j.status === JobStatus.PENDING ? j : undefined;
    },
    1000,
    "job 4711 PENDING within 1 s of the kill",
  );
  const backMs = Date.now() - killed;
  assert.equal(back.attempts, 1);
  assert.deepEqual(outcomes(back), ["WORKER_DISCONNECTED"]);
  assert.equal(back.lastError, "worker disconnected");

  const second = new WorkerProcess([...common, "--worker-id", `${queue}-2`]);
  try {
    await waitFor(async () => (await client.getJob(job.id)).status === JobStatus.DONE, 20_000, "job 4711 DONE");
  } finally {
    await second.kill();
  }
  assert.deepEqual(outcomes(await client.getJob(job.id)), ["WORKER_DISCONNECTED", "ACKED"]);
  return { mailbox: lines(mailbox), backMs };
}

test("order 4711: the worker dies after sending, before acking; the job comes back within 1 s and the email goes out once", async () => {
  const { mailbox, backMs } = await order4711("emails", []);
  assert.deepEqual(mailbox, ["SENT order-4711"], "one email, not two");
  console.log(`  job 4711 back ${backMs} ms after the SIGKILL; one email sent`);
});

test("without the idempotency check, order 4711 gets two emails (the rule's reason)", async () => {
  const { mailbox } = await order4711("emails-twice", ["--non-idempotent"]);
  assert.deepEqual(mailbox, ["SENT order-4711", "SENT order-4711"]);
});

test("a server restart while acking: acks are retried until they land, nothing is acked twice", async () => {
  // A grace well past the 1 s lease: the worker may take a few seconds of
  // reconnect backoff to find the server again.
  const own = await Server.start(dir, ["--restart-grace", "30s"], "restart");
  const c = new Client({ server: own.url });
  const log = new Captured();
  const runs = new Map<string, number[]>();
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let worker: Worker | undefined;
  let run: Promise<void> | undefined;
  try {
    await c.waitReady();
    const ids: string[] = [];
    for (const key of ["a", "b", "c"]) ids.push((await c.enqueue("restart", "k", {}, { key })).job.id);
    worker = new Worker(c, {
      queues: ["restart"],
      handlers: {
        k: async (ctx) => {
          runs.set(ctx.id, [...(runs.get(ctx.id) ?? []), ctx.attempt]);
          await released;
        },
      },
      capacity: 3,
      leaseMs: 1000,
      handleSignals: false,
      logger: log,
    });
    run = worker.run();
    await waitFor(() => runs.size === 3, 20_000, "three handlers running");
    // A take is made durable by the next flush round: an enqueue, durable
    // when it answers, makes sure that round happened before the kill.
    await c.enqueue("restart-flush", "k", {});
    await own.kill();
    const killed = Date.now();
    release(); // the handlers return while the server is down
    await waitFor(
      () => log.count("ack/fail did not reach the server") >= 2 && Date.now() - killed >= 3000,
      30_000,
      "3 s of downtime with the acks failing",
    );
    await own.restart();
    for (const id of ids) {
      await waitFor(async () => (await statusOf(c, id)) === JobStatus.DONE, 30_000, `job ${id} DONE after the restart`);
    }
    for (const id of ids) {
      assert.deepEqual(outcomes(await c.getJob(id)), ["ACKED"], `job ${id}`);
      assert.deepEqual(runs.get(id), [1], `job ${id} ran once`);
    }
    console.log(`  acks retried ${log.count("ack/fail did not reach the server")} times over ${((Date.now() - killed) / 1000).toFixed(1)} s, each landed once`);
  } finally {
    worker?.stop();
    await run;
    c.close();
    await own.stop();
  }
});

test("a reconnect declares the leases still held: they fill the capacity, and a job running across a server restart is acked once", async () => {
  const own = await Server.start(dir, ["--restart-grace", "30s"], "held");
  const c = new Client({ server: own.url });
  const log = new Captured();
  const attempts: number[] = [];
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let worker: Worker | undefined;
  let run: Promise<void> | undefined;
  try {
    await c.waitReady();
    const { job } = await c.enqueue("held", "k", {});
    worker = new Worker(c, {
      queues: ["held"],
      handlers: {
        k: async (ctx) => {
          attempts.push(ctx.attempt);
          await released;
        },
      },
      leaseMs: 10_000,
      handleSignals: false,
      logger: log,
    });
    run = worker.run();
    await waitFor(() => attempts.length === 1, 20_000, "the handler running");
    await c.enqueue("held-flush", "k", {}); // the take is durable
    await own.kill();
    await own.restart();
    // The new stream declares the lease (`held`), so it stays this worker's.
    await waitFor(() => log.count("lease stream open (1 in flight)") >= 1, 20_000, `the stream reopened, declaring the lease:\n${log.messages.join("\n")}`);
    // The declared lease fills the capacity of 1: a new job is not pushed
    // while it runs. (A negative check: the window can only miss a push,
    // never fail a correct worker.)
    const { job: next } = await c.enqueue("held", "k", {});
    await new Promise((r) => setTimeout(r, 500));
    assert.equal((await c.getJob(next.id)).status, JobStatus.PENDING, "pushed past the capacity");
    release();
    await waitFor(async () => (await statusOf(c, job.id)) === JobStatus.DONE && (await statusOf(c, next.id)) === JobStatus.DONE, 20_000, "both jobs DONE");
    assert.deepEqual(outcomes(await c.getJob(job.id)), ["ACKED"]);
    assert.deepEqual(attempts, [1, 1]);
  } finally {
    release();
    worker?.stop();
    await run;
    c.close();
    await own.stop();
  }
});

test("a lease deadline that passes while heartbeats cannot get through aborts the handler, and the job is not acked", async () => {
  const own = await Server.start(dir, [], "deadline");
  const c = new Client({ server: own.url });
  const log = new Captured();
  let started!: () => void;
  const isStarted = new Promise<void>((r) => (started = r));
  const seen: { at?: number; reason?: string } = {};
  let worker: Worker | undefined;
  let run: Promise<void> | undefined;
  try {
    await c.waitReady();
    await c.enqueue("deadline", "k", {});
    worker = new Worker(c, {
      queues: ["deadline"],
      handlers: {
        k: (ctx) =>
          new Promise<void>((resolve) => {
            started();
            ctx.signal.addEventListener("abort", () => {
              seen.at = Date.now();
              seen.reason = ctx.cancelReason;
              resolve();
            });
          }),
      },
      leaseMs: 2000,
      handleSignals: false,
      logger: log,
    });
    run = worker.run();
    await isStarted;
    await own.kill();
    const killed = Date.now();
    await waitFor(() => seen.at, 15_000, "the handler to be told to stop");
    const took = seen.at! - killed;
    assert.match(seen.reason!, /deadline/);
    // The lease is 2 s from the last heartbeat that got through; slack for a loaded box.
    assert.ok(took <= 5000, `told to stop ${took} ms after the server went away`);
    worker.stop();
    await run;
    assert.deepEqual(log.messages.filter((m) => /: acked|: failed/.test(m)), []);
    console.log(`  handler told to stop ${took} ms after the server died (lease 2 s)`);
  } finally {
    worker?.stop();
    await run;
    c.close();
    await own.stop();
  }
});

for (const signal of ["SIGTERM", "SIGINT"] as const) {
  test(`${signal} drains a worker process: running jobs finish and are acked, exit 0, nothing reclaimed`, async () => {
    const queue = `drain-${signal.toLowerCase()}`;
    for (let i = 0; i < 60; i++) await client.enqueue(queue, "send-email", { order: i });
    const log = join(dir, `${queue}.jobs`);
    const w = new WorkerProcess(["--server", server.url, "--queue", queue, "--worker-id", `ts-${queue}`, "--capacity", "5", "--work", "50", "--lease", "30000", "--log", log]);
    try {
      await waitFor(() => lines(log).length >= 10, 30_000, "10 jobs handled");
      w.proc.kill(signal);
      assert.equal(await w.exit(20_000), 0, `the worker did not exit 0 after ${signal}:\n${w.output}`);
    } finally {
      await w.kill();
    }
    const jobs = [];
    for await (const j of client.listJobs({ queue })) jobs.push(j);
    const done = jobs.filter((j) => j.status === JobStatus.DONE);
    for (const j of jobs) {
      assert.ok(["", "ACKED"].includes(outcomes(j).join()), `${j.id}: ${outcomes(j).join()}`);
      assert.ok(j.status === JobStatus.PENDING || j.status === JobStatus.DONE, `${j.id}: ${JobStatus[j.status]}`);
    }
    assert.equal(done.length, lines(log).length);
    assert.ok(!/Error|Unhandled/.test(w.output), w.output);
    console.log(`  ${signal}: ${done.length} done, ${jobs.length - done.length} untouched, none reclaimed`);
  });
}

