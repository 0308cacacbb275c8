// Optional OpenTelemetry. With @opentelemetry/api installed (an optional peer
// dependency, loaded by dynamic import), the producer's W3C trace context
// travels in the job's metadata and every call's headers, and the worker
// runs each handler in a span `job` that continues it. Without it, all of
// this is a no-op.

type Otel = typeof import("@opentelemetry/api");

let loaded: Promise<Otel | undefined> | undefined;

/** The API module, or undefined when it is not installed. */
export function otel(): Promise<Otel | undefined> {
  loaded ??= import("@opentelemetry/api").then(
    (m) => m,
    () => undefined,
  );
  return loaded;
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/**
 * The active span's `traceparent` (and `tracestate`), from the registered
 * propagator, or written here in W3C form when none is registered. Empty
 * when untraced or without the API.
 */
export async function traceContext(): Promise<Record<string, string>> {
  const api = await otel();
  if (api === undefined) return {};
  const carrier: Record<string, string> = {};
  const active = api.context.active();
  api.propagation.inject(active, carrier);
  const sc = api.trace.getSpanContext(active);
  if (carrier["traceparent"] === undefined && sc !== undefined && api.isSpanContextValid(sc)) {
    const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, "0");
    carrier["traceparent"] = `00-${sc.traceId}-${sc.spanId}-${flags}`;
    const state = sc.traceState?.serialize();
    if (state) carrier["tracestate"] = state;
  }
  return carrier;
}

/** Metadata plus the active span's trace context (what the caller set by hand wins). */
export async function withTraceContext(metadata: Record<string, string> | undefined): Promise<Record<string, string>> {
  return { ...(await traceContext()), ...(metadata ?? {}) };
}

export interface JobSpanInfo {
  id: string;
  queue: string;
  kind: string;
  attempt: number;
  metadata: Record<string, string>;
}

/**
 * Runs `fn` in a span `job` that continues the producer's trace (from the
 * job's metadata), with `job.id`, `job.queue`, `job.kind`, `job.attempt`.
 * The span records a thrown error and is ended either way.
 */
export async function inJobSpan<T>(job: JobSpanInfo, fn: () => Promise<T>): Promise<T> {
  const api = await otel();
  if (api === undefined) return fn();
  let parent = api.propagation.extract(api.ROOT_CONTEXT, job.metadata);
  if (api.trace.getSpanContext(parent) === undefined) {
    const m = TRACEPARENT.exec(job.metadata["traceparent"] ?? "");
    if (m !== null && m[1] !== undefined && m[2] !== undefined && m[3] !== undefined) {
      parent = api.trace.setSpanContext(api.ROOT_CONTEXT, {
        traceId: m[1],
        spanId: m[2],
        traceFlags: parseInt(m[3], 16),
        isRemote: true,
      });
    }
  }
  const tracer = api.trace.getTracer("jobq");
  const attributes = {
    "job.id": job.id,
    "job.queue": job.queue,
    "job.kind": job.kind,
    "job.attempt": job.attempt,
  };
  return tracer.startActiveSpan("job", { attributes }, parent, async (span) => {
    try {
      return await fn();
    } catch (err) {
      span.recordException(err instanceof Error ? err : String(err));
      span.setStatus({ code: api.SpanStatusCode.ERROR });
      throw err;
    } finally {
      span.end();
    }
  });
}
