// Worker: runs handlers for jobs pushed on a Lease stream, with the Rust
// Worker's semantics (crates/client/src/worker.rs, job.rs, heartbeat.rs).

import { hostname } from "node:os";

import { Book } from "./book.js";
import { type Client, checkQueues } from "./client.js";
import { JobContext } from "./context.js";
import { errorText, HandlerError, isRefusedForGood, isTransient, JobqError } from "./errors.js";
import type { LeasedJob, LeaseEvent } from "./gen/jobq/v1/jobq_pb.js";
import { type AnyKinds, encodeResult, type KindMap } from "./payload.js";
import { Backoff, sleep } from "./time.js";
import { inJobSpan } from "./trace.js";

/** After the drain empties, how long to keep reading the stream for a job pushed just before the server saw the drain. */
const DRAIN_SETTLE_MS = 100;
/** How long handlers get to end after the drain deadline aborted them. */
const ABORT_GRACE_MS = 1000;
/** How long a give-back at the drain deadline may wait for its answer. */
const GIVE_BACK_TIMEOUT_MS = 2000;
/** How often the worker looks at lease deadlines and whether a heartbeat is due. */
const TICK_MS = 50;

/**
 * A handler: resolves to ack, throws to fail (a HandlerError says how). What
 * it resolves to is the job's result, stored by the ack (see
 * `encodeResult`): bytes as they are, a string as text, anything else as
 * JSON; `undefined` is none.
 */
export type Handler<T = unknown> = (ctx: JobContext<T>) => Promise<unknown> | unknown;

/** One handler per kind; a job of a kind with no handler fails retryably. */
export type Handlers<Kinds extends KindMap = AnyKinds> = {
  [K in keyof Kinds & string]?: Handler<Kinds[K]>;
};

/** Where the worker reports what it does; `console` fits. */
export interface Logger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

/** Warnings and errors to stderr; info is dropped. */
const quiet: Logger = {
  info: () => {},
  warn: (m) => console.error(`jobq: ${m}`),
  error: (m) => console.error(`jobq: ${m}`),
};

export interface WorkerOptions<Kinds extends KindMap = AnyKinds> {
  /** Queues to take from, in strict priority order. */
  queues: readonly string[];
  /** `{ kind: handler }`, or one handler for every kind. */
  handlers: Handlers<Kinds> | Handler<unknown>;
  /** Default `<hostname>-<pid>`. Keep it across reconnects (it is what `held` is checked against). */
  workerId?: string;
  /** Most jobs run at once; default 1. */
  capacity?: number;
  /** Lease length; default 30 000 ms. */
  leaseMs?: number;
  /** Default leaseMs / 3; must be shorter than the lease. */
  heartbeatEveryMs?: number;
  /** How long a drain lets running handlers finish; default 30 000 ms. */
  drainTimeoutMs?: number;
  /** Drain on SIGTERM and SIGINT (a second one stops at once); default true. */
  handleSignals?: boolean;
  logger?: Logger;
}

/** `<hostname>-<pid>`. */
export function defaultWorkerId(): string {
  return `${hostname()}-${process.pid}`;
}

/** Capacity permits: one per running handler. */
class Slots {
  private waiters: Array<() => void> = [];
  constructor(private free: number) {}

  /** Resolves true with a permit, or false when `signal` aborts first. */
  acquire(signal: AbortSignal): Promise<boolean> {
    if (signal.aborted) return Promise.resolve(false);
    if (this.free > 0) {
      this.free--;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const grant = (): void => {
        signal.removeEventListener("abort", giveUp);
        resolve(true);
      };
      const giveUp = (): void => {
        this.waiters = this.waiters.filter((w) => w !== grant);
        resolve(false);
      };
      this.waiters.push(grant);
      signal.addEventListener("abort", giveUp, { once: true });
    });
  }

  release(): void {
    const next = this.waiters.shift();
    if (next !== undefined) next();
    else this.free++;
  }
}

