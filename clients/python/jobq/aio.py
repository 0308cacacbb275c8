"""asyncio: AsyncClient (every RPC over a grpc.aio channel) and AsyncWorker
(async handlers, each its own task), with the sync Worker's behaviour."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
import time
from datetime import datetime
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, List, Mapping, Optional,
                    Sequence, Set, Tuple, TypeVar, Union)

import grpc
import grpc.aio

from jobq import _common as c
from jobq._book import Book
from jobq._common import Seconds, StatusLike
from jobq._trace import call_headers, job_span
from jobq.context import AsyncJobContext, BaseJobContext
from jobq.errors import (DeadlineExceeded, Fatal, JobFailed, JobLost, JobqError, Retry, Snooze,
                         WaitTimeout, code_of, from_rpc_error)
from jobq.models import (EnqueueOutcome, EnqueueResult, Enqueued, Job, LeasedJob, NewJob,
                         QueuePolicy, QueueStats,
                         RateLimit, Status,
                         Schedule)
from jobq.v1 import jobq_pb2 as pb
from jobq.v1 import jobq_pb2_grpc as pb_grpc
from jobq.worker import (ABORT_GRACE, DRAIN_SETTLE, GIVE_BACK_TIMEOUT, GIVEN_BACK, Queues,
                         check_callables, default_worker_id, handler_for)

log = logging.getLogger("jobq")

R = TypeVar("R")

#: An async handler: returns to ack, raises to fail (Fatal: for good;
#: Retry(after=…): after that delay).
AsyncHandler = Callable[[AsyncJobContext], Awaitable[object]]

__all__ = ["AsyncClient", "AsyncWorker", "AsyncHandler", "AsyncJobContext"]


class AsyncClient:
    """Client's twin on ``grpc.aio``: the same arguments (``server`` URL,
    ``$JOBQ_SERVER``, ``token``, TLS, ``insecure``, ``timeout``,
    ``wait_for_ready``), the same typed results and ``JobqError``s, every
    method a coroutine (``list_jobs`` an async iterator). Create it inside
    the event loop that uses it."""

    def __init__(
        self,
        server: Optional[str] = None,
        channel: Optional[grpc.aio.Channel] = None,
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
        if channel is not None and not isinstance(channel, grpc.aio.Channel):
            raise TypeError("AsyncClient needs a grpc.aio.Channel; for a blocking channel "
                            "use jobq.Client")
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
            channel = (grpc.aio.secure_channel(target, creds, options=options) if creds
                       else grpc.aio.insecure_channel(target, options=options))
        else:
            self.target = server or ""
        self.channel: grpc.aio.Channel = channel
        # JobQueueAsyncStub exists in the typed stubs only: at run time
        # JobQueueStub over an aio channel is the async stub.
        self.stub: pb_grpc.JobQueueAsyncStub = pb_grpc.JobQueueStub(channel)

    @property
    def _md(self) -> c.Metadata:
        """Each call's headers: the token, and the current span's trace
        context (the server's span for the call joins the caller's trace)."""
        return self._auth + call_headers()

    async def _unary(self, rpc: Callable[..., Awaitable[R]], request: Any,
                     timeout: Optional[float] = None) -> R:
        try:
            return await rpc(request, timeout=timeout or self.timeout, metadata=self._md,
                             wait_for_ready=self.wait_for_ready)
        except JobqError:
            raise
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Waits until the channel is connected (asyncio.TimeoutError)."""
        await asyncio.wait_for(self.channel.channel_ready(), timeout)

    async def enqueue(
        self, queue: str, kind: str, payload: Union[bytes, str] = b"", *,
        key: Optional[str] = None, max_attempts: int = 0, delay: Optional[Seconds] = None,
        run_at: Optional[datetime] = None, metadata: Optional[Mapping[str, str]] = None,
        priority: int = 0, group: Optional[str] = None,
        max_snoozes: Optional[int] = None,
        key_scope: Optional[str] = None, on_conflict: Optional[str] = None,
        unique_for: Optional[Seconds] = None,
    ) -> Enqueued:
        """As Client.enqueue: ``(job, created)``, with the same keywords."""
        req = c.enqueue_request(queue, kind, payload, key, max_attempts, delay, metadata,
                                priority, run_at, group, max_snoozes, key_scope, on_conflict,
                                unique_for)
        resp = await self._unary(self.stub.Enqueue, req)
        return Enqueued(Job.from_pb(resp.job), resp.created,
                        EnqueueOutcome.of(resp.outcome, resp.created))

    async def enqueue_batch(
        self, jobs: Sequence[Union[NewJob, pb.EnqueueRequest]],
    ) -> List[EnqueueResult]:
        """As Client.enqueue_batch."""
        resp = await self._unary(self.stub.EnqueueBatch, c.batch_request(jobs))
        return [EnqueueResult.from_pb(r) for r in resp.results]

    async def dequeue(
        self, queues: Sequence[str], worker_id: str, *, lease: Optional[Seconds] = None,
        wait: Optional[Seconds] = None,
    ) -> Optional[LeasedJob]:
        req = pb.DequeueRequest(queues=c.check_queues(queues), worker_id=worker_id,
                                lease_duration=c.duration(lease), wait=c.duration(wait))
        timeout = self.timeout + (c.seconds(wait) if wait is not None else 0)
        resp = await self._unary(self.stub.Dequeue, req, timeout)
        return LeasedJob.from_pb(resp.leased) if resp.HasField("leased") else None

    async def ack(self, job_id: str, lease_id: str, *, result: bytes = b"",
                  timeout: Optional[float] = None) -> Job:
        try:
            resp = await self._unary(
                self.stub.Ack, pb.AckRequest(job_id=job_id, lease_id=lease_id, result=result),
                timeout)
        except JobqError as e:
            _raise_if_lost(e)
            raise
        return Job.from_pb(resp.job)

    async def fail(
        self, job_id: str, lease_id: str, error: str, *,
        retry_delay: Optional[Seconds] = None, fatal: bool = False,
        snooze: Optional[Seconds] = None, timeout: Optional[float] = None,
    ) -> Job:
        req = c.fail_request(job_id, lease_id, error, retry_delay, fatal, snooze)
        try:
            resp = await self._unary(self.stub.Fail, req, timeout)
        except JobqError as e:
            _raise_if_lost(e)
            raise
        return Job.from_pb(resp.job)

    async def heartbeat(
        self, worker_id: str, leases: Sequence[Tuple[str, str]], *,
        extend_by: Optional[Seconds] = None, draining: bool = False,
        stream_token: str = "", timeout: Optional[float] = None,
        progress: Optional[Mapping[str, Tuple[int, str]]] = None,
    ) -> List[Tuple[str, str]]:
        lost: List[Tuple[str, str]] = []
        for req in c.heartbeat_requests(worker_id, leases, extend_by, draining, stream_token,
                                        progress):
            resp = await self._unary(self.stub.Heartbeat, req, timeout)
            lost.extend((r.job_id, r.lease_id) for r in resp.lost)
        return lost

    def lease(self, request: pb.LeaseRequest) -> Any:
        """Opens a Lease stream (a grpc.aio UnaryStreamCall; no timeout;
        raw gRPC errors)."""
        return self.stub.Lease(request, metadata=self._md)

    async def retry(self, job_id: str) -> Job:
        resp = await self._unary(self.stub.Retry, pb.RetryRequest(job_id=job_id))
        return Job.from_pb(resp.job)

    async def cancel_job(self, job_id: str, reason: str = "") -> Job:
        resp = await self._unary(self.stub.CancelJob,
                                 pb.CancelJobRequest(id=job_id, reason=reason))
        return Job.from_pb(resp.job)

    async def pause_queue(self, queue: str) -> None:
        await self._unary(self.stub.PauseQueue, pb.PauseQueueRequest(queue=queue))

    async def resume_queue(self, queue: str) -> None:
        await self._unary(self.stub.ResumeQueue, pb.ResumeQueueRequest(queue=queue))

    async def paused(self, queue: str) -> bool:
        resp = await self._unary(self.stub.Stats, pb.StatsRequest(queue=queue))
        return any(q.paused for q in resp.queues if q.queue == queue)

    async def set_queue_policy(self, queue: str, *, max_running: int = 0,
                               group_max_running: int = 0,
                               rate: Optional[RateLimit] = None,
                               group_rate: Optional[RateLimit] = None) -> None:
        """As Client.set_queue_policy."""
        await self._unary(self.stub.SetQueuePolicy,
                          c.policy_request(queue, max_running, group_max_running, rate,
                                           group_rate))

    async def queue_policy(self, queue: str) -> QueuePolicy:
        resp = await self._unary(self.stub.GetQueuePolicy,
                                 pb.GetQueuePolicyRequest(queue=queue))
        return QueuePolicy.from_pb(resp.policy)

    async def delete_job(self, job_id: str) -> None:
        await self._unary(self.stub.DeleteJob, pb.DeleteJobRequest(id=job_id))

    async def purge_jobs(self, queue: str, status: StatusLike = 0,
                         finished_before: Union[float, datetime, None] = None) -> int:
        resp = await self._unary(self.stub.PurgeJobs,
                                 c.purge_request(queue, status, finished_before))
        return resp.deleted

    async def create_schedule(self, name: str, queue: str, kind: str, cron: str,
                              payload: Union[bytes, str] = b"", timezone: str = "",
                              max_attempts: int = 0) -> Schedule:
        req = c.schedule_request(name, queue, kind, payload, cron, timezone, max_attempts)
        resp = await self._unary(self.stub.CreateSchedule, req)
        return Schedule.from_pb(resp.schedule)

    async def delete_schedule(self, name: str) -> None:
        await self._unary(self.stub.DeleteSchedule, pb.DeleteScheduleRequest(name=name))

    async def list_schedules(self) -> List[Schedule]:
        resp = await self._unary(self.stub.ListSchedules, pb.ListSchedulesRequest())
        return [Schedule.from_pb(s) for s in resp.schedules]

    async def get_job(self, job_id: str) -> Job:
        return Job.from_pb(await self._unary(self.stub.GetJob, pb.GetJobRequest(id=job_id)))

    async def watch_job(self, *job_ids: str,
                        timeout: Optional[float] = None) -> AsyncIterator[Job]:
        """As ``Client.watch_job``: the jobs' states as they change, until
        every one is DONE or FAILED."""
        call = self.stub.WatchJob(pb.WatchJobRequest(ids=list(job_ids)), timeout=timeout,
                                  metadata=self._md, wait_for_ready=self.wait_for_ready)
        try:
            async for j in call:
                yield Job.from_pb(j)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def wait(self, job_id: str, timeout: float) -> Job:
        """As ``Client.wait``: the DONE job; ``JobFailed`` or ``WaitTimeout``."""
        deadline = time.monotonic() + timeout
        backoff = c.Backoff()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job_id, timeout)
            try:
                async for job in self.watch_job(job_id, timeout=left):
                    if job.status == Status.DONE:
                        return job
                    if job.status == Status.FAILED:
                        raise JobFailed(job)
            except DeadlineExceeded:
                raise WaitTimeout(job_id, timeout) from None
            except JobqError as e:
                if e.code() not in c.TRANSIENT_CODES:
                    raise
            await asyncio.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))

    async def list_jobs(
        self, queue: str = "", status: StatusLike = 0, key: str = "",
        page_size: int = 0, omit_payload: bool = False,
    ) -> AsyncIterator[Job]:
        token = ""
        while True:
            req = pb.ListJobsRequest(queue=queue, status=c.status_value(status), key=key,
                                     page_size=page_size, page_token=token,
                                     omit_payload=omit_payload)
            resp = await self._unary(self.stub.ListJobs, req)
            for job in resp.jobs:
                yield Job.from_pb(job)
            token = resp.next_page_token
            if not token:
                return

    async def stats(self, queue: str = "") -> Dict[str, QueueStats]:
        return c.stats_of(await self._unary(self.stub.Stats, pb.StatsRequest(queue=queue)))


