// Client: every JobQueue RPC, with TypeScript arguments and typed payloads.

import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type Client as RawClient, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { checkPlaintextToken, type Endpoint, parseServer, type Pem, resolveToken, tlsFiles } from "./config.js";
import { isTransient, JobFailedError, JobqError, WaitTimeoutError } from "./errors.js";
import {
  EnqueueOutcome,
  EnqueueRequestSchema,
  type EnqueueResult,
  type Job,
  JobQueue,
  JobStatus,
  KeyScope,
  type LeasedJob,
  type LeaseEvent,
  OnConflict,
  type QueuePolicy,
  type RateLimit,
  type Schedule,
} from "./gen/jobq/v1/jobq_pb.js";
import { type AnyKinds, encodePayload, type KindMap } from "./payload.js";
import { Backoff, duration, millis, sleep } from "./time.js";
import { traceContext, withTraceContext } from "./trace.js";

/** Most leases in one Heartbeat call: the server refuses more; heartbeat() splits. */
export const MAX_HEARTBEAT_LEASES = 1000;

/**
 * The longest progress message the server takes by default
 * (--max-progress-message-bytes): `ctx.progress()` cuts a longer one.
 */
export const PROGRESS_MESSAGE_BYTES = 256;

/** A progress report as a heartbeat carries it. */
export interface ProgressReport {
  /** 0 to 100. */
  percent: number;
  message: string;
}
/** The largest reply decoded (64 MiB, above the server's default --max-message-bytes). */
export const MAX_RECEIVE_BYTES = 64 * 1024 * 1024;

export interface ClientOptions {
  /** `http://host:port`, `https://host:port` (TLS) or a bare `host:port`; default $JOBQ_SERVER, else http://127.0.0.1:50051. */
  server?: string;
  /** Sent as `authorization: Bearer <token>`; default $JOBQ_TOKEN. */
  token?: string;
  /**
   * Lets the token travel over plaintext http:// to a host that is not this
   * machine (anyone on the path can read it). Without it, that is refused
   * before anything is sent.
   */
  insecure?: boolean;
  /** The CA (PEM) to trust for an https:// server; default $JOBQ_CA_CERT (a path), else the system's roots. */
  caCert?: Pem;
  /** Client certificate and key (PEM), for a server that asks for them (mTLS). */
  clientCert?: Pem;
  clientKey?: Pem;
  /** Most time each call may take (Lease streams aside); default 30 000 ms. */
  timeoutMs?: number;
}

export interface EnqueueOptions {
  /** Domain key (e.g. "order-4711"): with a key that names a retained job, that job is returned and nothing is added. */
  key?: string;
  /** Attempts allowed; default the server's. */
  maxAttempts?: number;
  /** Run no earlier than now + delayMs. */
  delayMs?: number;
  /** Stored with the job (request ids, tenant tags); the active span's traceparent is added. */
  metadata?: Record<string, string>;
  /** -100..=100, higher first; default 0. */
  priority?: number;
  /** A tenant or customer id: a queue policy's groupMaxRunning limits how many of one group run at once. */
  group?: string;
  /** Snoozes (HandlerError.snooze) allowed before a snooze counts as a failed attempt; default 100 (0: every snooze counts). */
  maxSnoozes?: number;
  /** With a key: "active" holds it only while a job with it is PENDING or RUNNING ("unique until finished"); default "retained". */
  keyScope?: "retained" | "active";
  /** With a key: a PENDING job with it takes this payload, metadata and delay (debounce); a RUNNING one gets a successor, a new job that takes the key over. */
  replace?: boolean;
  /** With a key: held this long after its job's enqueue, whatever its state (throttle). */
  uniqueForMs?: number;
}

/** What an enqueue did: a new job, the job that holds the key, or that job replaced. */
export type EnqueueOutcomeName = "CREATED" | "EXISTING" | "REPLACED";