/** When a pushed lease runs out on this machine's clock: its granted length (from the server's two timestamps), counted from now. */
function leaseDeadline(leased: LeasedJob, leaseMs: number, now: number): number {
  const expires = leased.leaseExpiresAt;
  const taken = leased.job?.takenAt;
  if (expires !== undefined && taken !== undefined) {
    const span = Number(expires.seconds - taken.seconds) * 1000 + (expires.nanos - taken.nanos) / 1e6;
    if (span > 0) return now + span;
  }
  return now + leaseMs;
}

/**
 * Runs handlers for jobs pushed on a Lease stream, as the Rust Worker does:
 *
 * - holds one Lease stream of `capacity`, reopened with jittered backoff
 *   (100 ms doubling to 5 s) when it fails, declaring the leases it still
 *   holds (`held`); handlers keep running meanwhile and still ack;
 * - runs each job's handler, at most `capacity` at a time, in a span `job`
 *   that continues the producer's trace (with @opentelemetry/api installed);
 * - acks a handler that resolved; fails one that threw (a HandlerError can
 *   be fatal or carry a retry delay); a kind with no handler fails
 *   retryably (another worker may have it during a rolling deploy);
 * - retries an Ack or Fail that could not reach the server, with backoff,
 *   until it lands (a job that finished during a restart is acked, not run
 *   again); ABORTED (lease lost) is final;
 * - heartbeats every lease in one batched call each `heartbeatEveryMs`,
 *   carrying the stream's token; a lease reported lost, revoked on the
 *   stream (CancelJob), or whose deadline passed while heartbeats could not
 *   get through aborts its handler's `signal` and is neither acked nor failed;
 * - on SIGTERM/SIGINT or stop(): drains (takes no more jobs, lets running
 *   handlers finish and acks them, for up to `drainTimeoutMs`), then closes
 *   the stream so nothing is reclaimed. A second signal stops at once.
 */
export class Worker<Kinds extends KindMap = AnyKinds> {
  readonly workerId: string;
  readonly queues: string[];
  readonly capacity: number;
  readonly leaseMs: number;
  readonly heartbeatEveryMs: number;
  readonly drainTimeoutMs: number;
  private readonly client: Client<Kinds>;
  private readonly handlers: Handlers<Kinds> | Handler<unknown>;
  private readonly handleSignals: boolean;
  private readonly log: Logger;

  private readonly book = new Book();
  private readonly slots: Slots;
  /** Handlers running now (a cut-off one until it really returns). */
  private handling = 0;
  private readonly running = new Set<Promise<void>>();
  private readonly stopping = new AbortController();
  private hardStop = false;
  private draining = false;
  private streamToken = "";
  private streamOpen = false;
  private streamAbort: AbortController | undefined;
  private lastEvent = 0;
  private beating: Promise<void> | undefined;
  private refused: JobqError | undefined;
  private started = false;

  constructor(client: Client<Kinds>, options: WorkerOptions<Kinds>) {
    this.client = client;
    this.queues = checkQueues(options.queues);
    const h = options.handlers as unknown;
    if (typeof h !== "function") {
      if (h === null || typeof h !== "object") throw new TypeError("handlers must be a function or a { kind: function } map");
      for (const [kind, fn] of Object.entries(h)) {
        if (typeof fn !== "function") throw new TypeError(`the handler for kind ${JSON.stringify(kind)} is not a function`);
      }
    }
    this.handlers = options.handlers;
    this.workerId = options.workerId ?? defaultWorkerId();
    this.capacity = options.capacity ?? 1;
    this.leaseMs = options.leaseMs ?? 30_000;
    this.heartbeatEveryMs = options.heartbeatEveryMs ?? this.leaseMs / 3;
    this.drainTimeoutMs = options.drainTimeoutMs ?? 30_000;
    this.handleSignals = options.handleSignals ?? true;
    this.log = options.logger ?? quiet;
    if (!Number.isInteger(this.capacity) || this.capacity < 1) {
      throw new RangeError(`capacity must be an integer of at least 1, not ${this.capacity}`);
    }
    if (!(this.leaseMs > 0)) throw new RangeError(`leaseMs must be positive, not ${this.leaseMs}`);
    if (!(this.heartbeatEveryMs > 0 && this.heartbeatEveryMs < this.leaseMs)) {
      throw new RangeError(
        `heartbeatEveryMs (${this.heartbeatEveryMs}) must be positive and shorter than the lease ` +
          `(${this.leaseMs}), or every lease runs out before its first heartbeat`,
      );
    }
    if (!(this.drainTimeoutMs >= 0)) throw new RangeError(`drainTimeoutMs must not be negative, not ${this.drainTimeoutMs}`);
    this.slots = new Slots(this.capacity);
  }

