// Settings and rules that need no server: URLs, the token rule, TLS
// options, payloads, errors, and worker settings no job could survive.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, encodePayload, errorText, HandlerError, isLoopback, JobqError, parseServer, Worker } from "../src/index.js";

test("server URLs are read as the CLI reads them", () => {
  assert.deepEqual(parseServer("http://127.0.0.1:50051"), { baseUrl: "http://127.0.0.1:50051", host: "127.0.0.1", tls: false });
  assert.deepEqual(parseServer("jobs.internal:7000"), { baseUrl: "http://jobs.internal:7000", host: "jobs.internal", tls: false });
  assert.equal(parseServer("https://jobs.internal").baseUrl, "https://jobs.internal:443");
  assert.equal(parseServer("http://jobs.internal/").baseUrl, "http://jobs.internal:80");
  assert.equal(parseServer("http://[::1]:50051").host, "[::1]");
  assert.equal(parseServer(undefined, {}).baseUrl, "http://127.0.0.1:50051");
  assert.equal(parseServer(undefined, { JOBQ_SERVER: "https://q.example:9" }).baseUrl, "https://q.example:9");
  for (const bad of ["ftp://x:1", "http://x:1/path", "http://", "http://x:port"]) {
    assert.throws(() => parseServer(bad), (e: unknown) => e instanceof JobqError && e.code === "INVALID_ARGUMENT" && e.local, bad);
  }
});

test("loopback hosts are localhost and loopback addresses only", () => {
  for (const h of ["localhost", "LocalHost", "127.0.0.1", "127.8.9.10", "::1", "[::1]", "[::ffff:127.0.0.1]"]) {
    assert.ok(isLoopback(h), h);
  }
  for (const h of ["10.0.0.1", "0.0.0.0", "[::]", "jobs.internal", "localhost.evil.example", "127.0.0.1.nip.io", "128.0.0.1", "[fe80::1]"]) {
    assert.ok(!isLoopback(h), h);
  }
});

test("a token is not sent in clear to another machine unless insecure", () => {
  for (const server of ["http://192.0.2.1:50051", "http://jobs.internal:50051", "jobs.internal:50051"]) {
    assert.throws(
      () => new Client({ server, token: "s3cret" }),
      (e: unknown) => e instanceof JobqError && e.local && /refusing to send the token in clear/.test(e.message) && /insecure/.test(e.message),
      server,
    );
    new Client({ server, token: "s3cret", insecure: true }).close();
    new Client({ server }).close();
  }
  for (const server of ["http://127.0.0.1:1", "http://127.0.0.2:1", "http://localhost:1", "http://[::1]:1", "https://jobs.internal:1"]) {
    new Client({ server, token: "s3cret" }).close();
  }
  // $JOBQ_TOKEN is read, and a blank one is no token.
  const old = process.env["JOBQ_TOKEN"];
  try {
    process.env["JOBQ_TOKEN"] = "from-env";
    assert.throws(() => new Client({ server: "http://jobs.internal:1" }), /in clear/);
    process.env["JOBQ_TOKEN"] = "  ";
    new Client({ server: "http://jobs.internal:1" }).close();
  } finally {
    if (old === undefined) delete process.env["JOBQ_TOKEN"];
    else process.env["JOBQ_TOKEN"] = old;
  }
});

test("TLS settings on a plaintext URL are refused, not ignored", () => {
  assert.throws(() => new Client({ server: "http://127.0.0.1:1", caCert: "pem" }), /not an https:\/\/ URL/);
  assert.throws(() => new Client({ server: "https://127.0.0.1:1", clientCert: "pem" }), /go together/);
  assert.throws(() => new Client({ server: "https://127.0.0.1:1", caCert: { path: "/nonexistent/ca.pem" } }), /ENOENT/);
  assert.throws(() => new Client({ server: "http://127.0.0.1:1", timeoutMs: 0 }), /zero timeout/);
});

test("payloads are JSON unless given as bytes", () => {
  assert.equal(new TextDecoder().decode(encodePayload({ order: "order-4711" })), '{"order":"order-4711"}');
  assert.deepEqual(encodePayload(new Uint8Array([0, 255])), new Uint8Array([0, 255]));
  assert.equal(encodePayload(undefined).length, 0);
  assert.throws(() => encodePayload(() => 1), /no JSON form/);
});

test("handler errors say how the job fails", () => {
  assert.equal(HandlerError.fatal("no such customer").fatal, true);
  assert.equal(HandlerError.retryAfter("smtp said 421", 60_000).retryDelayMs, 60_000);
  assert.throws(() => new HandlerError("x", { fatal: true, retryDelayMs: 1 }), TypeError);
  assert.throws(() => HandlerError.retryAfter("x", -1), TypeError);
  assert.equal(HandlerError.snooze("429", 30_000).snoozeMs, 30_000);
  assert.throws(() => HandlerError.snooze("x", Number.NaN), TypeError);
  assert.throws(() => new HandlerError("x", { fatal: true, snoozeMs: 1 }), TypeError);
  assert.equal(errorText(new TypeError("boom")), "TypeError: boom");
  assert.equal(errorText(HandlerError.retry("plain")), "plain");
  assert.equal(errorText("a string"), "a string");
  assert.equal(errorText(42), "thrown: 42");
});

test("worker settings no job could survive are refused", () => {
  const client = new Client({ server: "http://127.0.0.1:1" });
  const handlers = { k: async () => {} };
  try {
    for (const bad of [{ capacity: 0 }, { capacity: 1.5 }, { leaseMs: 0 }, { leaseMs: 3000, heartbeatEveryMs: 3000 }, { drainTimeoutMs: -1 }]) {
      assert.throws(() => new Worker(client, { queues: ["q"], handlers, ...bad }), RangeError, JSON.stringify(bad));
    }
    assert.throws(() => new Worker(client, { queues: "email" as unknown as string[], handlers }), /bare string/);
    assert.throws(() => new Worker(client, { queues: [], handlers }), /at least one queue/);
    assert.throws(
      () => new Worker(client, { queues: ["q"], handlers: { k: "not a function" } as unknown as typeof handlers }),
      /kind "k" is not a function/,
    );
  } finally {
    client.close();
  }
});
