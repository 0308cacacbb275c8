// JobContext: what a handler gets, the job plus its lease.

import { PROGRESS_MESSAGE_BYTES, type ProgressReport } from "./client.js";
import { HandlerError } from "./errors.js";
import type { Job } from "./gen/jobq/v1/jobq_pb.js";

const decoder = new TextDecoder("utf-8", { fatal: true });
const encoder = new TextEncoder();


/**
 * One leased job as its handler sees it. `T` is the payload type of the
 * job's kind (JSON unless the producer sent bytes).
 *
 * `signal` aborts when the handler should stop: the lease was revoked (an
 * operator's CancelJob) or reported lost, its deadline passed while
 * heartbeats could not reach the server, or the worker's drain deadline
 * passed. `cancelReason` says which. The worker then neither acks nor fails
 * the job. Pass `signal` to fetch() and friends, or check `cancelled`.
 */
export class JobContext<T = unknown> {
  /** The job as the server sent it (RUNNING), with payload and metadata. */
  readonly job: Job;
  /** The lease's fencing token (Ack and Fail present it). */
  readonly leaseId: string;
  /** The id of the worker running the job. */
  readonly workerId: string;
  private readonly abort = new AbortController();
  private deadline: number;
  private decoded: { value: T } | undefined;
  private unsent: ProgressReport | undefined;
  /** @internal The drain deadline cut its handler off: the drain gives the job back. */
  cutOff = false;

  /** @internal The worker makes these. */
  constructor(job: Job, leaseId: string, workerId: string, leaseDeadlineMs: number) {
    this.job = job;
    this.leaseId = leaseId;
    this.workerId = workerId;
    this.deadline = leaseDeadlineMs;
  }

  get id(): string {
    return this.job.id;
  }
  get queue(): string {
    return this.job.queue;
  }
  get kind(): string {
    return this.job.kind;
  }
  /** The job's domain key, or undefined when it has none. */
  get key(): string | undefined {
    return this.job.key === "" ? undefined : this.job.key;
  }
  /** The raw payload bytes. */
  get payload(): Uint8Array {
    return this.job.payload;
  }
  get metadata(): Record<string, string> {
    return { ...this.job.metadata };
  }
  /** Which run this is, from 1 (the server's `attempts` counts the runs that ended without an ack). */
  get attempt(): number {
    return this.job.attempts + 1;
  }
  get maxAttempts(): number {
    return this.job.maxAttempts;
  }
  /** When the lease ends unless a heartbeat extends it (moves forward with every heartbeat that gets through). */
  get leaseExpiresAt(): Date {
    return new Date(this.deadline);
  }
  /** Aborts when the handler should stop (see the class doc). */
  get signal(): AbortSignal {
    return this.abort.signal;
  }
  get cancelled(): boolean {
    return this.abort.signal.aborted;
  }
  /** Why the signal aborted ("revoked: ...", "lease lost ...", ...); empty until then. */
  get cancelReason(): string {
    return this.cancelled ? String(this.abort.signal.reason) : "";
  }

  /**
   * The payload decoded as JSON (cached). A payload that is not JSON throws
   * a fatal HandlerError: retrying cannot fix it, so it must not burn every
   * attempt.
   */
  get data(): T {
    if (this.decoded === undefined) this.decoded = { value: this.json<T>() };
    return this.decoded.value;
  }

  /** The payload decoded as JSON, as `U`; see `data`. */
  json<U = T>(): U {
    try {
      return JSON.parse(decoder.decode(this.job.payload)) as U;
    } catch (err) {
      throw HandlerError.fatal(`payload is not JSON: ${err instanceof Error ? err.message : String(err)}`, err);
    }
  }

  /** The payload as UTF-8 text. */
  text(): string {
    return new TextDecoder().decode(this.job.payload);
  }

  /**
   * Reports how far the job has come: `percent` (kept within 0 to 100) and a
   * short message (cut to 256 bytes of UTF-8). The worker's next heartbeat
   * (every lease/3) carries the latest report, which the server keeps with
   * the job: `getJob(id)`, `watch` and the dashboard show it as
   * `job.progress`. Reports between two heartbeats cost nothing but the last.
   */
  progress(percent: number, message = ""): void {
    let bytes = encoder.encode(message);
    if (bytes.length > PROGRESS_MESSAGE_BYTES) {
      let cut = PROGRESS_MESSAGE_BYTES;
      // Back to the start of a UTF-8 character.
      while (cut > 0 && ((bytes[cut] ?? 0) & 0xc0) === 0x80) cut--;
      bytes = bytes.subarray(0, cut);
    }
    const p = Math.round(Number.isFinite(percent) ? percent : 0);
    this.unsent = { percent: Math.max(0, Math.min(100, p)), message: new TextDecoder().decode(bytes) };
  }

  /** @internal The report no heartbeat has carried yet. */
  report(): ProgressReport | undefined {
    return this.unsent;
  }

  /** @internal `sent` was carried (or refused): forgotten, unless reported again since. */
  reported(sent: ProgressReport): void {
    if (this.unsent === sent) this.unsent = undefined;
  }

  /** @internal The lease deadline as epoch ms. */
  leaseDeadline(): number {
    return this.deadline;
  }

  /** @internal Only later: of two overlapping heartbeats, the older may answer last. */
  extendTo(deadlineMs: number): void {
    this.deadline = Math.max(this.deadline, deadlineMs);
  }

  /** @internal Aborts the signal once; later reasons are ignored. */
  cancel(reason: string): void {
    if (!this.abort.signal.aborted) this.abort.abort(reason);
  }

  toString(): string {
    return `JobContext(id=${this.id}, kind=${this.kind}, attempt=${this.attempt}, leaseId=${this.leaseId})`;
  }
}