  /**
   * Takes and runs jobs until stop() (or SIGTERM/SIGINT), then drains and
   * resolves. Server outages are retried, not thrown; rejects with the
   * JobqError when the very first Lease stream is refused for good
   * (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, UNIMPLEMENTED).
   */
  async run(): Promise<void> {
    if (this.started) throw new Error("a Worker runs once; make a new one");
    this.started = true;
    const removeSignals = this.handleSignals ? this.installSignals() : () => {};
    let nextBeat = Date.now() + this.heartbeatEveryMs;
    const ticker = setInterval(() => {
      for (const ctx of this.book.expired(Date.now())) {
        this.log.warn(`job ${ctx.id}: lease deadline passed without a successful heartbeat; cancelling its handler`);
        ctx.cancel("lease deadline passed without a successful heartbeat");
      }
      if (Date.now() >= nextBeat) {
        nextBeat = Date.now() + this.heartbeatEveryMs;
        void this.beat();
      }
    }, TICK_MS);
    const serving = this.serve();
    try {
      await new Promise<void>((resolve) => this.stopping.signal.addEventListener("abort", () => resolve(), { once: true }));
      if (this.refused === undefined) await this.drain();
    } finally {
      this.streamAbort?.abort();
      await serving;
      clearInterval(ticker);
      await this.beating;
      removeSignals();
      this.log.info(`worker ${this.workerId} stopped`);
    }
    if (this.refused !== undefined) throw this.refused;
  }

  /** Asks run() to drain and resolve. A second call stops at once (handlers are aborted). */
  stop(): void {
    if (this.stopping.signal.aborted) this.hardStop = true;
    this.stopping.abort();
  }

  // -- the stream ---------------------------------------------------------

  private async serve(): Promise<void> {
    const backoff = new Backoff();
    let everOpened = false;
    while (!this.stopping.signal.aborted) {
      const ac = new AbortController();
      this.streamAbort = ac;
      let why: string;
      try {
        // Leases in flight from an earlier stream count against this one's
        // capacity and belong to it from now on.
        const held = this.book.snapshot();
        const events = this.client.lease(
          { queues: this.queues, workerId: this.workerId, capacity: this.capacity, leaseMs: this.leaseMs, held },
          { signal: ac.signal, onHeader: (h) => this.opened(h.get("jobq-stream-token") ?? "") },
        );
        for await (const event of events) {
          everOpened = true;
          backoff.reset();
          this.lastEvent = Date.now();
          this.onEvent(event);
        }
        everOpened ||= this.streamToken !== "";
        why = "lease stream ended by the server";
      } catch (err) {
        const e = JobqError.from(err);
        if (ac.signal.aborted) return; // closed by run() after the drain
        if (!everOpened && this.streamToken === "" && isRefusedForGood(e)) {
          this.log.error(`the server refused the lease stream: ${e.message}`);
          this.refused = e;
          this.stopping.abort();
          return;
        }
        everOpened ||= this.streamToken !== "";
        why = `lease stream failed: ${e.message}`;
      } finally {
        this.streamOpen = false;
        this.streamToken = "";
      }
      // No reconnect while draining: in-flight jobs settle over unary calls.
      if (this.stopping.signal.aborted) return;
      // Ask now, not at the next tick, whether the jobs still running here
      // were reclaimed with the stream.
      if (this.book.size > 0) void this.beat();
      const delay = backoff.nextDelay();
      this.log.warn(`${why}; reconnecting in ${(delay / 1000).toFixed(1)}s (${this.book.size} in flight)`);
      await sleep(delay, this.stopping.signal);
    }
  }