function outcomeName(outcome: EnqueueOutcome, created: boolean): EnqueueOutcomeName {
  switch (outcome) {
    case EnqueueOutcome.CREATED:
      return "CREATED";
    case EnqueueOutcome.REPLACED:
      return "REPLACED";
    case EnqueueOutcome.EXISTING:
      return "EXISTING";
    default:
      return created ? "CREATED" : "EXISTING";
  }
}

/** How a queue's work is shaped (setQueuePolicy); 0 means no limit. */
export interface QueuePolicyLimits {
  /** RUNNING jobs of the queue at once, over every server. */
  maxRunning?: number;
  /** RUNNING jobs of one group at once; 1 runs each group's jobs one at a time, in enqueue order. */
  groupMaxRunning?: number;
  /** Takes of the queue's jobs per period, over every server (a token bucket); undefined: none. */
  rate?: RateLimitSpec | undefined;
  /** Takes of one group's jobs per period, over every server; undefined: none. */
  groupRate?: RateLimitSpec | undefined;
}

/** `limit` takes per `perMs`, at most `burst` at once after a quiet spell (0 or unset: `limit`). */
export interface RateLimitSpec {
  limit: number;
  perMs: number;
  burst?: number;
}

/** One entry of enqueueBatch. */
export type EnqueueSpec<Kinds extends KindMap = AnyKinds> = {
  [K in keyof Kinds & string]: { queue: string; kind: K; payload: Kinds[K] } & EnqueueOptions;
}[keyof Kinds & string];

/** A status by value or name ("DONE" or "JOB_STATUS_DONE"). */
export type StatusLike = JobStatus | keyof typeof JobStatus | `JOB_STATUS_${keyof typeof JobStatus}`;

export interface ListJobsOptions {
  queue?: string;
  status?: StatusLike;
  key?: string;
  pageSize?: number;
  omitPayload?: boolean;
}

export interface QueueCounts {
  pending: number;
  running: number;
  done: number;
  failed: number;
  paused: boolean;
  /** How long the oldest due PENDING job has waited; undefined when none is due. */
  oldestPendingAgeMs: number | undefined;
  /** The queue's policy (all 0: none). */
  policy: QueuePolicyView;
  /** Due PENDING jobs held back because the queue runs maxRunning. */
  heldMaxRunning: number;
  /** Due PENDING jobs held back by groupMaxRunning. */
  heldGroupMaxRunning: number;
  /** Due PENDING jobs held back because the rate limit has no token. */
  heldRate: number;
  /** Due PENDING jobs held back because their group's rate limit has no token. */
  heldGroupRate: number;
}

/** A queue's policy as the server reports it. */
export interface QueuePolicyView {
  maxRunning: number;
  groupMaxRunning: number;
  rate: Required<RateLimitSpec> | undefined;
  groupRate: Required<RateLimitSpec> | undefined;
}

export interface LeaseRefLike {
  jobId: string;
  leaseId: string;
  /** In a heartbeat: the job's progress, kept with it by the server. */
  progress?: ProgressReport;
}

export interface HeartbeatOptions {
  /** New lease length from now; default each lease's own. */
  extendByMs?: number;
  /** Stop pushing new jobs to the stream named by streamToken. */
  draining?: boolean;
  /** The `jobq-stream-token` response header of the sender's Lease stream. */
  streamToken?: string;
  timeoutMs?: number;
}

export interface CreateScheduleOptions<Kinds extends KindMap = AnyKinds> {
  name: string;
  queue: string;
  kind: keyof Kinds & string;
  /** Five cron fields, six with leading seconds, seven with a trailing year. */
  cron: string;
  payload?: Kinds[keyof Kinds & string];
  /** IANA zone the cron is read in; default UTC. */
  timezone?: string;
  maxAttempts?: number;
}

