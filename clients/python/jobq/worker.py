"""Worker: runs handlers in threads for jobs pushed on a Lease stream (the
Rust client's worker.rs, job.rs and heartbeat.rs)."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import socket
import threading
import time
from types import FrameType
from typing import Any, Callable, List, Mapping, Optional, Tuple, Union

import grpc

from jobq import _common as c
from jobq._book import Book
from jobq._common import Seconds
from jobq._trace import job_span
from jobq.errors import Fatal, JobLost, Retry, Snooze, code_of, from_rpc_error
from jobq.client import Client
from jobq.context import BaseJobContext, JobContext
from jobq.v1 import jobq_pb2 as pb

log = logging.getLogger("jobq")

#: A sync handler: returns to ack, raises to fail (Fatal: for good;
#: Retry(after=…): retried after that delay).
Handler = Callable[[JobContext], object]
#: Queue names, in priority order. A list or tuple: a bare str is refused.
Queues = Union[List[str], Tuple[str, ...]]

#: After the drain empties, how long to keep reading the stream for a job the
#: server pushed just before it saw the drain flag (it runs, rather than
#: being reclaimed when the stream closes).
DRAIN_SETTLE = 0.1
#: How long handlers get to end after the drain deadline cancelled them.
ABORT_GRACE = 1.0

#: How long a give-back at the drain deadline may wait for its answer.
GIVE_BACK_TIMEOUT = 2.0

#: The error of a give-back: a snooze, so no attempt is spent.
GIVEN_BACK = "given back: the worker's drain deadline passed"
#: How often the deadline watch looks at the leases.
_TICK = 0.05


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def handler_list(handlers: Union[Any, Mapping[str, Any]]) -> List[Any]:
    """Every handler given: the one callable, or each of the mapping's."""
    if callable(handlers):
        return [handlers]
    return list(handlers.values())


def check_callables(handlers: Union[Any, Mapping[str, Any]]) -> None:
    """Refuses a {kind: handler} mapping with a value that cannot be called
    (every job of that kind would fail, on every attempt)."""
    for kind, h in ([] if callable(handlers) else list(handlers.items())):
        if not callable(h):
            raise TypeError(f"the handler for kind {kind!r} is not callable: {h!r}")


def handler_for(handlers: Union[Any, Mapping[str, Any]], kind: str) -> Optional[Any]:
    if callable(handlers):
        return handlers
    return handlers.get(kind)


