// Durations (milliseconds here, protobuf Durations on the wire) and
// timestamps.

import { create } from "@bufbuild/protobuf";
import { type Duration, DurationSchema, type Timestamp, timestampDate } from "@bufbuild/protobuf/wkt";

/** A protobuf Duration from milliseconds; undefined stays unset. */
export function duration(ms: number | undefined): Duration | undefined {
  if (ms === undefined) return undefined;
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`a duration must be a finite number of ms >= 0, not ${ms}`);
  const whole = Math.floor(ms / 1000);
  return create(DurationSchema, {
    seconds: BigInt(whole),
    nanos: Math.round((ms - whole * 1000) * 1e6),
  });
}

/** Milliseconds from a protobuf Duration (undefined when unset). */
export function millis(d: Duration | undefined): number | undefined {
  return d === undefined ? undefined : Number(d.seconds) * 1000 + d.nanos / 1e6;
}

/** A Date from a protobuf Timestamp (undefined when unset). */
export function date(t: Timestamp | undefined): Date | undefined {
  return t === undefined ? undefined : timestampDate(t);
}

/** Resolves after `ms`, or at once when `signal` aborts (never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** Jittered exponential backoff, 100 ms doubling to 5 s (the Rust client's). */
export class Backoff {
  private next: number;

  constructor(
    private readonly first = 100,
    private readonly cap = 5000,
  ) {
    this.next = first;
  }

  nextDelay(): number {
    const delay = this.next;
    this.next = Math.min(this.next * 2, this.cap);
    return delay * (0.5 + Math.random() / 2);
  }

  reset(): void {
    this.next = this.first;
  }
}