  private opened(token: string): void {
    this.streamToken = token;
    this.streamOpen = token !== "";
    if (!this.streamOpen) return; // no token: the call failed, as iterating says
    this.log.info(`lease stream open (${this.book.size} in flight)`);
    // A drain's heartbeat sent before this stream had a token could not
    // stop its pushes: again, now.
    if (this.draining) void this.beat();
  }

  private onEvent(event: LeaseEvent): void {
    const ev = event.event;
    if (ev.case === "leased") {
      this.start(ev.value);
    } else if (ev.case === "revoked") {
      const r = ev.value;
      const ctx = this.book.revoke(r.jobId, r.leaseId);
      if (ctx !== undefined) {
        this.log.warn(`job ${r.jobId}: lease revoked (${r.reason}); cancelling its handler`);
        ctx.cancel(`revoked: ${r.reason}`);
      }
    }
  }

  private start(leased: LeasedJob): void {
    if (leased.job === undefined) {
      this.log.error(`leased event without a job (lease ${leased.leaseId}); ignoring`);
      return;
    }
    const ctx = new JobContext(leased.job, leased.leaseId, this.workerId, leaseDeadline(leased, this.leaseMs, Date.now()));
    const stale = this.book.insert(ctx);
    if (stale !== undefined) {
      this.log.warn(`job ${ctx.id}: leased again; cancelling the run under its old lease`);
      stale.cancel("leased again under a new lease");
    }
    const run = this.runOne(ctx).catch((err: unknown) => {
      // Our own bug, not the handler's: the job leaves the book (its lease
      // runs out and the server delivers it again).
      this.log.error(`job ${ctx.id}: ${errorText(err)}; leaving it to the server`);
      this.book.remove(ctx);
    });
    this.running.add(run);
    void run.finally(() => this.running.delete(run));
  }

  // -- one job ------------------------------------------------------------

  private async runOne(ctx: JobContext): Promise<void> {
    // Jobs can outnumber slots briefly after a reconnect; the extras wait
    // here, heartbeated.
    if (!(await this.slots.acquire(ctx.signal))) {
      this.log.warn(`job ${ctx.id}: lease lost before the handler started (${ctx.cancelReason})`);
      this.book.remove(ctx);
      return;
    }
    this.handling++;
    const handled = this.execute(ctx);
    // The slot is free when the handler really ends, even one that ignores
    // its signal: capacity is never exceeded.
    void handled.finally(() => {
      this.handling--;
      this.slots.release();
    });
    const aborted = new Promise<"aborted">((resolve) => {
      if (ctx.signal.aborted) resolve("aborted");
      ctx.signal.addEventListener("abort", () => resolve("aborted"), { once: true });
    });
    const outcome = await Promise.race([handled, aborted]);
    if (outcome === "aborted" || !this.book.holds(ctx)) {
      // Revoked, reported lost or past its deadline: someone else may hold
      // the job now. Cut off by the drain deadline: the drain gives it back.
      ctx.cutOff = outcome === "aborted" && this.hardStop;
      this.log.warn(`job ${ctx.id}: ${ctx.cancelReason || "lease lost"}; not acking`);
      this.book.remove(ctx);
      return;
    }
    await this.settle(ctx, outcome.error, outcome.result);
  }

  /**
   * Runs the handler; `error` is what it threw (undefined: ack), `result`
   * what it resolved to, encoded.
   */
  private async execute(ctx: JobContext): Promise<{ error: unknown; result?: Uint8Array }> {
    const map = typeof this.handlers === "function" ? undefined : (this.handlers as Record<string, Handler<unknown>>);
    const handler =
      map === undefined ? (this.handlers as Handler<unknown>) : Object.hasOwn(map, ctx.kind) ? map[ctx.kind] : undefined;
    if (handler === undefined) {
      // Retryable: another worker of the queue may have the handler (a
      // rolling deploy), and max_attempts still bounds the retries.
      return { error: HandlerError.retry(`no handler for kind ${JSON.stringify(ctx.kind)}`) };
    }
    const span = { id: ctx.id, queue: ctx.queue, kind: ctx.kind, attempt: ctx.attempt, metadata: ctx.job.metadata };
    let value: unknown;
    try {
      await inJobSpan(span, async () => {
        value = await handler(ctx);
      });
    } catch (err) {
      return { error: err ?? new Error("the handler threw a nullish value") };
    }
    try {
      return { error: undefined, result: encodeResult(value) };
    } catch (err) {
      // Its work is done: failing it would run it again. Acked without a
      // result, and said.
      this.log.warn(`job ${ctx.id}: the handler's return value has no JSON form (${errorText(err)}); acking without a result`);
      return { error: undefined };
    }
  }