def _raise_if_lost(e: JobqError) -> None:
    if e.code() == grpc.StatusCode.ABORTED and not isinstance(e, JobLost):
        raise JobLost(e.message or "lease no longer held", e.code()) from None


class AsyncWorker:
    """The Worker on asyncio: each job's handler runs as its own task,
    ``capacity`` at a time. Everything the sync Worker does, and a lost or
    revoked lease (or a passed deadline) also cancels the handler's task
    (it sees ``asyncio.CancelledError``; ``ctx.cancelled`` is set first).
    ``await run()`` drains on SIGTERM and SIGINT; ``stop()`` does the same."""

    def __init__(
        self,
        client: AsyncClient,
        queues: Queues,
        handlers: Union[AsyncHandler, Mapping[str, AsyncHandler]],
        *,
        worker_id: Optional[str] = None,
        capacity: int = 1,
        lease: Seconds = 30.0,
        heartbeat_every: Optional[Seconds] = None,
        drain_timeout: Seconds = 30.0,
    ) -> None:
        if not isinstance(client, AsyncClient):
            raise TypeError("AsyncWorker needs a jobq.aio.AsyncClient")
        self.client = client
        self.queues = c.check_queues(queues)
        if not callable(handlers) and not isinstance(handlers, Mapping):
            raise TypeError("handlers must be a callable or a {kind: callable} mapping")
        check_callables(handlers)
        self.handlers = handlers
        self.worker_id = worker_id or default_worker_id()
        self.capacity = capacity
        self.lease = c.seconds(lease)
        self.heartbeat_every = (c.seconds(heartbeat_every) if heartbeat_every is not None
                                else self.lease / 3)
        self.drain_timeout = c.seconds(drain_timeout)
        c.check_worker_settings(self.capacity, self.lease, self.heartbeat_every,
                                self.drain_timeout)
        self._book = Book()
        self._tasks: Set["asyncio.Task[None]"] = set()
        self._stopping: Optional[asyncio.Event] = None
        self._hard_stop = False
        self._draining = False
        self._call: Any = None
        self._stream_open = False
        self._stream_token = ""
        self._last_event = 0.0
        self._beat_now: Optional[asyncio.Event] = None
        self._refused: Optional[grpc.RpcError] = None
        self._ever_opened = False

    def stop(self) -> None:
        """Asks run() to drain and return (call from the loop's thread). A
        second call stops hard."""
        if self._stopping is None:
            raise RuntimeError("stop() before run()")
        if self._stopping.is_set():
            self._hard_stop = True
        self._stopping.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._beat_now = asyncio.Event()
        self._slots = asyncio.Semaphore(self.capacity)
        signals: List[int] = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (int(signal.SIGTERM), int(signal.SIGINT)):
                loop.add_signal_handler(sig, self.stop)
                signals.append(sig)
        beats = asyncio.ensure_future(self._heartbeat_loop())
        stream = asyncio.ensure_future(self._stream_loop())
        try:
            await self._stopping.wait()
            await self._drain()
        finally:
            self._stopping.set()
            if self._call is not None:
                self._call.cancel()
            for t in (stream, beats):
                t.cancel()
            await asyncio.gather(stream, beats, return_exceptions=True)
            for sig in signals:
                loop.remove_signal_handler(sig)
            log.info("worker %s stopped", self.worker_id)
        if self._refused is not None:
            raise from_rpc_error(self._refused)

    async def _stream_loop(self) -> None:
        assert self._stopping is not None
        backoff = c.Backoff()
        while not self._stopping.is_set():
            try:
                await self._stream_once(backoff)
                why = "lease stream ended by the server"
            except grpc.RpcError as e:
                code = code_of(e)
                if not self._ever_opened and code in c.REFUSED_FOR_GOOD:
                    log.error("the server refused the lease stream: %s: %s", code,
                              from_rpc_error(e))
                    self._refused = e
                    self._stopping.set()
                    return
                why = f"lease stream failed: {code}: {from_rpc_error(e)}"
            finally:
                self._stream_open = False
            if self._stopping.is_set():
                return
            if len(self._book) and self._beat_now is not None:
                # Learn now whether its jobs were reclaimed with the stream.
                self._beat_now.set()
            delay = backoff.next_delay()
            log.warning("%s; reconnecting in %.1fs (%d in flight)", why, delay, len(self._book))
            try:
                await asyncio.wait_for(self._stopping.wait(), delay)
            except asyncio.TimeoutError:
                pass

    async def _stream_once(self, backoff: c.Backoff) -> None:
        held = [pb.LeaseRef(job_id=j, lease_id=lid) for j, lid in self._book.snapshot()]
        req = pb.LeaseRequest(queues=self.queues, worker_id=self.worker_id,
                              capacity=self.capacity, lease_duration=c.duration(self.lease),
                              held=held)
        call = self._call = self.client.lease(req)
        headers = await call.initial_metadata()
        self._stream_token = str(dict(headers or ()).get("jobq-stream-token", ""))
        self._stream_open = True
        self._ever_opened = self._ever_opened or bool(self._stream_token)
        if self._stream_token:  # no headers: the call failed, as iterating says
            log.info("lease stream open (%d in flight)", len(self._book))
            if self._draining:
                # The drain's heartbeat went out before this stream had a
                # token, so it could not stop this stream's pushes: again,
                # before any push is read.
                await self._beat()
        async for event in call:
            backoff.reset()
            self._last_event = time.monotonic()
            which = event.WhichOneof("event")
            if which == "leased":
                self._start(event.leased)
            elif which == "revoked":
                r = event.revoked
                ctx = self._book.revoke(r.job_id, r.lease_id)
                if ctx is not None:
                    why = c.revoke_reason(r.reason)
                    log.warning("job %s: %s; cancelling its handler", r.job_id, why)
                    ctx._cancel(why)

    def _start(self, leased: pb.LeasedJob) -> None:
        deadline = c.lease_deadline(leased, self.lease, time.time())
        ctx = AsyncJobContext(leased.job, leased.lease_id, self.worker_id, deadline)
        stale = self._book.insert(ctx)
        if stale is not None:
            stale._cancel("leased again under a new lease")
        task = asyncio.ensure_future(self._run_one(ctx))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_one(self, ctx: AsyncJobContext) -> None:
        handler = handler_for(self.handlers, ctx.kind)
        error: Optional[BaseException] = None
        if handler is None:
            error = RuntimeError(f"no handler for kind {ctx.kind!r}")
        else:
            async with self._slots:
                # Set before the handler's task is cancelled on purpose (its
                # lease is gone, or this task was cancelled): any other
                # CancelledError the handler raises is its own failure. (At
                # loop shutdown asyncio may cancel the handler's task before
                # this one; the error it then returns is dropped below, as
                # this task is cancelled too, and nothing is sent.)
                told = [False]
                run = asyncio.ensure_future(self._execute(handler, ctx, told))

                def stop_run() -> None:
                    told[0] = True
                    run.cancel(ctx.cancel_reason or None)

                ctx._add_cancel_callback(stop_run)
                try:
                    # Shielded: a cancel of this task reaches the handler
                    # through stop_run, marked.
                    error = await asyncio.shield(run)
                except asyncio.CancelledError:
                    if not run.done():
                        stop_run()  # this task itself was cancelled
                        raise
                    if not ctx.is_cancelled():
                        raise
        if not self._book.holds(ctx) or (ctx.is_cancelled() and self._hard_stop):
            # Cut off by the drain deadline: the drain gives the job back.
            ctx._cut_off = ctx.is_cancelled() and self._hard_stop
            log.warning("job %s: %s; not acking", ctx.id, ctx.cancel_reason or "lease lost")
            self._book.remove(ctx)
            return
        try:
            await self._settle(ctx, error)
        except asyncio.CancelledError:
            self._book.remove(ctx)
            raise
        except BaseException:  # noqa: BLE001 - a job must never stay in the book
            # Not heartbeated from now on: its lease runs out and the server
            # delivers it again.
            log.exception("job %s: could not ack/fail; leaving it to the server", ctx.id)
            self._book.remove(ctx)

    async def _execute(self, handler: AsyncHandler, ctx: AsyncJobContext,
                       told: List[bool]) -> Optional[BaseException]:
        try:
            with job_span(ctx.job):
                result: Any = handler(ctx)
                if not inspect.isawaitable(result):
                    # A sync function: it ran (on the event loop) and would
                    # run again on every retry, so the job fails for good.
                    return Fatal(f"the handler for {ctx.kind!r} is not async: use jobq.Worker "
                                 "for sync handlers")
                value = await result
        except asyncio.CancelledError as e:
            if told[0] or ctx.is_cancelled():
                raise  # cancelled on purpose: the lease is gone, or the worker
            # Something inside the handler was cancelled (a task it awaited
            # that someone else cancelled): the handler failed.
            return RuntimeError(f"the handler was cancelled: {c.error_text(e)}")
        except KeyboardInterrupt:
            raise
        # Every other handler error fails the job, BaseExceptions too (the
        # Rust worker fails a handler that panicked).
        except BaseException as e:  # noqa: BLE001
            return e
        ctx._result = c.result_or_none(value, ctx.id)
        return None

    async def _settle(self, ctx: AsyncJobContext, error: Optional[BaseException]) -> None:
        backoff = c.Backoff()
        first, claimed = True, False
        retry_delay = error.after if isinstance(error, Retry) else None
        snooze = error.after if isinstance(error, Snooze) else None
        while True:
            if not first and (ctx.is_cancelled() or self._hard_stop):
                self._book.remove(ctx)
                return
            if not claimed:
                if not self._book.claim(ctx):
                    return  # the drain deadline passed meanwhile and gives it back
                claimed = True
            retry, first = not first, False
            timeout = max(1.0, min(self.client.timeout, ctx.lease_deadline() - time.time()))
            try:
                if error is None:
                    await self.client.ack(ctx.id, ctx.lease_id, result=ctx._result,
                                          timeout=timeout)
                else:
                    await self.client.fail(ctx.id, ctx.lease_id, c.error_text(error),
                                           retry_delay=retry_delay, snooze=snooze,
                                           fatal=isinstance(error, Fatal), timeout=timeout)
                self._book.remove(ctx)
                return
            except JobLost as e:
                log.warning("job %s: lease no longer held; ack/fail refused: %s", ctx.id, e)
                self._book.remove(ctx)
                return
            except JobqError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT and error is None:
                    log.warning("job %s: the server refused the result (%s); failing the job",
                                ctx.id, e)
                    error, first = Fatal(f"the server refused the result: {e}"), True
                    continue
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT and (retry_delay is not None
                                                                or snooze is not None):
                    log.warning("job %s: the server refused the retry delay (%s); failing "
                                "with its backoff instead", ctx.id, e)
                    retry_delay, snooze, first = None, None, True
                    continue
                if (retry and error is None
                        and e.code() == grpc.StatusCode.FAILED_PRECONDITION):
                    # An earlier try reached the server (its reply was
                    # lost): the job is DONE under this lease.
                    self._book.remove(ctx)
                    return
                # Retried whatever the lease deadline says, as the sync
                # Worker does: a restarted server keeps leases.
                if e.code() in c.TRANSIENT_CODES:
                    delay = backoff.next_delay()
                    log.warning("job %s: ack/fail did not reach the server (%s); retrying",
                                ctx.id, e.code())
                    await asyncio.sleep(delay)
                    continue
                log.error("job %s: could not ack/fail (%s)", ctx.id, e.code())
                self._book.remove(ctx)
                return

    async def _heartbeat_loop(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_every
        while True:
            await asyncio.sleep(0.05)
            for ctx in self._book.expired(time.time()):
                log.warning("job %s: lease deadline passed without a successful heartbeat; "
                            "cancelling its handler", ctx.id)
                ctx._cancel("lease deadline passed without a successful heartbeat")
            if time.monotonic() >= next_beat or (self._beat_now is not None
                                                 and self._beat_now.is_set()):
                if self._beat_now is not None:
                    self._beat_now.clear()
                await self._beat()
                next_beat = time.monotonic() + self.heartbeat_every

    async def _beat(self) -> None:
        sent, reports = self._book.beats()
        if not sent and not self._draining and not self._stream_token:
            return
        sent_at = time.time()
        try:
            lost = await self.client.heartbeat(
                self.worker_id, sent, extend_by=self.lease, draining=self._draining,
                stream_token=self._stream_token, timeout=max(1.0, self.heartbeat_every),
                progress=reports)
        except JobqError as e:
            log.warning("heartbeat failed (%s); %d leases", e.code(), len(sent))
            return
        self._book.reported(sent, reports)
        for ctx in self._book.apply_heartbeat(sent, lost, sent_at + self.lease):
            log.warning("job %s: lease lost; cancelling its handler", ctx.id)
            ctx._cancel("lease lost (heartbeat)")

    async def _give_back(self, ctx: BaseJobContext) -> None:
        """As Worker._give_back: the job back at once, no attempt spent."""
        try:
            await self.client.fail(ctx.id, ctx.lease_id, GIVEN_BACK, snooze=0,
                                   timeout=GIVE_BACK_TIMEOUT)
            log.info("job %s: given back at the drain deadline; no attempt spent", ctx.id)
        except JobqError as e:
            log.warning("job %s: could not give it back (%s); the server will reclaim it",
                        ctx.id, e.code())
        self._book.remove(ctx)

    async def _drain(self) -> None:
        self._draining = True
        log.info("shutting down; draining %d in flight", len(self._book))
        await self._beat()
        self._last_event = max(self._last_event, time.monotonic())
        deadline = time.monotonic() + self.drain_timeout
        while True:
            if not len(self._book):
                if time.monotonic() - self._last_event >= DRAIN_SETTLE or not self._stream_open:
                    return
            if self._hard_stop or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.02)
        given_back = not self._hard_stop
        self._hard_stop = True
        cut = self._book.contexts()
        for ctx in cut:
            ctx._cancel("worker stopping: drain deadline passed")
        # The handlers wind down first; one that finished before it was told
        # to stop is acked as usual.
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=ABORT_GRACE)
        if given_back:
            back = [ctx for ctx in cut if ctx._cut_off or self._book.claim(ctx)]
            await asyncio.gather(*(self._give_back(ctx) for ctx in back))
