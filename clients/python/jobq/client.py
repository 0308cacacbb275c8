"""Client: every JobQueue RPC over a blocking gRPC channel."""

from __future__ import annotations

from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import grpc

from jobq import _common as c
from jobq import _trace
from jobq._common import JobLost, Seconds, StatusLike
from jobq.v1 import jobq_pb2 as pb
from jobq.v1 import jobq_pb2_grpc as pb_grpc


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
    ) -> None:
        if isinstance(channel, grpc.aio.Channel):
            raise TypeError("Client needs a blocking grpc.Channel; for a grpc.aio "
                            "channel use jobq.aio.AsyncClient")
        if channel is not None and not isinstance(channel, grpc.Channel):
            raise TypeError(f"channel must be a grpc.Channel, got {type(channel).__name__}")
        self.timeout = timeout
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
        payload: bytes = b"",
        *,
        key: str = "",
        max_attempts: int = 0,
        delay: Optional[Seconds] = None,
        metadata: Optional[Mapping[str, str]] = None,
        priority: int = 0,
    ) -> Tuple[pb.Job, bool]:
        """Adds a job; returns (job, created). With a known key, returns the
        existing job and created=False, so retrying an enqueue is safe.

        ``metadata`` is stored with the job (request ids, tenant tags). With
        opentelemetry-api installed, the current span's W3C ``traceparent``
        and ``tracestate`` are added, so the worker continues the trace.
        ``priority`` (-100..=100, higher first) needs a proto with
        EnqueueRequest.priority: built from an older one, it is a ValueError."""
        req = c.enqueue_request(queue, kind, payload, key, max_attempts, delay, metadata,
                                priority)
        resp = self.stub.Enqueue(req, timeout=self.timeout, metadata=self._md)
        return resp.job, resp.created

    def enqueue_batch(self, requests: Sequence[pb.EnqueueRequest]) -> List[pb.EnqueueResult]:
        """Adds many jobs with one flush; one EnqueueResult per request."""
        resp = self.stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=list(requests)),
                                      timeout=self.timeout, metadata=self._md)
        return list(resp.results)

    # -- worker (one job at a time; Worker is the usual way) ---------------
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
            queues=c.check_queues(queues), worker_id=worker_id,
            lease_duration=c.duration(lease), wait=c.duration(wait),
        )
        timeout = self.timeout + (c.seconds(wait) if wait is not None else 0)
        resp = self.stub.Dequeue(req, timeout=timeout, metadata=self._md)
        return resp.leased if resp.HasField("leased") else None

    def ack(self, job_id: str, lease_id: str, *, timeout: Optional[float] = None) -> pb.Job:
        """RUNNING -> DONE. Raises JobLost when the lease is no longer ours."""
        try:
            return self.stub.Ack(pb.AckRequest(job_id=job_id, lease_id=lease_id),
                                 timeout=timeout or self.timeout, metadata=self._md).job
        except grpc.RpcError as e:
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
        timeout: Optional[float] = None,
    ) -> pb.Job:
        """Ends the attempt badly (retried after a backoff unless ``fatal``).
        Raises JobLost when the lease is no longer ours."""
        req = c.fail_request(job_id, lease_id, error, retry_delay, fatal)
        try:
            return self.stub.Fail(req, timeout=timeout or self.timeout, metadata=self._md).job
        except grpc.RpcError as e:
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
    ) -> List[Tuple[str, str]]:
        """Extends leases [(job_id, lease_id)]; returns the ones lost, same shape.

        ``stream_token`` is the ``jobq-stream-token`` header of the sender's
        Lease stream: ``draining`` applies to that stream alone. One call per
        MAX_HEARTBEAT_LEASES leases (the server's per-call limit)."""
        lost: List[Tuple[str, str]] = []
        for req in c.heartbeat_requests(worker_id, leases, extend_by, draining, stream_token):
            resp = self.stub.Heartbeat(req, timeout=timeout or self.timeout, metadata=self._md)
            lost.extend((r.job_id, r.lease_id) for r in resp.lost)
        return lost

    def lease(self, request: pb.LeaseRequest) -> grpc._CallIterator[pb.LeaseEvent]:
        """Opens a Lease stream (the Worker's; no timeout)."""
        return self.stub.Lease(request, metadata=self._md)

    # -- operator ----------------------------------------------------------
    def retry(self, job_id: str) -> pb.Job:
        """Brings a FAILED job back to PENDING with its attempts reset."""
        return self.stub.Retry(pb.RetryRequest(job_id=job_id), timeout=self.timeout,
                               metadata=self._md).job

    def cancel_job(self, job_id: str, reason: str = "") -> pb.Job:
        """PENDING or RUNNING -> FAILED with last_error "cancelled: <reason>";
        a running job's worker is sent `revoked` (its handler's
        ``ctx.cancelled`` is set). FAILED_PRECONDITION for a DONE or FAILED
        job. The reason is never refused: a NUL is kept as U+FFFD and the
        kept text is cut to the server's --max-error-bytes. Needs the admin
        role."""
        return self.stub.CancelJob(pb.CancelJobRequest(id=job_id, reason=reason),
                                   timeout=self.timeout, metadata=self._md).job

    def pause_queue(self, queue: str) -> None:
        """Nothing is taken from ``queue`` until resume_queue (enqueues are
        accepted, running jobs finish). Persisted. RESOURCE_EXHAUSTED when
        the server's --max-paused-queues queues are paused and ``queue`` is
        not one of them. Needs the admin role."""
        self.stub.PauseQueue(pb.PauseQueueRequest(queue=queue), timeout=self.timeout,
                             metadata=self._md)

    def resume_queue(self, queue: str) -> None:
        """Undoes pause_queue. Needs the admin role."""
        self.stub.ResumeQueue(pb.ResumeQueueRequest(queue=queue), timeout=self.timeout,
                              metadata=self._md)

    def paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused (QueueStats.paused)."""
        resp = self.stub.Stats(pb.StatsRequest(queue=queue), timeout=self.timeout,
                               metadata=self._md)
        return any(q.paused for q in resp.queues if q.queue == queue)

    def delete_job(self, job_id: str) -> None:
        """Deletes a PENDING, DONE or FAILED job for good (its key is free
        again); FAILED_PRECONDITION for a RUNNING one. Needs the admin role."""
        self.stub.DeleteJob(pb.DeleteJobRequest(id=job_id), timeout=self.timeout,
                            metadata=self._md)

    def purge_jobs(self, queue: str, status: StatusLike = 0,
                   finished_before: Optional[float] = None) -> int:
        """Deletes ``queue``'s DONE and/or FAILED jobs (status 0 = both) that
        finished before ``finished_before`` (a Unix time; None = now), or
        with status PENDING (and no ``finished_before``) its PENDING jobs
        when the purge begins; returns how many. Never RUNNING jobs
        (INVALID_ARGUMENT). Purged jobs free their keys."""
        req = c.purge_request(queue, status, finished_before)
        return self.stub.PurgeJobs(req, timeout=self.timeout, metadata=self._md).deleted

    def create_schedule(self, name: str, queue: str, kind: str, cron: str,
                        payload: Union[bytes, str] = b"", timezone: str = "",
                        max_attempts: int = 0) -> pb.Schedule:
        """Creates (or replaces) schedule ``name``: every tick of ``cron`` (5
        fields, or 6 with leading seconds), read in ``timezone`` (IANA; ""
        = UTC), enqueues one job keyed ``schedule:<name>:<tick time>``.
        Returns it with ``next_run_at``. Needs the admin role."""
        req = c.schedule_request(name, queue, kind, payload, cron, timezone, max_attempts)
        return self.stub.CreateSchedule(req, timeout=self.timeout, metadata=self._md).schedule

    def delete_schedule(self, name: str) -> None:
        """Deletes schedule ``name`` (its jobs stay); NOT_FOUND if unknown."""
        self.stub.DeleteSchedule(pb.DeleteScheduleRequest(name=name), timeout=self.timeout,
                                 metadata=self._md)

    def list_schedules(self) -> List[pb.Schedule]:
        """Every schedule the caller may read, by name, with next run times."""
        resp = self.stub.ListSchedules(pb.ListSchedulesRequest(), timeout=self.timeout,
                                       metadata=self._md)
        return list(resp.schedules)

    def get_job(self, job_id: str) -> pb.Job:
        """One job with its payload and attempt history."""
        return self.stub.GetJob(pb.GetJobRequest(id=job_id), timeout=self.timeout,
                                metadata=self._md)

    def list_jobs(
        self, queue: str = "", status: StatusLike = 0, key: str = "",
        page_size: int = 0, omit_payload: bool = False,
    ) -> Iterator[pb.Job]:
        """Every matching job, following next_page_token. ``status``: a
        JobStatus number or a name ("DONE" or "JOB_STATUS_DONE").
        ``omit_payload`` leaves payloads out."""
        token = ""
        while True:
            req = pb.ListJobsRequest(queue=queue, status=c.status_value(status), key=key,
                                     page_size=page_size, page_token=token,
                                     omit_payload=omit_payload)
            resp = self.stub.ListJobs(req, timeout=self.timeout, metadata=self._md)
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def stats(self, queue: str = "") -> Dict[str, Dict[str, int]]:
        """{queue: {"pending": n, "running": n, "done": n, "failed": n}}."""
        resp = self.stub.Stats(pb.StatsRequest(queue=queue), timeout=self.timeout,
                               metadata=self._md)
        return c.stats_dict(resp)


def _raise_if_lost(e: grpc.RpcError) -> None:
    """ABORTED (a stale lease) becomes JobLost."""
    if isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.ABORTED:
        raise JobLost(e.details() or "lease no longer held") from e
