// The one error class the client throws for a call the server (or the
// connection) refused, and the error a handler throws to say how its job
// failed.

import { ConnectError } from "@connectrpc/connect";
import type { Job } from "./gen/jobq/v1/jobq_pb.js";

/** gRPC status code names, by number (as grpcurl, the CLI and the Python client spell them). */
const CODE_NAMES = [
  "OK",
  "CANCELLED",
  "UNKNOWN",
  "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "PERMISSION_DENIED",
  "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION",
  "ABORTED",
  "OUT_OF_RANGE",
  "UNIMPLEMENTED",
  "INTERNAL",
  "UNAVAILABLE",
  "DATA_LOSS",
  "UNAUTHENTICATED",
] as const;

/** A gRPC status code name, e.g. `"NOT_FOUND"`. */
export type CodeName = (typeof CODE_NAMES)[number];

/**
 * A call that failed: `code` is the gRPC code name (`"ABORTED"` for a stale
 * lease, `"UNAVAILABLE"` for a server that cannot be reached), `serverMessage`
 * the server's own words. Settings the client refuses before sending anything
 * (a malformed URL, a token that would travel in clear) are `"INVALID_ARGUMENT"`
 * with `local` set.
 */
export class JobqError extends Error {
  override readonly name = "JobqError";
  readonly code: CodeName;
  readonly serverMessage: string;
  /** True when the client refused before anything was sent. */
  readonly local: boolean;

  constructor(code: CodeName, serverMessage: string, options?: { cause?: unknown; local?: boolean }) {
    super(`${code}: ${serverMessage}`, options?.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.serverMessage = serverMessage;
    this.local = options?.local ?? false;
  }

  /** The client's own refusal of a setting, before any call. */
  static config(message: string): JobqError {
    return new JobqError("INVALID_ARGUMENT", message, { local: true });
  }

  /** Any error from a call, as a JobqError (the server's message kept as is). */
  static from(err: unknown): JobqError {
    if (err instanceof JobqError) return err;
    const ce = ConnectError.from(err);
    const name = CODE_NAMES[ce.code] ?? "UNKNOWN";
    return new JobqError(name, ce.rawMessage, { cause: err });
  }
}

/**
 * `Client.wait`: the job ended FAILED (its attempts ran out, a handler
 * failed it for good, or it was cancelled: then `job.lastError` reads
 * `cancelled: <reason>`).
 */
export class JobFailedError extends Error {
  override readonly name = "JobFailedError";
  constructor(readonly job: Job) {
    super(`job ${job.id} FAILED: ${job.lastError || "no error given"}`);
  }
}

/** `Client.wait`: the job was not finished when the time ran out. */
export class WaitTimeoutError extends Error {
  override readonly name = "WaitTimeoutError";
  constructor(
    readonly jobId: string,
    readonly afterMs: number,
  ) {
    super(`job ${jobId} was not finished after ${(afterMs / 1000).toFixed(1)} s`);
  }
}

/** Codes that mean "the server did not get to decide" (down, restarting, the connection dropped). */
export function isTransient(err: JobqError): boolean {
  return (
    !err.local &&
    (err.code === "UNAVAILABLE" ||
      err.code === "UNKNOWN" ||
      err.code === "CANCELLED" ||
      err.code === "DEADLINE_EXCEEDED")
  );
}

/** Codes with which a Lease call will never succeed as sent (the Rust worker's `refused_for_good`). */
export function isRefusedForGood(err: JobqError): boolean {
  return (
    err.code === "UNAUTHENTICATED" ||
    err.code === "PERMISSION_DENIED" ||
    err.code === "INVALID_ARGUMENT" ||
    err.code === "UNIMPLEMENTED"
  );
}

/**
 * Thrown by a handler to say how its job failed. Any other thrown value fails
 * the job retryably, after the server's backoff, with its message.
 *
 * ```ts
 * throw HandlerError.retryAfter("smtp said 421", 60_000); // again in a minute
 * throw HandlerError.fatal("no such customer");           // FAILED at once, no retry
 * throw HandlerError.snooze("429: Retry-After 30", 30_000); // not a failure: back in 30 s
 * ```
 */
export class HandlerError extends Error {
  override readonly name = "HandlerError";
  /** No retry: the job becomes FAILED (a dead letter) at once. */
  readonly fatal: boolean;
  /** Retry after exactly this long (ms) instead of the server's backoff. */
  readonly retryDelayMs: number | undefined;
  /**
   * Not a failure: the job is put back, due after this long (ms), without
   * spending an attempt; its history entry reads SNOOZED.
   */
  readonly snoozeMs: number | undefined;

  constructor(
    message: string,
    options: { fatal?: boolean; retryDelayMs?: number; snoozeMs?: number; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.fatal = options.fatal ?? false;
    this.retryDelayMs = options.retryDelayMs;
    this.snoozeMs = options.snoozeMs;
    if (this.fatal && this.retryDelayMs !== undefined) {
      throw new TypeError("a fatal HandlerError has no retry delay");
    }
    if (this.snoozeMs !== undefined && (this.fatal || this.retryDelayMs !== undefined)) {
      throw new TypeError("a snooze is neither fatal nor a retry delay");
    }
    for (const [field, ms] of [["retryDelayMs", this.retryDelayMs], ["snoozeMs", this.snoozeMs]] as const) {
      if (ms !== undefined && !(ms >= 0 && Number.isFinite(ms))) {
        throw new TypeError(`${field} must be a finite number >= 0, not ${ms}`);
      }
    }
  }

  /** Retry after the server's exponential backoff (if attempts are left). */
  static retry(message: string, cause?: unknown): HandlerError {
    return new HandlerError(message, { cause });
  }

  /** Retry after exactly `delayMs` (if attempts are left); 0 means due at once. */
  static retryAfter(message: string, delayMs: number, cause?: unknown): HandlerError {
    return new HandlerError(message, { retryDelayMs: delayMs, cause });
  }

  /**
   * Not now: put the job back, due after `delayMs`, without counting the
   * attempt (an API said "429, Retry-After"). Bounded by the server's
   * --max-delay.
   */
  static snooze(message: string, delayMs: number, cause?: unknown): HandlerError {
    return new HandlerError(message, { snoozeMs: delayMs, cause });
  }

  /** No retry can fix it: the job becomes FAILED at once, whatever its attempts. */
  static fatal(message: string, cause?: unknown): HandlerError {
    return new HandlerError(message, { fatal: true, cause });
  }
}

/**
 * `Name: message` of anything a handler threw, for the job's `last_error`;
 * never throws. A HandlerError gives its bare message.
 */
export function errorText(err: unknown): string {
  try {
    if (err instanceof HandlerError) return err.message;
    if (err instanceof Error) {
      const name = err.name || err.constructor?.name || "Error";
      return err.message ? `${name}: ${err.message}` : name;
    }
    if (typeof err === "string") return err;
    return `thrown: ${String(err)}`;
  } catch {
    return "the handler threw a value whose message could not be read";
  }
}