function statusValue(status: StatusLike | undefined): JobStatus {
  if (status === undefined) return JobStatus.UNSPECIFIED;
  if (typeof status === "number") return status;
  const name = status.startsWith("JOB_STATUS_") ? status.slice("JOB_STATUS_".length) : status;
  const value = (JobStatus as unknown as Record<string, JobStatus | undefined>)[name.toUpperCase()];
  if (value === undefined) throw JobqError.config(`unknown job status ${JSON.stringify(status)}`);
  return value;
}

/** A list of queue names; a bare string is refused (it is a common slip). */
export function checkQueues(queues: readonly string[]): string[] {
  if (typeof queues === "string") {
    throw new TypeError(`queues must be an array of queue names, not a bare string: write [${JSON.stringify(queues)}]`);
  }
  if (!Array.isArray(queues) || !queues.every((q) => typeof q === "string")) {
    throw new TypeError("queues must be an array of strings");
  }
  if (queues.length === 0) throw new TypeError("queues must name at least one queue");
  return [...queues];
}

/**
 * Every JobQueue RPC. `Kinds` maps job kinds to payload types, so that
 * `enqueue("emails", "send-email", payload)` checks the payload's type.
 * Payloads are JSON unless given as a Uint8Array.
 *
 * Errors are {@link JobqError}s with the gRPC code name and the server's message.
 */
export class Client<Kinds extends KindMap = AnyKinds> {
  /** The generated connect client, for anything this class does not wrap. */
  readonly raw: RawClient<typeof JobQueue>;
  readonly endpoint: Endpoint;
  readonly timeoutMs: number;
  private readonly session: Http2SessionManager;

  constructor(options: ClientOptions = {}) {
    this.endpoint = parseServer(options.server);
    const token = resolveToken(options.token);
    checkPlaintextToken(this.endpoint, token, options.insecure ?? false);
    const tls = tlsFiles(this.endpoint, options);
    this.timeoutMs = options.timeoutMs ?? 30_000;
    if (!(this.timeoutMs > 0)) throw JobqError.config("timeoutMs must be positive; a zero timeout would fail every call");
    const headers: Interceptor = (next) => async (req) => {
      if (token !== undefined) req.header.set("authorization", `Bearer ${token}`);
      // The server's span for the call joins the caller's trace.
      for (const [k, v] of Object.entries(await traceContext())) req.header.set(k, v);
      return next(req);
    };
    // HTTP/2 pings while a call is open (a worker's Lease stream always
    // is) let both sides find a silent peer: the server reclaims a dead
    // worker's jobs when its stream drops, and the worker reconnects. An
    // idle connection is checked by a ping before its next call instead:
    // connect-node's idle pings can fire on a session already destroyed,
    // an uncaught ERR_HTTP2_INVALID_SESSION.
    this.session = new Http2SessionManager(
      this.endpoint.baseUrl,
      { pingIntervalMs: 10_000, pingTimeoutMs: 10_000, pingIdleConnection: false },
      tls,
    );
    const transport = createGrpcTransport({
      baseUrl: this.endpoint.baseUrl,
      sessionManager: this.session,
      interceptors: [headers],
      readMaxBytes: MAX_RECEIVE_BYTES,
    });
    this.raw = createClient(JobQueue, transport);
  }

  /** Closes the connection; calls in flight fail. */
  close(): void {
    this.session.abort();
  }

