"""Client: every JobQueue RPC over a blocking gRPC channel."""

from __future__ import annotations

import time
from datetime import datetime
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union)

import grpc

from jobq import _common as c
from jobq import _trace
from jobq._common import Seconds, StatusLike
from jobq.errors import (DeadlineExceeded, JobFailed, JobLost, JobqError, WaitTimeout,
                         from_rpc_error)
from jobq.models import (EnqueueOutcome, EnqueueResult, Enqueued, Job, LeasedJob, NewJob,
                         QueuePolicy, QueueStats,
                         RateLimit, Status,
                         Schedule)
from jobq.v1 import jobq_pb2 as pb
from jobq.v1 import jobq_pb2_grpc as pb_grpc

R = TypeVar("R")


class Client:
    """Every JobQueue RPC, with Python arguments. Thread-safe (one channel).

    ``server`` is a URL as the CLI takes it: ``http://host:port`` or
    ``https://host:port`` (TLS); a bare ``host:port`` is plaintext. None
    reads ``$JOBQ_SERVER`` (default ``http://127.0.0.1:50051``).

    ``token`` is sent as ``authorization: Bearer <token>`` (None reads
    ``$JOBQ_TOKEN``). TLS: an ``https://`` URL, or ``tls=True``, or any of
    ``root_certificates`` (the CA's PEM; default ``$JOBQ_CA_CERT``, else the
    system's roots), ``certificate_chain`` and ``private_key`` (the
    client's PEM, for mTLS). ``channel`` uses a ready-made blocking channel
    instead (an asyncio one is refused: use ``jobq.aio.AsyncClient``).

    Without TLS, a token is sent only to this machine (``localhost``,
    127.0.0.0/8, ``::1``): to any other host it is a ``ValueError`` before
    anything is sent, unless ``insecure=True`` (anyone on the path could
    read the token). A ready-made ``channel`` is the caller's to secure.

    ``timeout`` (seconds) bounds each call. ``wait_for_ready=True`` makes a
    call wait (within its timeout) for a server that is down or not yet
    up, instead of failing at once with ``Unavailable``.

    Every refused call raises a ``jobq.JobqError`` subclass named for its
    status (``NotFound``, ``Unavailable``, ``InvalidArgument``, …).
    """

    def __init__(
        self,
        server: Optional[str] = None,
        channel: Optional[grpc.Channel] = None,
        timeout: float = 30.0,
        *,
        token: Optional[str] = None,
        tls: bool = False,
        root_certificates: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        insecure: bool = False,
        wait_for_ready: bool = False,
    ) -> None:
        if isinstance(channel, grpc.aio.Channel):
            raise TypeError("Client needs a blocking grpc.Channel; for a grpc.aio "
                            "channel use jobq.aio.AsyncClient")
        if channel is not None and not isinstance(channel, grpc.Channel):
            raise TypeError(f"channel must be a grpc.Channel, got {type(channel).__name__}")
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready
        self._auth = c.auth_metadata(token)
        if channel is None:
            target, url_tls = c.parse_server(server)
            self.target = target
            creds = c.credentials(tls or url_tls, root_certificates, certificate_chain,
                                  private_key)
            if creds is None:
                c.check_plaintext_token(target, self._auth, insecure)
            options = c.channel_options()
            channel = (grpc.secure_channel(target, creds, options=options) if creds
                       else grpc.insecure_channel(target, options=options))
        else:
            self.target = server or ""
        self.channel: grpc.Channel = channel
        self.stub = pb_grpc.JobQueueStub(channel)

    @property
    def _md(self) -> c.Metadata:
        """Each call's headers: the token, and the current span's trace
        context (the server's span for the call joins the caller's trace)."""
        return self._auth + _trace.call_headers()

    def _unary(self, rpc: Callable[..., R], request: Any,
               timeout: Optional[float] = None) -> R:
        """One call, with the token, trace headers and timeout; a gRPC error
        becomes its JobqError."""
        try:
            return rpc(request, timeout=timeout or self.timeout, metadata=self._md,
                       wait_for_ready=self.wait_for_ready)
        except JobqError:
            raise
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    # -- lifecycle ---------------------------------------------------------
    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel is connected (raises grpc.FutureTimeoutError)."""
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    # -- producer ----------------------------------------------------------
    def enqueue(
        self,
        queue: str,
        kind: str,
        payload: Union[bytes, str] = b"",
        *,
        key: Optional[str] = None,
        max_attempts: int = 0,
        delay: Optional[Seconds] = None,
        run_at: Optional[datetime] = None,
        metadata: Optional[Mapping[str, str]] = None,
        priority: int = 0,
        group: Optional[str] = None,
        max_snoozes: Optional[int] = None,
        key_scope: Optional[str] = None,
        on_conflict: Optional[str] = None,
        unique_for: Optional[Seconds] = None,
    ) -> Enqueued:
        """Adds a job once it is durable; returns ``(job, created)`` (an
        ``Enqueued``: ``job, created = client.enqueue(…)``).

        - ``payload``: bytes for the handler (a str is UTF-8 encoded); ids,
          not whole records.
        - ``key``: the domain key, e.g. ``"order-4711"``. A second enqueue
          with a key the queue still holds returns that job and
          ``created=False``, so retrying an enqueue is safe.
        - ``delay`` (seconds or ``timedelta``) or ``run_at`` (an aware
          ``datetime``): not to run before then. Default: now.
        - ``max_attempts``: runs allowed before the job is FAILED; 0 means
          the server's default (3).
        - ``metadata``: strings stored with the job (request ids, tenant
          tags). With opentelemetry-api installed, the current span's
          ``traceparent``/``tracestate`` are added, so the worker continues
          the trace.
        - ``priority``: -100..=100, higher first among due jobs (default 0).
        - ``group``: a tenant or customer id; a queue policy's
          ``group_max_running`` limits how many of one group run at once.
        - ``max_snoozes``: snoozes (``raise Snooze(…)``) allowed before a
          snooze counts as a failed attempt; None means 100, 0 none.
        - ``key_scope``, ``on_conflict``, ``unique_for`` (with a ``key``):
          ``key_scope="active"`` holds the key only while a job with it is
          PENDING or RUNNING; ``on_conflict="replace"`` gives a PENDING
          job with the key this payload, metadata and delay (debounce), and
          makes a RUNNING one a successor that takes the key over;
          ``unique_for`` (seconds or ``timedelta``) holds the key that long
          after its job's enqueue (throttle). ``outcome`` on the result
          says CREATED, EXISTING or REPLACED.

        Raises ``InvalidArgument`` for a bad name, payload or priority."""
        req = c.enqueue_request(queue, kind, payload, key, max_attempts, delay, metadata,
                                priority, run_at, group, max_snoozes, key_scope, on_conflict,
                                unique_for)
        resp = self._unary(self.stub.Enqueue, req)
        return Enqueued(Job.from_pb(resp.job), resp.created,
                        EnqueueOutcome.of(resp.outcome, resp.created))

    def enqueue_batch(
        self, jobs: Sequence[Union[NewJob, pb.EnqueueRequest]],
    ) -> List[EnqueueResult]:
        """Adds many jobs, durable together with one flush; one
        ``EnqueueResult`` per job, in order (a rejected entry has ``error``
        set and does not stop the others). Each ``NewJob`` takes
        ``enqueue``'s keywords."""
        resp = self._unary(self.stub.EnqueueBatch, c.batch_request(jobs))
        return [EnqueueResult.from_pb(r) for r in resp.results]

    # -- worker (one job at a time; Worker is the usual way) ---------------
    def dequeue(
        self,
        queues: Sequence[str],
        worker_id: str,
        *,
        lease: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
    ) -> Optional[LeasedJob]:
        """Leases the next due job, or returns None when nothing is due
        (``wait``: long-poll that long for one)."""
        req = pb.DequeueRequest(
            queues=c.check_queues(queues), worker_id=worker_id,
            lease_duration=c.duration(lease), wait=c.duration(wait),
        )
        timeout = self.timeout + (c.seconds(wait) if wait is not None else 0)
        resp = self._unary(self.stub.Dequeue, req, timeout)
        return LeasedJob.from_pb(resp.leased) if resp.HasField("leased") else None

    def ack(self, job_id: str, lease_id: str, *, result: bytes = b"",
            timeout: Optional[float] = None) -> Job:
        """RUNNING -> DONE, storing ``result`` with the job (``get_job``
        reads it back; at most the server's --max-result-bytes). Raises
        JobLost when the lease is no longer ours."""
        try:
            return Job.from_pb(self._unary(
                self.stub.Ack, pb.AckRequest(job_id=job_id, lease_id=lease_id, result=result),
                timeout).job)
        except JobqError as e:
            _raise_if_lost(e)
            raise

    def fail(
        self,
        job_id: str,
        lease_id: str,
        error: str,
        *,
        retry_delay: Optional[Seconds] = None,
        fatal: bool = False,
        snooze: Optional[Seconds] = None,
        timeout: Optional[float] = None,
    ) -> Job:
        """Ends the attempt badly: retried after ``retry_delay`` (default:
        the server's backoff) unless ``fatal`` or out of attempts. With
        ``snooze``, not a failure: the job is due again after it and the
        attempt is not counted. Raises JobLost when the lease is no longer
        ours."""
        req = c.fail_request(job_id, lease_id, error, retry_delay, fatal, snooze)
        try:
            return Job.from_pb(self._unary(self.stub.Fail, req, timeout).job)
        except JobqError as e:
            _raise_if_lost(e)
            raise

    def heartbeat(
        self,
        worker_id: str,
        leases: Sequence[Tuple[str, str]],
        *,
        extend_by: Optional[Seconds] = None,
        draining: bool = False,
        stream_token: str = "",
        timeout: Optional[float] = None,
        progress: Optional[Mapping[str, Tuple[int, str]]] = None,
    ) -> List[Tuple[str, str]]:
        """Extends leases [(job_id, lease_id)]; returns the ones lost, same shape.

        ``stream_token`` is the ``jobq-stream-token`` header of the sender's
        Lease stream: ``draining`` applies to that stream alone. ``progress``
        maps a job id to its (percent, message) report. One call per
        MAX_HEARTBEAT_LEASES leases (the server's per-call limit)."""
        lost: List[Tuple[str, str]] = []
        for req in c.heartbeat_requests(worker_id, leases, extend_by, draining, stream_token,
                                        progress):
            resp = self._unary(self.stub.Heartbeat, req, timeout)
            lost.extend((r.job_id, r.lease_id) for r in resp.lost)
        return lost

    def lease(self, request: pb.LeaseRequest) -> grpc._CallIterator[pb.LeaseEvent]:
        """Opens a Lease stream (the Worker's; no timeout; raw gRPC errors)."""
        return self.stub.Lease(request, metadata=self._md)

    # -- operator ----------------------------------------------------------
    def retry(self, job_id: str) -> Job:
        """Brings a FAILED job back to PENDING with its attempts reset."""
        return Job.from_pb(self._unary(self.stub.Retry, pb.RetryRequest(job_id=job_id)).job)

    def cancel_job(self, job_id: str, reason: str = "") -> Job:
        """PENDING or RUNNING -> FAILED with last_error "cancelled: <reason>";
        a running job's worker is sent `revoked`: its handler's
        ``ctx.cancelled`` is set and ``ctx.cancel_reason`` reads
        "cancelled: <reason>". ``FailedPrecondition`` for a DONE or FAILED
        job. The reason is never refused: a NUL is kept as U+FFFD and the
        kept text is cut to the server's --max-error-bytes. Needs the admin
        role."""
        req = pb.CancelJobRequest(id=job_id, reason=reason)
        return Job.from_pb(self._unary(self.stub.CancelJob, req).job)

    def pause_queue(self, queue: str) -> None:
        """Nothing is taken from ``queue`` until resume_queue (enqueues are
        accepted, running jobs finish). Persisted. ``ResourceExhausted`` when
        the server's --max-paused-queues queues are paused and ``queue`` is
        not one of them. Needs the admin role."""
        self._unary(self.stub.PauseQueue, pb.PauseQueueRequest(queue=queue))

    def resume_queue(self, queue: str) -> None:
        """Undoes pause_queue. Needs the admin role."""
        self._unary(self.stub.ResumeQueue, pb.ResumeQueueRequest(queue=queue))

    def paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused (QueueStats.paused)."""
        resp = self._unary(self.stub.Stats, pb.StatsRequest(queue=queue))
        return any(q.paused for q in resp.queues if q.queue == queue)

    def set_queue_policy(self, queue: str, *, max_running: int = 0,
                         group_max_running: int = 0,
                         rate: Optional[RateLimit] = None,
                         group_rate: Optional[RateLimit] = None) -> None:
        """Limits how many of ``queue``'s jobs run at once, over every server
        (``max_running``) and per group (``group_max_running``; 1 runs each
        group's jobs one at a time, in enqueue order), and how many are taken
        per period (``rate=RateLimit(100, timedelta(seconds=1))``, over every
        server; ``group_rate`` per group); 0 is no limit, and none at all
        clears the policy. A held job stays PENDING and keeps its
        place. Persisted. ``InvalidArgument`` over 100000,
        ``ResourceExhausted`` past the server's --max-queue-policies.
        Needs the admin role."""
        self._unary(self.stub.SetQueuePolicy,
                    c.policy_request(queue, max_running, group_max_running, rate,
                                     group_rate))

    def queue_policy(self, queue: str) -> QueuePolicy:
        """The policy of ``queue`` (falsy when it has none)."""
        resp = self._unary(self.stub.GetQueuePolicy, pb.GetQueuePolicyRequest(queue=queue))
        return QueuePolicy.from_pb(resp.policy)

    def delete_job(self, job_id: str) -> None:
        """Deletes a PENDING, DONE or FAILED job for good (its key is free
        again); ``FailedPrecondition`` for a RUNNING one. Needs the admin role."""
        self._unary(self.stub.DeleteJob, pb.DeleteJobRequest(id=job_id))

    def purge_jobs(self, queue: str, status: StatusLike = 0,
                   finished_before: Union[float, datetime, None] = None) -> int:
        """Deletes ``queue``'s DONE and/or FAILED jobs (status 0 = both) that
        finished before ``finished_before`` (an aware datetime or a Unix
        time; None = now), or with status PENDING (and no
        ``finished_before``) its PENDING jobs when the purge begins; returns
        how many. Never RUNNING jobs (``InvalidArgument``). Purged jobs free
        their keys."""
        req = c.purge_request(queue, status, finished_before)
        return self._unary(self.stub.PurgeJobs, req).deleted

    def create_schedule(self, name: str, queue: str, kind: str, cron: str,
                        payload: Union[bytes, str] = b"", timezone: str = "",
                        max_attempts: int = 0) -> Schedule:
        """Creates (or replaces) schedule ``name``: every tick of ``cron`` (5
        fields, or 6 with leading seconds), read in ``timezone`` (IANA; ""
        = UTC), enqueues one job keyed ``schedule:<name>:<tick time>``.
        Returns it with ``next_run_at``. Needs the admin role."""
        req = c.schedule_request(name, queue, kind, payload, cron, timezone, max_attempts)
        return Schedule.from_pb(self._unary(self.stub.CreateSchedule, req).schedule)

    def delete_schedule(self, name: str) -> None:
        """Deletes schedule ``name`` (its jobs stay); ``NotFound`` if unknown."""
        self._unary(self.stub.DeleteSchedule, pb.DeleteScheduleRequest(name=name))

    def list_schedules(self) -> List[Schedule]:
        """Every schedule the caller may read, by name, with next run times."""
        resp = self._unary(self.stub.ListSchedules, pb.ListSchedulesRequest())
        return [Schedule.from_pb(s) for s in resp.schedules]

    def get_job(self, job_id: str) -> Job:
        """One job with its payload and attempt history; ``NotFound`` if unknown."""
        return Job.from_pb(self._unary(self.stub.GetJob, pb.GetJobRequest(id=job_id)))

    def watch_job(self, *job_ids: str, timeout: Optional[float] = None) -> Iterator[Job]:
        """The jobs' states as they change (the WatchJob stream): each one's
        current state, then each change, without payloads, until every one
        is DONE or FAILED. ``timeout`` bounds the whole stream (None: no
        bound). Raises ``NotFound`` for an unknown or deleted job."""
        try:
            for j in self.stub.WatchJob(pb.WatchJobRequest(ids=list(job_ids)), timeout=timeout,
                                        metadata=self._md, wait_for_ready=self.wait_for_ready):
                yield Job.from_pb(j)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def wait(self, job_id: str, timeout: float) -> Job:
        """Waits until the job is DONE and returns it, with its ``result``.
        Raises ``JobFailed`` (with the job) when it ends FAILED, a cancel
        included, and ``WaitTimeout`` when ``timeout`` seconds pass first. A
        stream cut by a server restart is opened again."""
        deadline = time.monotonic() + timeout
        backoff = c.Backoff()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job_id, timeout)
            try:
                for job in self.watch_job(job_id, timeout=left):
                    if job.status == Status.DONE:
                        return job
                    if job.status == Status.FAILED:
                        raise JobFailed(job)
            except DeadlineExceeded:
                raise WaitTimeout(job_id, timeout) from None
            except JobqError as e:
                if e.code() not in c.TRANSIENT_CODES:
                    raise
            # Cut, or ended without a final state: follow it again, after a
            # pause.
            time.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))

    def list_jobs(
        self, queue: str = "", status: StatusLike = 0, key: str = "",
        page_size: int = 0, omit_payload: bool = False,
    ) -> Iterator[Job]:
        """Every matching job, following next_page_token. ``status``: a
        ``Status``, or a name ("DONE"). ``omit_payload`` leaves payloads out."""
        token = ""
        while True:
            req = pb.ListJobsRequest(queue=queue, status=c.status_value(status), key=key,
                                     page_size=page_size, page_token=token,
                                     omit_payload=omit_payload)
            resp = self._unary(self.stub.ListJobs, req)
            for j in resp.jobs:
                yield Job.from_pb(j)
            token = resp.next_page_token
            if not token:
                return

    def stats(self, queue: str = "") -> Dict[str, QueueStats]:
        """{queue: QueueStats} for every queue, or just ``queue``."""
        return c.stats_of(self._unary(self.stub.Stats, pb.StatsRequest(queue=queue)))


def _raise_if_lost(e: JobqError) -> None:
    """ABORTED (a stale lease) becomes JobLost."""
    if e.code() == grpc.StatusCode.ABORTED and not isinstance(e, JobLost):
        raise JobLost(e.message or "lease no longer held", e.code()) from None
