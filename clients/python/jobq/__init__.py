"""A small Python client for jobq, over stubs generated from the proto.

    from jobq import Client, Worker

    with Client("127.0.0.1:50051") as client:          # the producer side
        job, created = client.enqueue("email", "send-email", b'{"order": 4711}',
                                      key="order-4711")

    def send_email(job):                               # the worker side
        ...                      # raise to fail the attempt; return to ack it

    Worker(Client("127.0.0.1:50051"), ["email"], {"send-email": send_email},
           capacity=5).run()

The generated stubs live in `jobq.v1` (run clients/python/generate.sh first).
Delivery is at least once: a handler may see the same job twice (a worker that
died before it acked), so make it idempotent on the job's domain key.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterator, Mapping, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import duration_pb2

try:  # Optional: trace context follows jobs when opentelemetry-api is installed.
    from opentelemetry import context as _otel_context
    from opentelemetry import propagate as _otel_propagate
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - tracing is simply off
    _otel_propagate = None

try:
    from jobq.v1 import jobq_pb2 as pb
    from jobq.v1 import jobq_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - a setup error, said plainly
    raise ImportError(
        "jobq's generated stubs are missing: run clients/python/generate.sh"
    ) from e

__all__ = ["Client", "Worker", "Fatal", "JobLost", "pb", "pb_grpc", "STATUS_NAMES"]

log = logging.getLogger("jobq")

Seconds = Union[int, float, timedelta]

#: JobStatus number -> short name ("PENDING", "RUNNING", "DONE", "FAILED").
# Most leases in one Heartbeat call: the server refuses more (the same limit
# as the Rust client's jobq::MAX_HEARTBEAT_LEASES); heartbeat() splits.
MAX_HEARTBEAT_LEASES = 1000

# The largest reply decoded (64 MiB, above the server's default
# --max-message-bytes of 16 MiB): a page of big jobs, or one job with a long
# history, is over gRPC's 4 MiB default.
MAX_RECEIVE_BYTES = 64 * 1024 * 1024

STATUS_NAMES = {
    v.number: v.name.replace("JOB_STATUS_", "")
    for v in pb.JobStatus.DESCRIPTOR.values
}


def _duration(value: Optional[Seconds]) -> Optional[duration_pb2.Duration]:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(value * 1e9)))
    return d


class Fatal(Exception):
    """Raise from a handler to fail the job without retrying it (it becomes FAILED)."""


class JobLost(Exception):
    """Ack or Fail was refused because this worker no longer holds the lease."""


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details, metadata):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token.strip()}")

    def _details(self, details):
        return _CallDetails(details, list(details.metadata or ()) + [self._header])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class Client:
    """Every JobQueue RPC, with Python arguments. Thread-safe (one channel).

    `token` is sent as `authorization: Bearer <token>` (a server with
    `--auth-tokens`). TLS: a target of `https://host:port`, or `tls=True`, or
    any of `root_certificates` (the CA's PEM, default: the system's roots),
    `certificate_chain` and `private_key` (the client's PEM, for mTLS).
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        channel: Optional[grpc.Channel] = None,
        timeout: float = 30.0,
        *,
        token: Optional[str] = None,
        tls: bool = False,
        root_certificates: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
    ):
        if target.startswith("https://"):
            target, tls = target[len("https://"):], True
        elif target.startswith("http://"):
            target = target[len("http://"):]
        tls = tls or bool(root_certificates or certificate_chain or private_key)
        self.target = target
        self.timeout = timeout
        # Keepalive pings let both sides find a silent peer (the server
        # reclaims a dead worker's jobs when its stream drops).
        options = [
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        ]
        if channel is None:
            if tls:
                creds = grpc.ssl_channel_credentials(
                    root_certificates=root_certificates,
                    private_key=private_key,
                    certificate_chain=certificate_chain,
                )
                channel = grpc.secure_channel(target, creds, options=options)
            else:
                channel = grpc.insecure_channel(target, options=options)
        self._raw_channel = channel
        self.channel = grpc.intercept_channel(channel, _Bearer(token)) if token else channel
        self.stub = pb_grpc.JobQueueStub(self.channel)

    # -- lifecycle ---------------------------------------------------------
    def close(self) -> None:
        self._raw_channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel is connected (raises grpc.FutureTimeoutError)."""
        grpc.channel_ready_future(self._raw_channel).result(timeout=timeout)

    # -- producer ----------------------------------------------------------
    def enqueue(
        self,
        queue: str,
        kind: str,
        payload: bytes = b"",
        *,
        key: str = "",
        max_attempts: int = 0,
        delay: Optional[Seconds] = None,
        metadata: Optional[Mapping[str, str]] = None,
    ) -> Tuple[pb.Job, bool]:
        """Adds a job; returns (job, created). With a known key, returns the
        existing job and created=False, so retrying an enqueue is safe.

        `metadata` is stored with the job (request ids, tenant tags). With
        opentelemetry-api installed, the current span's W3C `traceparent`
        and `tracestate` are added, so the worker continues the trace."""
        req = pb.EnqueueRequest(
            queue=queue, kind=kind, payload=payload, key=key,
            max_attempts=max_attempts, delay=_duration(delay),
            metadata=_with_trace_context(metadata),
        )
        resp = self.stub.Enqueue(req, timeout=self.timeout)
        return resp.job, resp.created

    def enqueue_batch(self, requests: Sequence[pb.EnqueueRequest]) -> list:
        """Adds many jobs with one flush; one EnqueueResult per request."""
        resp = self.stub.EnqueueBatch(
            pb.EnqueueBatchRequest(jobs=list(requests)), timeout=self.timeout
        )
        return list(resp.results)

    # -- worker (one job at a time; Worker below is the usual way) ---------
    def dequeue(
        self,
        queues: Sequence[str],
        worker_id: str,
        *,
        lease: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
    ) -> Optional[pb.LeasedJob]:
        """Leases the next due job, or returns None when nothing is due."""
        req = pb.DequeueRequest(
            queues=list(queues), worker_id=worker_id,
            lease_duration=_duration(lease), wait=_duration(wait),
        )
        timeout = self.timeout + (_seconds(wait) if wait is not None else 0)
        resp = self.stub.Dequeue(req, timeout=timeout)
        return resp.leased if resp.HasField("leased") else None

    def ack(self, job_id: str, lease_id: str) -> pb.Job:
        return self._lease_call(
            self.stub.Ack, pb.AckRequest(job_id=job_id, lease_id=lease_id)
        ).job

    def fail(
        self,
        job_id: str,
        lease_id: str,
        error: str,
        *,
        retry_delay: Optional[Seconds] = None,
        fatal: bool = False,
    ) -> pb.Job:
        req = pb.FailRequest(
            job_id=job_id, lease_id=lease_id, error=error,
            retry_delay=_duration(retry_delay), fatal=fatal,
        )
        return self._lease_call(self.stub.Fail, req).job

    def heartbeat(
        self,
        worker_id: str,
        leases: Sequence[Tuple[str, str]],
        *,
        extend_by: Optional[Seconds] = None,
        draining: bool = False,
        stream_token: str = "",
    ) -> list:
        """Extends leases [(job_id, lease_id)]; returns the ones lost, same shape.

        ``stream_token`` is the ``jobq-stream-token`` header of the sender's
        Lease stream: ``draining`` applies to that stream alone. One call per
        MAX_HEARTBEAT_LEASES leases (the server's per-call limit).
        """
        leases = list(leases)
        chunks = [leases[i:i + MAX_HEARTBEAT_LEASES]
                  for i in range(0, len(leases), MAX_HEARTBEAT_LEASES)] or [[]]
        lost = []
        for chunk in chunks:
            req = pb.HeartbeatRequest(
                worker_id=worker_id,
                leases=[pb.LeaseRef(job_id=j, lease_id=l) for j, l in chunk],
                extend_by=_duration(extend_by), draining=draining,
                stream_token=stream_token,
            )
            resp = self.stub.Heartbeat(req, timeout=self.timeout)
            lost.extend((r.job_id, r.lease_id) for r in resp.lost)
        return lost

    # -- operator ----------------------------------------------------------
    def retry(self, job_id: str) -> pb.Job:
        return self.stub.Retry(pb.RetryRequest(job_id=job_id), timeout=self.timeout).job

    def cancel_job(self, job_id: str, reason: str = "") -> pb.Job:
        """PENDING or RUNNING -> FAILED with last_error "cancelled: <reason>";
        a running job's worker is sent `revoked`. FAILED_PRECONDITION for a
        DONE or FAILED job. Needs the admin role."""
        req = pb.CancelJobRequest(id=job_id, reason=reason)
        return self.stub.CancelJob(req, timeout=self.timeout).job

    def pause_queue(self, queue: str) -> None:
        """Nothing is taken from ``queue`` until resume_queue (enqueues are
        accepted, running jobs finish). Persisted. Needs the admin role."""
        self.stub.PauseQueue(pb.PauseQueueRequest(queue=queue), timeout=self.timeout)

    def resume_queue(self, queue: str) -> None:
        """Undoes pause_queue. Needs the admin role."""
        self.stub.ResumeQueue(pb.ResumeQueueRequest(queue=queue), timeout=self.timeout)

    def paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused (QueueStats.paused)."""
        resp = self.stub.Stats(pb.StatsRequest(queue=queue), timeout=self.timeout)
        return any(q.paused for q in resp.queues if q.queue == queue)

    def delete_job(self, job_id: str) -> None:
        """Deletes a PENDING, DONE or FAILED job for good (its key is free
        again); FAILED_PRECONDITION for a RUNNING one. Needs the admin role."""
        self.stub.DeleteJob(pb.DeleteJobRequest(id=job_id), timeout=self.timeout)

    def purge_jobs(self, queue: str, status: Union[int, str] = 0,
                   finished_before: Optional[float] = None) -> int:
        """Deletes ``queue``'s DONE and/or FAILED jobs (status 0 = both) that
        finished before ``finished_before`` (a Unix time; None = now);
        returns how many. Never PENDING or RUNNING jobs."""
        if isinstance(status, str):
            name = status if status.startswith("JOB_STATUS_") else "JOB_STATUS_" + status
            status = pb.JobStatus.Value(name)
        req = pb.PurgeJobsRequest(queue=queue, status=status)
        if finished_before is not None:
            req.finished_before.FromNanoseconds(int(finished_before * 1e9))
        return self.stub.PurgeJobs(req, timeout=self.timeout).deleted

    def get_job(self, job_id: str) -> pb.Job:
        return self.stub.GetJob(pb.GetJobRequest(id=job_id), timeout=self.timeout)

    def list_jobs(
        self, queue: str = "", status: Union[int, str] = 0, key: str = "",
        page_size: int = 0, omit_payload: bool = False,
    ) -> Iterator[pb.Job]:
        """Every matching job, following next_page_token. status: a JobStatus
        number or a name ("DONE" or "JOB_STATUS_DONE"). ``omit_payload``
        leaves payloads out (for listings that do not show them)."""
        if isinstance(status, str):
            name = status if status.startswith("JOB_STATUS_") else "JOB_STATUS_" + status
            status = pb.JobStatus.Value(name)
        token = ""
        while True:
            resp = self.stub.ListJobs(
                pb.ListJobsRequest(queue=queue, status=status, key=key,
                                   page_size=page_size, page_token=token,
                                   omit_payload=omit_payload),
                timeout=self.timeout,
            )
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def stats(self, queue: str = "") -> dict:
        """{queue: {"pending": n, "running": n, "done": n, "failed": n}}."""
        resp = self.stub.Stats(pb.StatsRequest(queue=queue), timeout=self.timeout)
        return {
            q.queue: {"pending": q.pending, "running": q.running,
                      "done": q.done, "failed": q.failed}
            for q in resp.queues
        }

    def _lease_call(self, method, req):
        try:
            return method(req, timeout=self.timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.ABORTED:
                raise JobLost(e.details()) from e
            raise


def _seconds(value: Seconds) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


Handler = Callable[[pb.Job], None]


@dataclass
class _InFlight:
    job: pb.Job
    lease_id: str
    lost: bool = False


class Worker:
    """Runs handlers for jobs pushed on a Lease stream.

    - holds one Lease stream with `capacity`; runs up to `capacity` handlers
      at once in threads;
    - a handler that returns acks the job; one that raises fails it (the
      server retries it after its backoff), `Fatal` fails it for good;
    - heartbeats every in-flight lease each lease/3 and forgets jobs the
      server says are lost (or revoked on the stream): their result is not
      acked, since someone else may hold them now;
    - reconnects with backoff when the stream drops;
    - `stop()` (e.g. from a signal handler) drains: no new jobs, in-flight
      ones finish and are acked, then the stream closes.

    `handlers` is one callable for every kind, or {kind: callable}.
    """

    def __init__(
        self,
        client: Client,
        queues: Sequence[str],
        handlers: Union[Handler, Mapping[str, Handler]],
        *,
        worker_id: Optional[str] = None,
        capacity: int = 1,
        lease: Seconds = 30.0,
        heartbeat_every: Optional[Seconds] = None,
    ):
        self.client = client
        self.queues = list(queues)
        self.handlers = handlers
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.capacity = max(1, capacity)
        self.lease = _seconds(lease)
        self.heartbeat_every = (
            _seconds(heartbeat_every) if heartbeat_every is not None else self.lease / 3
        )
        self._lock = threading.Lock()
        self._inflight: dict = {}  # job_id -> _InFlight
        self._stopping = threading.Event()
        self._stopped = threading.Event()  # run() has returned: heartbeats end
        self._call = None
        self._stream_token = ""
        self._pool = ThreadPoolExecutor(max_workers=self.capacity,
                                        thread_name_prefix="jobq-handler")

    # -- public ------------------------------------------------------------
    def run(self) -> None:
        """Blocks until stop(); returns after draining in-flight jobs."""
        hb = threading.Thread(target=self._heartbeat_loop, name="jobq-heartbeat",
                              daemon=True)
        hb.start()
        backoff = 0.1
        try:
            while not self._stopping.is_set():
                try:
                    self._stream_once()
                    backoff = 0.1
                except grpc.RpcError as e:
                    if self._stopping.is_set():
                        break
                    log.warning("lease stream ended: %s %s", e.code(), e.details())
                if self._stopping.is_set():
                    break
                # Jobs still running keep their leases in our books: if the
                # server reclaimed them (stream dropped) their ack is refused
                # as stale (JobLost); if it only restarted, the ack succeeds.
                time.sleep(backoff * (0.5 + random.random() / 2))
                backoff = min(backoff * 2, 5.0)
        finally:
            self._pool.shutdown(wait=True)
            self._close_stream()
            self._stopped.set()

    def stop(self, drain_timeout: float = 30.0) -> None:
        """Asks run() to finish: no new jobs, in-flight ones complete. Returns at once."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        threading.Thread(target=self._drain, args=(drain_timeout,),
                         name="jobq-drain", daemon=True).start()

    # -- internals ---------------------------------------------------------
    def _stream_once(self) -> None:
        # Leases still in flight from an earlier stream count against the
        # capacity of this one.
        with self._lock:
            held = [pb.LeaseRef(job_id=j, lease_id=f.lease_id)
                    for j, f in self._inflight.items() if not f.lost]
        req = pb.LeaseRequest(
            queues=self.queues, worker_id=self.worker_id,
            capacity=self.capacity, lease_duration=_duration(self.lease),
            held=held,
        )
        self._call = self.client.stub.Lease(req)
        metadata = dict(self._call.initial_metadata() or ())
        self._stream_token = str(metadata.get("jobq-stream-token", ""))
        for event in self._call:
            which = event.WhichOneof("event")
            if which == "leased":
                leased = event.leased
                f = _InFlight(job=leased.job, lease_id=leased.lease_id)
                with self._lock:
                    self._inflight[leased.job.id] = f
                self._pool.submit(self._run_one, f)
            elif which == "revoked":
                self._mark_lost(event.revoked.job_id, event.revoked.lease_id,
                                event.revoked.reason)

    def _handler_for(self, kind: str) -> Optional[Handler]:
        if callable(self.handlers):
            return self.handlers
        return self.handlers.get(kind)

    def _run_one(self, f: _InFlight) -> None:
        job = f.job
        handler = self._handler_for(job.kind)
        try:
            if handler is None:
                raise Fatal(f"no handler for kind {job.kind!r}")
            with _job_span(job):
                handler(job)
        except Exception as e:  # noqa: BLE001 - every handler error fails the job
            self._finish(f, error=e)
        else:
            self._finish(f, error=None)

    def _finish(self, f: _InFlight, error: Optional[BaseException]) -> None:
        with self._lock:
            self._inflight.pop(f.job.id, None)
            lost = f.lost
        if lost:
            log.info("job %s: lease lost, result dropped", f.job.id)
            return
        try:
            if error is None:
                self.client.ack(f.job.id, f.lease_id)
            else:
                msg = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                self.client.fail(f.job.id, f.lease_id, msg, fatal=isinstance(error, Fatal))
        except JobLost as e:
            log.info("job %s: lease lost before %s: %s", f.job.id,
                     "ack" if error is None else "fail", e)
        except grpc.RpcError as e:
            # The server will reclaim the job when the lease ends or the
            # stream drops; nothing else to do here.
            log.warning("job %s: could not report result: %s %s", f.job.id,
                        e.code(), e.details())

    def _mark_lost(self, job_id: str, lease_id: str, reason: str) -> None:
        with self._lock:
            f = self._inflight.get(job_id)
            if f is not None and f.lease_id == lease_id:
                f.lost = True
        log.info("job %s: lease %s lost (%s)", job_id, lease_id, reason)

    def _heartbeat_loop(self) -> None:
        # Goes on while draining, so long jobs keep their leases until acked.
        while not self._stopped.wait(self.heartbeat_every):
            self._heartbeat(draining=self._stopping.is_set())

    def _heartbeat(self, draining: bool) -> None:
        with self._lock:
            leases = [(j, f.lease_id) for j, f in self._inflight.items() if not f.lost]
        # Sent even with no leases while a stream is open: after a lease
        # expired unheartbeated (a frozen process), the server pushes that
        # stream nothing until its worker heartbeats again.
        if not leases and not draining and not self._stream_token:
            return
        try:
            lost = self.client.heartbeat(self.worker_id, leases, draining=draining,
                                         stream_token=self._stream_token)
        except grpc.RpcError as e:
            log.warning("heartbeat failed: %s %s", e.code(), e.details())
            return
        for job_id, lease_id in lost:
            self._mark_lost(job_id, lease_id, "reported lost by heartbeat")

    def _drain(self, timeout: float) -> None:
        # Tell the server to stop pushing, let in-flight jobs finish and ack,
        # then close the stream (which then reclaims nothing).
        self._heartbeat(draining=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._inflight:
                    break
            time.sleep(0.05)
        self._close_stream()

    def _close_stream(self) -> None:
        call = self._call
        if call is not None:
            call.cancel()


def _with_trace_context(metadata: Optional[Mapping[str, str]]) -> dict:
    """The metadata plus the current span's trace context (what the caller
    set by hand wins)."""
    out: dict = {}
    if _otel_propagate is not None:
        _otel_propagate.inject(out)
    out.update(metadata or {})
    return out


class _job_span:
    """Runs a handler in a span that continues the producer's trace (when
    opentelemetry-api is installed), with the attempt number on it."""

    def __init__(self, job: pb.Job):
        self.job = job
        self._cm = None
        self._token = None

    def __enter__(self):
        if _otel_propagate is None:
            return None
        parent = _otel_propagate.extract(dict(self.job.metadata))
        self._token = _otel_context.attach(parent)
        tracer = _otel_trace.get_tracer("jobq")
        self._cm = tracer.start_as_current_span(
            "job",
            attributes={
                "job.id": self.job.id,
                "job.queue": self.job.queue,
                "job.kind": self.job.kind,
                "job.attempt": self.job.attempts + 1,
            },
        )
        return self._cm.__enter__()

    def __exit__(self, *exc):
        if self._cm is not None:
            self._cm.__exit__(*exc)
        if self._token is not None:
            _otel_context.detach(self._token)
        return False
