// The Client against a real `jobq serve`: every RPC, the error class,
// tokens, and TLS with $JOBQ_CA_CERT.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, JobqError, JobStatus } from "../src/index.js";
import { JOBQ_BIN, outcomes, removeDir, Server, tempDir } from "./harness.js";

let dir: string;
let server: Server;
let client: Client;

before(async () => {
  dir = tempDir("client");
  server = await Server.start(dir);
  client = new Client({ server: server.url });
  await client.waitReady();
});

after(async () => {
  client?.close();
  await server?.stop();
  removeDir(dir);
});

const rejectsWith = (code: string) => (e: unknown) => e instanceof JobqError && e.code === code && !e.local && e.serverMessage !== "";

test("producer and worker calls: enqueue (JSON and bytes), a batch, dequeue, heartbeat, ack, fail, retry", async () => {
  const bytes = new Uint8Array([0, 1, 254, 255]);
  const { job: raw } = await client.enqueue("rpc", "k", bytes, { priority: 5, metadata: { tenant: "t-1" } });
  const got = await client.getJob(raw.id);
  assert.deepEqual(got.payload, bytes);
  assert.equal(got.priority, 5);
  assert.equal(got.metadata["tenant"], "t-1");
  const results = await client.enqueueBatch([
    { queue: "rpc", kind: "k", payload: { n: 1 }, key: "b-1" },
    { queue: "bad queue!", kind: "k", payload: {} },
    { queue: "rpc", kind: "k", payload: { n: 1 }, key: "b-1" },
  ]);
  assert.deepEqual(results.map((r) => [r.created, r.errorCode !== 0]), [[true, false], [false, true], [false, false]]);
  assert.match(results[1]!.errorMessage, /queue/);

  const first = await client.dequeue(["rpc"], "ts-rpc", { leaseMs: 5000 });
  assert.equal(first?.job?.id, raw.id, "priority 5 first");
  const lost = await client.heartbeat("ts-rpc", [{ jobId: raw.id, leaseId: first!.leaseId }, { jobId: raw.id, leaseId: "0" }], { extendByMs: 5000 });
  assert.deepEqual(lost, [{ jobId: raw.id, leaseId: "0" }]);
  assert.equal((await client.ack(raw.id, first!.leaseId)).status, JobStatus.DONE);
  await assert.rejects(client.ack(raw.id, first!.leaseId), rejectsWith("FAILED_PRECONDITION"));

  const second = await client.dequeue(["rpc"], "ts-rpc");
  const failed = await client.fail(second!.job!.id, second!.leaseId, "bad input", { fatal: true });
  assert.equal(failed.status, JobStatus.FAILED);
  assert.equal((await client.retry(failed.id)).status, JobStatus.PENDING);
  assert.equal(await client.dequeue(["empty"], "ts-rpc", { waitMs: 100 }), undefined);
});