  /** Resolves once the server answers (any answer but "unreachable"); throws UNAVAILABLE after `timeoutMs`. */
  async waitReady(timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        await this.raw.stats({ queue: "" }, { timeoutMs: Math.max(100, Math.min(1000, deadline - Date.now())) });
        return;
      } catch (err) {
        const e = JobqError.from(err);
        if (!isTransient(e)) return;
        if (Date.now() >= deadline) throw e;
      }
      await sleep(50);
    }
  }

  private async call<T>(run: () => Promise<T>): Promise<T> {
    try {
      return await run();
    } catch (err) {
      throw JobqError.from(err);
    }
  }

  // -- producer ---------------------------------------------------------

  /**
   * Adds a job; resolves once it is durable. With a `key` that already names
   * a retained job in the queue, that job comes back with `created: false`,
   * so retrying an enqueue is safe.
   */
  async enqueue<K extends keyof Kinds & string>(
    queue: string,
    kind: K,
    payload: Kinds[K],
    options: EnqueueOptions = {},
  ): Promise<{ job: Job; created: boolean; outcome: EnqueueOutcomeName }> {
    const req = await this.enqueueRequest(queue, kind, payload, options);
    const resp = await this.call(() => this.raw.enqueue(req, { timeoutMs: this.timeoutMs }));
    if (resp.job === undefined) throw new JobqError("INTERNAL", "Enqueue replied without a job");
    return { job: resp.job, created: resp.created, outcome: outcomeName(resp.outcome, resp.created) };
  }

  /** Adds many jobs, durable with one flush; one result per entry, in order (a rejected entry has errorCode set). */
  async enqueueBatch(jobs: readonly EnqueueSpec<Kinds>[]): Promise<EnqueueResult[]> {
    const reqs = await Promise.all(jobs.map((j) => this.enqueueRequest(j.queue, j.kind, j.payload, j)));
    const resp = await this.call(() => this.raw.enqueueBatch({ jobs: reqs }, { timeoutMs: this.timeoutMs }));
    return resp.results;
  }

  private async enqueueRequest(queue: string, kind: string, payload: unknown, o: EnqueueOptions) {
    return create(EnqueueRequestSchema, {
      queue,
      kind,
      payload: encodePayload(payload),
      key: o.key ?? "",
      maxAttempts: o.maxAttempts ?? 0,
      delay: duration(o.delayMs),
      metadata: await withTraceContext(o.metadata),
      priority: o.priority ?? 0,
      group: o.group ?? "",
      maxSnoozes: o.maxSnoozes,
      keyScope: o.keyScope === "active" ? KeyScope.ACTIVE : KeyScope.UNSPECIFIED,
      onConflict: o.replace === true ? OnConflict.REPLACE : OnConflict.UNSPECIFIED,
      uniqueFor: duration(o.uniqueForMs),
    });
  }

  // -- worker side (the Worker is the usual way) ------------------------

  /** Leases the next due job, or undefined when nothing is due (after `waitMs` of long-polling). */
  async dequeue(
    queues: readonly string[],
    workerId: string,
    options: { leaseMs?: number; waitMs?: number } = {},
  ): Promise<LeasedJob | undefined> {
    const req = {
      queues: checkQueues(queues),
      workerId,
      leaseDuration: duration(options.leaseMs),
      wait: duration(options.waitMs),
    };
    const resp = await this.call(() => this.raw.dequeue(req, { timeoutMs: this.timeoutMs + (options.waitMs ?? 0) }));
    return resp.leased;
  }

  /**
   * RUNNING -> DONE, storing `result` with the job (getJob reads it back;
   * at most the server's --max-result-bytes, else INVALID_ARGUMENT and no
   * ack). ABORTED when the lease is no longer the caller's.
   */
  async ack(
    jobId: string,
    leaseId: string,
    options: { result?: Uint8Array; timeoutMs?: number } = {},
  ): Promise<Job> {
    const req = { jobId, leaseId, result: options.result ?? new Uint8Array() };
    const resp = await this.call(() => this.raw.ack(req, { timeoutMs: options.timeoutMs ?? this.timeoutMs }));
    return resp.job!;
  }

  /**
   * Ends an attempt badly: PENDING again after `retryDelayMs` (default: the
   * server's backoff), or FAILED when `fatal` or out of attempts. With
   * `snoozeMs` it is no failure: PENDING again after that long, the attempt
   * not counted (`error` is the reason). ABORTED when the lease is no
   * longer the caller's.
   */
  async fail(
    jobId: string,
    leaseId: string,
    error: string,
    options: { retryDelayMs?: number; fatal?: boolean; snoozeMs?: number; timeoutMs?: number } = {},
  ): Promise<Job> {
    const req = {
      jobId,
      leaseId,
      error,
      retryDelay: duration(options.retryDelayMs),
      fatal: options.fatal ?? false,
      snooze: duration(options.snoozeMs),
    };
    const resp = await this.call(() => this.raw.fail(req, { timeoutMs: options.timeoutMs ?? this.timeoutMs }));
    return resp.job!;
  }

  /**
   * Extends leases; resolves to the ones the worker no longer holds. One call
   * per MAX_HEARTBEAT_LEASES leases.
   */
  async heartbeat(
    workerId: string,
    leases: readonly LeaseRefLike[],
    options: HeartbeatOptions = {},
  ): Promise<LeaseRefLike[]> {
    const lost: LeaseRefLike[] = [];
    const chunks: LeaseRefLike[][] = [];
    for (let i = 0; i < leases.length; i += MAX_HEARTBEAT_LEASES) chunks.push(leases.slice(i, i + MAX_HEARTBEAT_LEASES));
    if (chunks.length === 0) chunks.push([]);
    for (const chunk of chunks) {
      const req = {
        workerId,
        leases: chunk.map((l) => ({
          jobId: l.jobId,
          leaseId: l.leaseId,
          progress: l.progress === undefined ? undefined : { percent: l.progress.percent, message: l.progress.message },
        })),
        extendBy: duration(options.extendByMs),
        draining: options.draining ?? false,
        streamToken: options.streamToken ?? "",
      };
      const resp = await this.call(() =>
        this.raw.heartbeat(req, { timeoutMs: options.timeoutMs ?? this.timeoutMs }),
      );
      for (const r of resp.lost) lost.push({ jobId: r.jobId, leaseId: r.leaseId });
    }
    return lost;
  }

  /**
   * Opens a Lease stream (the Worker's; no timeout). `onHeader` gets the
   * response headers, whose `jobq-stream-token` heartbeats present.
   * Iterating throws JobqError.
   */
  async *lease(
    request: { queues: readonly string[]; workerId: string; capacity?: number; leaseMs?: number; held?: readonly LeaseRefLike[] },
    options: { signal?: AbortSignal; onHeader?: (headers: Headers) => void } = {},
  ): AsyncGenerator<LeaseEvent> {
    const req = {
      queues: checkQueues(request.queues),
      workerId: request.workerId,
      capacity: request.capacity ?? 0,
      leaseDuration: duration(request.leaseMs),
      held: (request.held ?? []).map((l) => ({ jobId: l.jobId, leaseId: l.leaseId })),
    };
    try {
      for await (const event of this.raw.lease(req, options)) yield event;
    } catch (err) {
      throw JobqError.from(err);
    }
  }

  // -- operator ---------------------------------------------------------

  /** Brings a FAILED job back to PENDING with its attempts reset. */
  async retry(jobId: string): Promise<Job> {
    return (await this.call(() => this.raw.retry({ jobId }, { timeoutMs: this.timeoutMs }))).job!;
  }

  /**
   * PENDING or RUNNING -> FAILED with last_error "cancelled: <reason>"; a
   * running job's worker is sent `revoked` and its handler's signal aborts.
   * FAILED_PRECONDITION for a DONE or FAILED job. Needs the admin role.
   */
  async cancelJob(id: string, reason = ""): Promise<Job> {
    return (await this.call(() => this.raw.cancelJob({ id, reason }, { timeoutMs: this.timeoutMs }))).job!;
  }

  /** Nothing is taken from `queue` until resumeQueue. Persisted. Needs the admin role. */
  async pauseQueue(queue: string): Promise<void> {
    await this.call(() => this.raw.pauseQueue({ queue }, { timeoutMs: this.timeoutMs }));
  }

  /** Undoes pauseQueue. Needs the admin role. */
  async resumeQueue(queue: string): Promise<void> {
    await this.call(() => this.raw.resumeQueue({ queue }, { timeoutMs: this.timeoutMs }));
  }

  /** Whether `queue` is paused. */
  async paused(queue: string): Promise<boolean> {
    return (await this.stats(queue))[queue]?.paused ?? false;
  }

  /**
   * Limits how many of `queue`'s jobs run at once, over every server and per group; a held
   * job stays PENDING and keeps its place. All 0 (or `{}`) clears the policy. Persisted.
   * INVALID_ARGUMENT over 100 000, RESOURCE_EXHAUSTED past --max-queue-policies. Needs the admin role.
   */
  async setQueuePolicy(queue: string, policy: QueuePolicyLimits): Promise<void> {
    const wire = (r: RateLimitSpec | undefined) => r && { limit: r.limit, per: duration(r.perMs), burst: r.burst ?? 0 };
    const limits = {
      maxRunning: policy.maxRunning ?? 0,
      groupMaxRunning: policy.groupMaxRunning ?? 0,
      rate: wire(policy.rate),
      groupRate: wire(policy.groupRate),
    };
    await this.call(() => this.raw.setQueuePolicy({ queue, policy: limits }, { timeoutMs: this.timeoutMs }));
  }

  /** The policy of `queue` (all 0 when it has none). */
  async queuePolicy(queue: string): Promise<QueuePolicyView> {
    const resp = await this.call(() => this.raw.getQueuePolicy({ queue }, { timeoutMs: this.timeoutMs }));
    return policyView(resp.policy);
  }

  /** Deletes a PENDING, DONE or FAILED job for good; FAILED_PRECONDITION for a RUNNING one. */
  async deleteJob(id: string): Promise<void> {
    await this.call(() => this.raw.deleteJob({ id }, { timeoutMs: this.timeoutMs }));
  }

  /**
   * Deletes `queue`'s DONE and/or FAILED jobs (no status: both) finished
   * before `finishedBefore` (default now), or with status PENDING its
   * PENDING jobs; resolves to how many.
   */
  async purgeJobs(queue: string, options: { status?: StatusLike; finishedBefore?: Date } = {}): Promise<number> {
    const req = {
      queue,
      status: statusValue(options.status),
      finishedBefore: options.finishedBefore ? timestampFromDate(options.finishedBefore) : undefined,
    };
    return Number((await this.call(() => this.raw.purgeJobs(req, { timeoutMs: this.timeoutMs }))).deleted);
  }

  /** Creates (or replaces) a schedule: every tick of `cron` enqueues one job. Needs the admin role. */
  async createSchedule(options: CreateScheduleOptions<Kinds>): Promise<Schedule> {
    const req = {
      name: options.name,
      queue: options.queue,
      kind: options.kind,
      cron: options.cron,
      payload: encodePayload(options.payload),
      timezone: options.timezone ?? "",
      maxAttempts: options.maxAttempts ?? 0,
    };
    const resp = await this.call(() => this.raw.createSchedule(req, { timeoutMs: this.timeoutMs }));
    return resp.schedule!;
  }

  /** Deletes a schedule (its jobs stay); NOT_FOUND if unknown. */
  async deleteSchedule(name: string): Promise<void> {
    await this.call(() => this.raw.deleteSchedule({ name }, { timeoutMs: this.timeoutMs }));
  }

  /** Every schedule the caller may read, by name, with next run times. */
  async listSchedules(): Promise<Schedule[]> {
    return (await this.call(() => this.raw.listSchedules({}, { timeoutMs: this.timeoutMs }))).schedules;
  }

  /** One job, with its payload and attempt history. */
  async getJob(id: string): Promise<Job> {
    return this.call(() => this.raw.getJob({ id }, { timeoutMs: this.timeoutMs }));
  }

  /**
   * The jobs' states as they change (the WatchJob stream): each one's
   * current state, then each change, without payloads, until every one is
   * DONE or FAILED. Iterating throws JobqError (NOT_FOUND for an unknown
   * or deleted job).
   */
  async *watchJob(ids: readonly string[], options: { signal?: AbortSignal; timeoutMs?: number } = {}): AsyncGenerator<Job> {
    try {
      for await (const job of this.raw.watchJob({ ids: [...ids] }, options)) yield job;
    } catch (err) {
      throw JobqError.from(err);
    }
  }

  /**
   * Waits until the job is DONE and returns it, with its `result`. Throws
   * JobFailedError (with the job) when it ends FAILED, a cancel included,
   * and WaitTimeoutError when `timeoutMs` passes first. A stream cut by a
   * server restart is opened again.
   */
  async wait(jobId: string, timeoutMs: number): Promise<Job> {
    const deadline = Date.now() + timeoutMs;
    const backoff = new Backoff();
    for (;;) {
      const left = deadline - Date.now();
      if (left <= 0) throw new WaitTimeoutError(jobId, timeoutMs);
      try {
        for await (const job of this.watchJob([jobId], { timeoutMs: left })) {
          if (job.status === JobStatus.DONE) return job;
          if (job.status === JobStatus.FAILED) throw new JobFailedError(job);
        }
      } catch (err) {
        if (!(err instanceof JobqError)) throw err;
        if (err.code === "DEADLINE_EXCEEDED") throw new WaitTimeoutError(jobId, timeoutMs);
        if (!isTransient(err)) throw err;
      }
      // Cut, or ended without a final state: follow it again, after a pause.
      await sleep(Math.min(backoff.nextDelay(), Math.max(0, deadline - Date.now())));
    }
  }

  /** One page of jobs, in id order; pass nextPageToken back for the next. */
  async listJobsPage(options: ListJobsOptions & { pageToken?: string } = {}): Promise<{ jobs: Job[]; nextPageToken: string }> {
    const req = {
      queue: options.queue ?? "",
      status: statusValue(options.status),
      key: options.key ?? "",
      pageSize: options.pageSize ?? 0,
      pageToken: options.pageToken ?? "",
      omitPayload: options.omitPayload ?? false,
    };
    const resp = await this.call(() => this.raw.listJobs(req, { timeoutMs: this.timeoutMs }));
    return { jobs: resp.jobs, nextPageToken: resp.nextPageToken };
  }

  /** Every matching job, following the page tokens. */
  async *listJobs(options: ListJobsOptions = {}): AsyncGenerator<Job> {
    let pageToken = "";
    do {
      const page = await this.listJobsPage({ ...options, pageToken });
      yield* page.jobs;
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }

  /** Counts per queue: `{ emails: { pending, running, done, failed, paused, oldestPendingAgeMs } }`. */
  async stats(queue = ""): Promise<Record<string, QueueCounts>> {
    const resp = await this.call(() => this.raw.stats({ queue }, { timeoutMs: this.timeoutMs }));
    const out: Record<string, QueueCounts> = {};
    for (const q of resp.queues) {
      out[q.queue] = {
        pending: Number(q.pending),
        running: Number(q.running),
        done: Number(q.done),
        failed: Number(q.failed),
        paused: q.paused,
        oldestPendingAgeMs: millis(q.oldestPendingAge),
        policy: policyView(q.policy),
        heldMaxRunning: Number(q.heldMaxRunning),
        heldGroupMaxRunning: Number(q.heldGroupMaxRunning),
        heldRate: Number(q.heldRate),
        heldGroupRate: Number(q.heldGroupRate),
      };
    }
    return out;
  }
}

/** A policy from the wire (unset: none). */
function policyView(p: QueuePolicy | undefined): QueuePolicyView {
  const view = (r: RateLimit | undefined) =>
    r && r.limit > 0 ? { limit: r.limit, perMs: millis(r.per) ?? 0, burst: r.burst } : undefined;
  return {
    maxRunning: p?.maxRunning ?? 0,
    groupMaxRunning: p?.groupMaxRunning ?? 0,
    rate: view(p?.rate),
    groupRate: view(p?.groupRate),
  };
}