class Worker:
    """Runs handlers for jobs pushed on a Lease stream, as the Rust Worker:

    - holds one Lease stream of ``capacity``, reopened with jittered backoff
      (100 ms doubling to 5 s) when it fails; handlers keep running meanwhile
      and still ack over unary calls (a server restart keeps leases);
    - runs each job's handler in its own thread, ``capacity`` at a time,
      with a JobContext (``ctx.attempt`` is 1-based);
    - acks a handler that returned; fails one that raised (``Fatal``: for
      good, no retry); a kind with no handler fails *retryably* (another
      worker may have it during a rolling deploy);
    - retries Ack/Fail that could not reach the server with backoff until
      it answers (a job that finished during a restart is acked, not run
      again); ABORTED (lease lost) is final;
    - heartbeats every lease each ``heartbeat_every`` (lease/3); a lease
      reported lost, revoked on the stream (CancelJob), or whose deadline
      passed while heartbeats could not get through, has ``ctx.cancelled``
      set and is neither acked nor failed;
    - ``run()`` handles SIGTERM and SIGINT (Ctrl-C) by draining, as
      ``stop()`` does: no more jobs, in-flight ones finish and are acked, for
      up to ``drain_timeout``; then the stream closes, so nothing is
      reclaimed. A second signal stops at once (handlers are cancelled).

    ``handlers`` is one callable for every kind, or {kind: callable}.
    """

    def __init__(
        self,
        client: Client,
        queues: Queues,
        handlers: Union[Handler, Mapping[str, Handler]],
        *,
        worker_id: Optional[str] = None,
        capacity: int = 1,
        lease: Seconds = 30.0,
        heartbeat_every: Optional[Seconds] = None,
        drain_timeout: Seconds = 30.0,
    ) -> None:
        if not isinstance(client, Client):
            raise TypeError("Worker needs a jobq.Client (jobq.aio.AsyncWorker takes an "
                            "AsyncClient)")
        self.client = client
        self.queues = c.check_queues(queues)
        if not callable(handlers) and not isinstance(handlers, Mapping):
            raise TypeError("handlers must be a callable or a {kind: callable} mapping")
        check_callables(handlers)
        for h in handler_list(handlers):
            if (inspect.iscoroutinefunction(h)
                    or inspect.iscoroutinefunction(getattr(h, "__call__", None))):
                raise TypeError(f"{h!r} is async: use jobq.aio.AsyncWorker")
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
        self._slots = threading.Semaphore(self.capacity)
        self._stopping = threading.Event()
        self._hard_stop = threading.Event()
        self._draining = False
        self._lock = threading.Lock()
        self._call: Optional[Any] = None
        self._stream_open = False
        self._stream_token = ""
        self._last_event = 0.0
        # Set when the stream drops: heartbeat now, to learn at once whether
        # its jobs were reclaimed with it (the Rust worker does the same).
        self._beat_now = threading.Event()
        # The first stream refused for good: run() raises it.
        self._refused: Optional[grpc.RpcError] = None
        self._ever_opened = False

    # -- public ------------------------------------------------------------
    def run(self, *, handle_signals: bool = True) -> None:
        """Blocks until stop() (or SIGTERM/SIGINT when ``handle_signals`` and
        this is the main thread), then drains and returns."""
        restore = self._install_signals() if handle_signals else []
        beats_done = threading.Event()
        hb = threading.Thread(target=self._heartbeat_loop, args=(beats_done,),
                              name="jobq-heartbeat", daemon=True)
        stream = threading.Thread(target=self._stream_loop, name="jobq-lease", daemon=True)
        hb.start()
        stream.start()
        try:
            # Short waits, so signal handlers run promptly in this thread.
            while not self._stopping.wait(0.2):
                pass
            self._drain()
        finally:
            self._stopping.set()
            self._close_stream()
            stream.join(5)
            beats_done.set()
            hb.join(5)
            for sig, old in restore:
                signal.signal(sig, old)
            log.info("worker %s stopped", self.worker_id)
        if self._refused is not None:
            raise from_rpc_error(self._refused)

    def stop(self) -> None:
        """Asks run() to drain and return. Returns at once; safe from a
        signal handler or another thread. A second call stops hard."""
        if self._stopping.is_set():
            self._hard_stop.set()
        self._stopping.set()

    # -- the stream ----------------------------------------------------------
    def _stream_loop(self) -> None:
        backoff = c.Backoff()
        while not self._stopping.is_set():
            try:
                self._stream_once(backoff)
                why = "lease stream ended by the server"
            except grpc.RpcError as e:
                code = code_of(e)
                if not self._ever_opened and code in c.REFUSED_FOR_GOOD:
                    log.error("the server refused the lease stream: %s: %s", code,
                              e.details() if isinstance(e, grpc.Call) else e)
                    self._refused = e
                    self._stopping.set()
                    return
                why = f"lease stream failed: {code}: {e.details() if isinstance(e, grpc.Call) else e}"
            finally:
                self._stream_open = False
            if self._stopping.is_set():
                return  # no reconnect while draining: in-flight jobs settle over unary calls
            if len(self._book):
                self._beat_now.set()
            delay = backoff.next_delay()
            log.warning("%s; reconnecting in %.1fs (%d in flight)", why, delay, len(self._book))
            self._stopping.wait(delay)

    def _stream_once(self, backoff: c.Backoff) -> None:
        # Leases in flight from an earlier stream count against this one's
        # capacity and belong to it from now on.
        held = [pb.LeaseRef(job_id=j, lease_id=lid) for j, lid in self._book.snapshot()]
        req = pb.LeaseRequest(queues=self.queues, worker_id=self.worker_id,
                              capacity=self.capacity, lease_duration=c.duration(self.lease),
                              held=held)
        call = self.client.lease(req)
        with self._lock:
            self._call = call
        if self._stopping.is_set():
            call.cancel()
        headers = dict(call.initial_metadata() or ())
        self._stream_token = str(headers.get("jobq-stream-token", ""))
        self._stream_open = True
        self._ever_opened = self._ever_opened or bool(self._stream_token)
        if self._stream_token:  # no headers: the call failed, as iterating says
            log.info("lease stream open (%d in flight)", len(self._book))
            if self._draining:
                # The drain's heartbeat went out before this stream had a
                # token, so it could not stop this stream's pushes: again,
                # before any push is read.
                self._beat()
        for event in call:
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

    def _close_stream(self) -> None:
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def _start(self, leased: pb.LeasedJob) -> None:
        deadline = c.lease_deadline(leased, self.lease, time.time())
        ctx = JobContext(leased.job, leased.lease_id, self.worker_id, deadline)
        stale = self._book.insert(ctx)
        if stale is not None:
            stale._cancel("leased again under a new lease")
        threading.Thread(target=self._run_one, args=(ctx,), name=f"jobq-job-{ctx.id}",
                         daemon=True).start()

    # -- one job ---------------------------------------------------------------
    def _run_one(self, ctx: JobContext) -> None:
        # Jobs can outnumber slots briefly after a reconnect; the extras
        # wait here, heartbeated.
        while not self._slots.acquire(timeout=_TICK):
            if ctx.is_cancelled():
                log.warning("job %s: lease lost before the handler started", ctx.id)
                self._book.remove(ctx)
                return
        try:
            error = self._execute(ctx)
        finally:
            self._slots.release()
        if not self._book.holds(ctx) or (ctx.is_cancelled() and self._hard_stop.is_set()):
            # Revoked, reported lost, or past its deadline: someone else may
            # hold the job now. Cancelled at the drain deadline: the handler
            # did not finish, and the drain gives the job back (as in Rust).
            ctx._cut_off = ctx.is_cancelled() and self._hard_stop.is_set()
            log.warning("job %s: %s; not acking", ctx.id, ctx.cancel_reason or "lease lost")
            self._book.remove(ctx)
            return
        try:
            self._settle(ctx, error)
        except BaseException:  # noqa: BLE001 - a job must never stay in the book
            # Not heartbeated from now on: its lease runs out and the server
            # delivers it again.
            log.exception("job %s: could not ack/fail; leaving it to the server", ctx.id)
            self._book.remove(ctx)

    def _execute(self, ctx: JobContext) -> Optional[BaseException]:
        handler = handler_for(self.handlers, ctx.kind)
        if handler is None:
            # Retryable: another worker of the queue may have the handler
            # (a rolling deploy), and max_attempts still bounds the retries.
            return RuntimeError(f"no handler for kind {ctx.kind!r}")
        try:
            with job_span(ctx.job):
                result: Any = handler(ctx)
        # Every handler error fails the job: SystemExit and other
        # BaseExceptions too (the Rust worker fails a handler that panicked).
        except BaseException as e:  # noqa: BLE001
            return e
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            return TypeError(f"the handler for {ctx.kind!r} is async: use jobq.aio.AsyncWorker")
        ctx._result = c.result_or_none(result, ctx.id)
        return None

    def _settle(self, ctx: JobContext, error: Optional[BaseException]) -> None:
        """Acks or fails; transient errors are retried with backoff whatever
        the lease deadline says (a restarted server keeps leases and gives
        them a grace; the job stays in the book, heartbeated), until the
        server answers: ABORTED (lease lost) is final. The hard stop ends
        the retries."""
        backoff = c.Backoff()
        first, claimed = True, False
        retry_delay = error.after if isinstance(error, Retry) else None
        snooze = error.after if isinstance(error, Snooze) else None
        while True:
            if not first and (ctx.is_cancelled() or self._hard_stop.is_set()):
                log.warning("job %s: lease lost before ack/fail; leaving it to the server",
                            ctx.id)
                self._book.remove(ctx)
                return
            if not claimed:
                if not self._book.claim(ctx):
                    # The drain deadline passed meanwhile and gives it back.
                    return
                claimed = True
            retry, first = not first, False
            left = ctx.lease_deadline() - time.time()
            timeout = max(1.0, min(self.client.timeout, left))
            try:
                if error is None:
                    self.client.ack(ctx.id, ctx.lease_id, result=ctx._result, timeout=timeout)
                    log.info("job %s: acked", ctx.id)
                else:
                    self.client.fail(ctx.id, ctx.lease_id, c.error_text(error),
                                     retry_delay=retry_delay, snooze=snooze,
                                     fatal=isinstance(error, Fatal), timeout=timeout)
                    log.info("job %s: failed (%s)", ctx.id, c.error_text(error))
                self._book.remove(ctx)
                return
            except JobLost as e:
                log.warning("job %s: lease no longer held; %s refused: %s", ctx.id,
                            "ack" if error is None else "fail", e)
                self._book.remove(ctx)
                return
            except grpc.RpcError as e:
                code = code_of(e)
                if code == grpc.StatusCode.INVALID_ARGUMENT and error is None:
                    # The result is over the server's --max-result-bytes: no
                    # retry makes it smaller, so the job fails for good.
                    log.warning("job %s: the server refused the result (%s); failing the job",
                                ctx.id, e)
                    error, first = Fatal(f"the server refused the result: {e}"), True
                    continue
                if code == grpc.StatusCode.INVALID_ARGUMENT and (retry_delay is not None
                                                             or snooze is not None):
                    # As the Rust worker: a delay the server refuses (over
                    # its bound) still fails the attempt, with its backoff.
                    log.warning("job %s: the server refused the retry delay (%s); failing "
                                "with its backoff instead", ctx.id, e)
                    retry_delay, snooze, first = None, None, True
                    continue
                if (retry and error is None
                        and code == grpc.StatusCode.FAILED_PRECONDITION):
                    # An earlier try reached the server (its reply was
                    # lost): the job is DONE under this lease.
                    log.info("job %s: acked (an earlier try had reached the server)", ctx.id)
                    self._book.remove(ctx)
                    return
                if code in c.TRANSIENT_CODES:
                    delay = backoff.next_delay()
                    log.warning("job %s: ack/fail did not reach the server (%s); retrying "
                                "in %.1fs", ctx.id, code, delay)
                    ctx.cancelled.wait(delay)
                    continue
                log.error("job %s: could not ack/fail (%s); the server will reclaim it",
                          ctx.id, code)
                self._book.remove(ctx)
                return

    # -- heartbeats and deadlines ---------------------------------------------
    def _heartbeat_loop(self, done: threading.Event) -> None:
        next_beat = time.monotonic() + self.heartbeat_every
        while not done.wait(_TICK):
            for ctx in self._book.expired(time.time()):
                log.warning("job %s: lease deadline passed without a successful "
                            "heartbeat; cancelling its handler", ctx.id)
                ctx._cancel("lease deadline passed without a successful heartbeat")
            if time.monotonic() >= next_beat or self._beat_now.is_set():
                self._beat_now.clear()
                self._beat()
                next_beat = time.monotonic() + self.heartbeat_every

    def _beat(self) -> None:
        sent, reports = self._book.beats()
        # Sent with no leases too while draining (that is what stops the
        # pushes) and while a stream is open (it says the worker is alive).
        if not sent and not self._draining and not self._stream_token:
            return
        sent_at = time.time()
        try:
            lost = self.client.heartbeat(
                self.worker_id, sent, extend_by=self.lease, draining=self._draining,
                stream_token=self._stream_token, timeout=max(1.0, self.heartbeat_every),
                progress=reports)
        except grpc.RpcError as e:
            # The leases may well still be valid (a restarting server):
            # handlers keep running until their deadline.
            code = code_of(e)
            log.warning("heartbeat failed (%s); %d leases", code, len(sent))
            return
        self._book.reported(sent, reports)
        for ctx in self._book.apply_heartbeat(sent, lost, sent_at + self.lease):
            log.warning("job %s: lease lost; cancelling its handler", ctx.id)
            ctx._cancel("lease lost (heartbeat)")

    # -- shutdown ----------------------------------------------------------------
    def _drain(self) -> None:
        self._draining = True
        log.info("shutting down; draining %d in flight", len(self._book))
        self._beat()  # tell the server now, not at the next tick
        self._last_event = max(self._last_event, time.monotonic())
        deadline = time.monotonic() + self.drain_timeout
        while True:
            if not len(self._book):
                quiet = time.monotonic() - self._last_event >= DRAIN_SETTLE
                if quiet or not self._stream_open:
                    return
            if self._hard_stop.is_set() or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        given_back = not self._hard_stop.is_set()
        log.warning("drain deadline passed with %d in flight; cancelling their handlers%s",
                    len(self._book), ", then giving their jobs back" if given_back else "")
        self._hard_stop.set()
        cut = self._book.contexts()
        for ctx in cut:
            ctx._cancel("worker stopping: drain deadline passed")
        # The handlers wind down first; one that finished before it was told
        # to stop is acked as usual.
        end = time.monotonic() + ABORT_GRACE
        while len(self._book) and time.monotonic() < end:
            time.sleep(0.02)
        if not given_back:
            return
        # Given back, all at once: the cut-off ones, and those still running
        # (their ack or fail, if any, is not on its way: claimed).
        back = [ctx for ctx in cut if ctx._cut_off or self._book.claim(ctx)]
        threads = [threading.Thread(target=self._give_back, args=(ctx,), daemon=True)
                   for ctx in back]
        for t in threads:
            t.start()
        until = time.monotonic() + GIVE_BACK_TIMEOUT + 0.5
        for t in threads:
            t.join(max(0.0, until - time.monotonic()))

    def _give_back(self, ctx: BaseJobContext) -> None:
        """Puts a job the drain deadline cut off back at once (a snooze of
        zero): due for another worker without spending an attempt. One try;
        if it does not get through, the server reclaims the job when the
        stream closes (which does spend one)."""
        try:
            self.client.fail(ctx.id, ctx.lease_id, GIVEN_BACK, snooze=0,
                             timeout=GIVE_BACK_TIMEOUT)
            log.info("job %s: given back at the drain deadline; no attempt spent", ctx.id)
        except grpc.RpcError as e:
            log.warning("job %s: could not give it back (%s); the server will reclaim it",
                        ctx.id, code_of(e))
        self._book.remove(ctx)

    def _install_signals(self) -> List[Tuple[int, Any]]:
        if threading.current_thread() is not threading.main_thread():
            return []

        def on_signal(signum: int, frame: Optional[FrameType]) -> None:
            log.info("%s: draining (again to stop at once)", signal.Signals(signum).name)
            self.stop()

        restore: List[Tuple[int, Any]] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            restore.append((sig, signal.getsignal(sig)))
            signal.signal(sig, on_signal)
        return restore