test("operator calls: cancel, pause and resume, delete, purge, list, stats, schedules", async () => {
  const { job: a } = await client.enqueue("ops", "send-email", "a");
  const { job: b } = await client.enqueue("ops", "send-email", "b");
  const cancelled = await client.cancelJob(a.id, "refunded");
  assert.equal(cancelled.status, JobStatus.FAILED);
  assert.equal(cancelled.lastError, "cancelled: refunded");
  await assert.rejects(client.cancelJob(a.id), rejectsWith("FAILED_PRECONDITION"));

  await client.pauseQueue("ops");
  assert.equal(await client.paused("ops"), true);
  assert.equal(await client.dequeue(["ops"], "ts-ops"), undefined);
  await client.resumeQueue("ops");
  assert.equal(await client.paused("ops"), false);
  const leased = await client.dequeue(["ops"], "ts-ops");
  assert.equal(leased?.job?.id, b.id);
  await assert.rejects(client.deleteJob(b.id), rejectsWith("FAILED_PRECONDITION"));
  assert.equal(await client.purgeJobs("ops", { status: "FAILED" }), 1);
  const { job: c } = await client.enqueue("ops", "send-email", "c");
  await client.deleteJob(c.id);
  await assert.rejects(client.getJob(c.id), rejectsWith("NOT_FOUND"));

  for (let i = 0; i < 5; i++) await client.enqueue("list", "k", { i }, { key: `l-${i}` });
  const keys: string[] = [];
  for await (const j of client.listJobs({ queue: "list", status: "JOB_STATUS_PENDING", pageSize: 2, omitPayload: true })) {
    keys.push(j.key);
    assert.equal(j.payload.length, 0);
  }
  assert.deepEqual(keys, ["l-0", "l-1", "l-2", "l-3", "l-4"]);
  const page = await client.listJobsPage({ queue: "list", pageSize: 2 });
  assert.equal(page.jobs.length, 2);
  assert.notEqual(page.nextPageToken, "");
  const stats = await client.stats("list");
  assert.deepEqual(
    { ...stats["list"], oldestPendingAgeMs: undefined },
    {
      pending: 5, running: 0, done: 0, failed: 0, paused: false, oldestPendingAgeMs: undefined,
      policy: { maxRunning: 0, groupMaxRunning: 0, rate: undefined, groupRate: undefined }, heldMaxRunning: 0, heldGroupMaxRunning: 0, heldRate: 0, heldGroupRate: 0,
    },
  );
  assert.ok((stats["list"]!.oldestPendingAgeMs ?? -1) >= 0);

  const schedule = await client.createSchedule({ name: "nightly", queue: "reports", kind: "k", cron: "0 3 * * *", payload: { r: 1 }, timezone: "Europe/Berlin" });
  assert.equal(schedule.timezone, "Europe/Berlin");
  assert.ok(schedule.nextRunAt !== undefined);
  assert.deepEqual((await client.listSchedules()).map((s) => s.name), ["nightly"]);
  await assert.rejects(client.createSchedule({ name: "bad", queue: "q", kind: "k", cron: "not cron" }), rejectsWith("INVALID_ARGUMENT"));
  await client.deleteSchedule("nightly");
  await assert.rejects(client.deleteSchedule("nightly"), rejectsWith("NOT_FOUND"));
  assert.deepEqual(outcomes(cancelled), []);
});

test("queue policies: a group's jobs one at a time, held jobs counted, bad limits refused", async () => {
  await client.setQueuePolicy("ts-policy", { maxRunning: 10, groupMaxRunning: 1 });
  assert.deepEqual(await client.queuePolicy("ts-policy"), { maxRunning: 10, groupMaxRunning: 1, rate: undefined, groupRate: undefined });
  const { job: first } = await client.enqueue("ts-policy", "import", "1", { group: "customer-42" });
  const { job: second } = await client.enqueue("ts-policy", "import", "2", { group: "customer-42" });
  assert.equal(first.group, "customer-42");
  const leased = await client.dequeue(["ts-policy"], "ts-w");
  assert.equal(leased?.job?.id, first.id);
  assert.equal(await client.dequeue(["ts-policy"], "ts-w"), undefined, "the second waits for the first");
  const stats = (await client.stats("ts-policy"))["ts-policy"]!;
  assert.equal(stats.heldGroupMaxRunning, 1);
  assert.deepEqual(stats.policy, { maxRunning: 10, groupMaxRunning: 1, rate: undefined, groupRate: undefined });
  await client.ack(leased!.job!.id, leased!.leaseId);
  assert.equal((await client.dequeue(["ts-policy"], "ts-w"))?.job?.id, second.id);
  await assert.rejects(client.setQueuePolicy("ts-policy", { maxRunning: 100_001 }), rejectsWith("INVALID_ARGUMENT"));
  await client.setQueuePolicy("ts-policy", {});
  assert.deepEqual(await client.queuePolicy("ts-policy"), { maxRunning: 0, groupMaxRunning: 0, rate: undefined, groupRate: undefined });
  // Two takes an hour: the third job is held by the rate limit.
  await client.setQueuePolicy("ts-rate", { rate: { limit: 2, perMs: 3_600_000 } });
  assert.deepEqual((await client.queuePolicy("ts-rate")).rate, { limit: 2, perMs: 3_600_000, burst: 0 });
  for (let i = 0; i < 3; i++) await client.enqueue("ts-rate", "call-api", i);
  assert.ok(await client.dequeue(["ts-rate"], "ts-w"));
  assert.ok(await client.dequeue(["ts-rate"], "ts-w"));
  assert.equal(await client.dequeue(["ts-rate"], "ts-w"), undefined);
  assert.equal((await client.stats("ts-rate"))["ts-rate"]!.heldRate, 1);
  // One take an hour per customer: customer b is not held by customer a.
  await client.setQueuePolicy("ts-group-rate", { groupRate: { limit: 1, perMs: 3_600_000 } });
  for (const group of ["a", "a", "b"]) await client.enqueue("ts-group-rate", "email", group, { group });
  const groups: (string | undefined)[] = [];
  for (let i = 0; i < 3; i++) groups.push((await client.dequeue(["ts-group-rate"], "ts-w"))?.job?.group);
  assert.deepEqual(groups, ["a", "b", undefined]);
  assert.equal((await client.stats("ts-group-rate"))["ts-group-rate"]!.heldGroupRate, 1);
});

