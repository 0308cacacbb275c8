"""Optional OpenTelemetry: with opentelemetry-api installed, the producer's
trace context travels in the job's metadata and the handler runs in a span
that continues it. Without it, both are no-ops."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from jobq.models import Job

_otel: Optional[Dict[str, Any]]
try:
    _otel = {
        name: importlib.import_module(f"opentelemetry.{name}")
        for name in ("context", "propagate", "trace")
    }
except ImportError:  # pragma: no cover - tracing is simply off
    _otel = None


def with_trace_context(metadata: Optional[Mapping[str, str]]) -> Dict[str, str]:
    """The metadata plus the current span's trace context (what the caller
    set by hand wins)."""
    out: Dict[str, str] = {}
    if _otel is not None:
        _otel["propagate"].inject(out)
    out.update(metadata or {})
    return out


def call_headers() -> Tuple[Tuple[str, str], ...]:
    """The current span's trace context as gRPC headers (`traceparent`,
    `tracestate`), so the server's span for the call joins the caller's
    trace, as with the Rust client. Empty when untraced or without
    opentelemetry-api."""
    if _otel is None:
        return ()
    carrier: Dict[str, str] = {}
    _otel["propagate"].inject(carrier)
    return tuple((k.lower(), v) for k, v in carrier.items())


@contextlib.contextmanager
def job_span(job: Job) -> Iterator[None]:
    """A span `job` that continues the producer's trace, with the 1-based
    attempt number on it."""
    if _otel is None:
        yield
        return
    parent = _otel["propagate"].extract(dict(job.metadata))
    token = _otel["context"].attach(parent)
    try:
        tracer = _otel["trace"].get_tracer("jobq")
        with tracer.start_as_current_span("job", attributes={
            "job.id": job.id, "job.queue": job.queue, "job.kind": job.kind,
            "job.attempt": job.attempts + 1,
        }):
            yield
    finally:
        _otel["context"].detach(token)