  /**
   * Acks (no error) or fails the job. Transient errors are retried with
   * backoff, whatever the lease's deadline says (a restarted server keeps
   * leases and gives them a grace; the job stays in the book, heartbeated,
   * declared in `held` on a reconnect) until the server answers: ABORTED
   * (lease lost) is final. A hard stop ends the retries.
   */
  private async settle(ctx: JobContext, error: unknown, result?: Uint8Array): Promise<void> {
    const backoff = new Backoff();
    const verb = error === undefined ? "ack" : "fail";
    const text = error === undefined ? "" : errorText(error);
    const fatal = error instanceof HandlerError && error.fatal;
    let retryDelayMs = error instanceof HandlerError ? error.retryDelayMs : undefined;
    let snoozeMs = error instanceof HandlerError ? error.snoozeMs : undefined;
    let first = true;
    for (;;) {
      if (!first && (ctx.cancelled || this.hardStop)) {
        this.log.warn(`job ${ctx.id}: lease lost or worker stopping before ${verb}; leaving the job to the server`);
        this.book.remove(ctx);
        return;
      }
      const retry = !first;
      first = false;
      this.book.settling(ctx);
      const timeoutMs = Math.max(1000, Math.min(this.client.timeoutMs, ctx.leaseDeadline() - Date.now()));
      try {
        if (error === undefined) {
          await this.client.ack(ctx.id, ctx.leaseId, { result, timeoutMs });
          this.book.remove(ctx);
          this.log.info(`job ${ctx.id}: acked`);
        } else {
          await this.client.fail(ctx.id, ctx.leaseId, text, { fatal, retryDelayMs, snoozeMs, timeoutMs });
          this.book.remove(ctx);
          this.log.info(`job ${ctx.id}: ${snoozeMs !== undefined ? "snoozed" : `failed${fatal ? " for good" : ""}`} (${text})`);
        }
        return;
      } catch (err) {
        const e = JobqError.from(err);
        if (retry && error === undefined && e.code === "FAILED_PRECONDITION") {
          // An earlier try reached the server (its reply was lost): the job
          // is DONE under this lease.
          this.book.remove(ctx);
          this.log.info(`job ${ctx.id}: acked (an earlier try had reached the server)`);
          return;
        }
        if (error === undefined && e.code === "INVALID_ARGUMENT") {
          // The result is over the server's --max-result-bytes: no retry
          // makes it smaller, so the job fails for good, saying why.
          this.log.warn(`job ${ctx.id}: the server refused the result (${e.serverMessage}); failing the job`);
          error = HandlerError.fatal(`the server refused the result: ${e.serverMessage}`);
          return this.settle(ctx, error);
        }
        if (error !== undefined && e.code === "INVALID_ARGUMENT" && (retryDelayMs !== undefined || snoozeMs !== undefined)) {
          this.log.warn(
            `job ${ctx.id}: the server refused the ${snoozeMs !== undefined ? "snooze" : "retry delay"} (${e.serverMessage}); failing with its backoff instead`,
          );
          retryDelayMs = undefined;
          snoozeMs = undefined;
          continue;
        }
        if (e.code === "ABORTED") {
          this.log.warn(`job ${ctx.id}: lease no longer held; ${verb} refused: ${e.serverMessage}`);
          this.book.remove(ctx);
          return;
        }
        if (isTransient(e)) {
          const delay = backoff.nextDelay();
          this.log.warn(
            `job ${ctx.id}: ack/fail did not reach the server (${e.code}); retrying in ${(delay / 1000).toFixed(1)}s`,
          );
          await sleep(delay, ctx.signal);
          continue;
        }
        this.log.error(`job ${ctx.id}: could not ${verb} (${e.message}); the server will reclaim it`);
        this.book.remove(ctx);
        return;
      }
    }
  }