test("a server that is not there is UNAVAILABLE", async () => {
  const nowhere = new Client({ server: "http://127.0.0.1:1", timeoutMs: 2000 });
  try {
    await assert.rejects(nowhere.stats(), (e: unknown) => e instanceof JobqError && e.code === "UNAVAILABLE");
  } finally {
    nowhere.close();
  }
});

function newToken(name: string, roles: string, queues: string): { toml: string; secret: string } {
  const out = execFileSync(JOBQ_BIN, ["--json", "token", "new", name, "--roles", roles, "--queues", queues], { encoding: "utf8" });
  return JSON.parse(out) as { toml: string; secret: string };
}

/** A throwaway CA and a server certificate for localhost and 127.0.0.1 (openssl command line). */
function makePki(): { ca: string; cert: string; key: string } {
  const p = (n: string): string => join(dir, n);
  writeFileSync(p("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
  const run = (...args: string[]): void => void execFileSync("openssl", args, { stdio: "pipe" });
  run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", p("ca.key"), "-out", p("ca.pem"), "-days", "2", "-subj", "/CN=jobq ts test CA");
  run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", p("server.key"), "-out", p("server.csr"), "-subj", "/CN=localhost");
  run("x509", "-req", "-in", p("server.csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"), "-CAcreateserial", "-out", p("server.pem"), "-days", "2", "-extfile", p("san.ext"));
  return { ca: p("ca.pem"), cert: p("server.pem"), key: p("server.key") };
}

test("TLS and tokens: $JOBQ_CA_CERT and $JOBQ_TOKEN are read; no token is UNAUTHENTICATED, another queue PERMISSION_DENIED", async () => {
  const pki = makePki();
  const producer = newToken("producer", "produce,read", "email");
  const tokens = join(dir, "tokens.toml");
  writeFileSync(tokens, producer.toml + "\n");
  const tls = await Server.start(dir, ["--tls-cert", pki.cert, "--tls-key", pki.key, "--auth-tokens", tokens], "tls");
  const url = `https://localhost:${tls.addr.split(":").at(-1)}`;
  const saved = { ca: process.env["JOBQ_CA_CERT"], token: process.env["JOBQ_TOKEN"] };
  const clients: Client[] = [];
  try {
    process.env["JOBQ_CA_CERT"] = pki.ca;
    process.env["JOBQ_TOKEN"] = producer.secret;
    const good = new Client({ server: url });
    clients.push(good);
    const { job } = await good.enqueue("email", "send-email", { order: "order-4711" });
    assert.equal((await good.getJob(job.id)).queue, "email");
    await assert.rejects(good.enqueue("billing", "k", {}), rejectsWith("PERMISSION_DENIED"));
    const anon = new Client({ server: url, token: "" });
    clients.push(anon);
    await assert.rejects(anon.stats(), rejectsWith("UNAUTHENTICATED"));
    delete process.env["JOBQ_CA_CERT"];
    const untrusted = new Client({ server: url, timeoutMs: 5000 });
    clients.push(untrusted);
    // Without the CA the handshake fails (connect-node reports it as INTERNAL).
    await assert.rejects(untrusted.stats(), (e: unknown) => e instanceof JobqError && /certificate/.test(e.serverMessage));
  } finally {
    for (const c of clients) c.close();
    for (const [k, v] of [["JOBQ_CA_CERT", saved.ca], ["JOBQ_TOKEN", saved.token]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    await tls.stop();
  }
});