  // -- heartbeats -----------------------------------------------------------

  /** One batched heartbeat (never two at once: a second request joins the one in flight). */
  private beat(): Promise<void> {
    this.beating ??= this.beatOnce().finally(() => {
      this.beating = undefined;
    });
    return this.beating;
  }

  private async beatOnce(): Promise<void> {
    const sent = this.book.snapshot();
    // Sent with no leases too while draining (that is what stops the
    // pushes) and while a stream is open (it says the worker is alive).
    if (sent.length === 0 && !this.draining && this.streamToken === "") return;
    const sentAt = Date.now();
    const options = {
      extendByMs: this.leaseMs,
      draining: this.draining,
      streamToken: this.streamToken,
      timeoutMs: Math.max(1000, this.heartbeatEveryMs),
    };
    let lost;
    try {
      lost = await this.client.heartbeat(this.workerId, sent, options);
    } catch (err) {
      // The leases may well still be valid (a restarting server): handlers
      // keep running until their deadline.
      this.log.warn(`heartbeat failed (${JobqError.from(err).code}); ${sent.length} leases`);
      return;
    }
    this.book.reported(sent);
    for (const ctx of this.book.applyHeartbeat(sent, lost, sentAt + this.leaseMs)) {
      this.log.warn(`job ${ctx.id}: lease lost; cancelling its handler`);
      ctx.cancel("lease lost (heartbeat)");
    }
  }

  // -- shutdown ---------------------------------------------------------------

  private async drain(): Promise<void> {
    this.draining = true;
    this.log.info(`shutting down; draining ${this.book.size} in flight`);
    // Tell the server now, not at the next tick (a heartbeat already in
    // flight was sent without the drain flag).
    await this.beating;
    await this.beat();
    this.lastEvent = Math.max(this.lastEvent, Date.now());
    const deadline = Date.now() + this.drainTimeoutMs;
    for (;;) {
      if (this.book.size === 0) {
        const quiet = Date.now() - this.lastEvent >= DRAIN_SETTLE_MS;
        if (quiet || !this.streamOpen) return;
      }
      if (this.hardStop || Date.now() >= deadline) break;
      await sleep(20);
    }
    const giveBack = !this.hardStop;
    this.log.warn(
      `drain deadline passed with ${this.book.size} in flight; cancelling their handlers${giveBack ? ", then giving their jobs back" : ""}`,
    );
    this.hardStop = true;
    const cut = this.book.contexts();
    for (const ctx of cut) ctx.cancel("worker stopping: drain deadline passed");
    // The handlers wind down first; one whose ack was on its way is left to it.
    const end = Date.now() + ABORT_GRACE_MS;
    while (this.handling > 0 && Date.now() < end) await sleep(20);
    if (!giveBack) return;
    // Given back, all at once: the cut-off ones, and those still running.
    await Promise.all(cut.filter((ctx) => ctx.cutOff || this.book.claim(ctx)).map((ctx) => this.giveBack(ctx)));
  }

  /**
   * Puts a job the drain deadline cut off back at once (a snooze of zero):
   * due for another worker without spending an attempt. One try; if it does
   * not get through, the server reclaims the job when the stream closes
   * (which does spend one).
   */
  private async giveBack(ctx: JobContext): Promise<void> {
    try {
      await this.client.fail(ctx.id, ctx.leaseId, "given back: the worker's drain deadline passed", {
        snoozeMs: 0,
        timeoutMs: GIVE_BACK_TIMEOUT_MS,
      });
      this.log.info(`job ${ctx.id}: given back at the drain deadline; no attempt spent`);
    } catch (err) {
      this.log.warn(`job ${ctx.id}: could not give it back (${JobqError.from(err).code}); the server will reclaim it`);
    }
    this.book.remove(ctx);
  }

  private installSignals(): () => void {
    const onSignal = (sig: NodeJS.Signals): void => {
      this.log.info(`${sig}: draining (again to stop at once)`);
      this.stop();
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    return () => {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    };
  }
}
