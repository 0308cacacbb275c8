"""What a handler gets: the job plus its lease (the Rust client's
JobContext). ``JobContext`` for the thread-based ``Worker`` (``cancelled``
is a ``threading.Event``), ``AsyncJobContext`` for ``AsyncWorker``
(``cancelled`` is an ``asyncio.Event``)."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Tuple

from jobq._common import report
from jobq.models import Job
from jobq.v1 import jobq_pb2 as pb


class BaseJobContext:
    """One leased job as its handler sees it (the part both workers share):

    - ``id: str``, ``queue: str``, ``kind: str``, ``key: Optional[str]``
      (None when the job has none), ``payload: bytes``, ``json()``,
      ``metadata: Dict[str, str]``;
    - ``attempt: int`` is 1-based: 1 on the first run, 2 on the first
      retry; ``max_attempts: int``;
    - ``lease_id: str``, ``worker_id: str``;
    - ``lease_expires_at: datetime`` (UTC-aware), moved forward by every
      heartbeat that gets through;
    - ``cancel_reason: str``: why the handler was told to stop ("" until
      then): ``"cancelled: <the operator's reason>"`` for a CancelJob,
      ``"revoked: …"``, ``"lease lost (heartbeat)"``, ``"lease deadline
      passed …"`` or ``"worker stopping: drain deadline passed"``;
    - ``job: Job``, the whole typed job as leased.

    Once told to stop, the worker neither acks nor fails the job.
    """

    def __init__(self, job: pb.Job, lease_id: str, worker_id: str,
                 lease_expires_at: float) -> None:
        #: The job (RUNNING), with its payload and metadata.
        self.job: Job = Job.from_pb(job)
        #: The lease's fencing token (Ack and Fail present it).
        self.lease_id: str = lease_id
        #: The id of the worker running the job.
        self.worker_id: str = worker_id
        #: Why the handler was told to stop; "" until it is.
        self.cancel_reason: str = ""
        self._deadline = lease_expires_at
        self._lock = threading.Lock()
        self._is_cancelled = False
        self._on_cancel: List[Callable[[], object]] = []
        # What the handler returned, encoded: sent with the ack.
        self._result = b""
        # The latest progress report no heartbeat has carried yet.
        self._unsent: Optional[Tuple[int, str]] = None
        # Its handler returned after the drain deadline told it to stop:
        # the drain gives the job back.
        self._cut_off = False

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def kind(self) -> str:
        return self.job.kind

    @property
    def key(self) -> Optional[str]:
        """The job's domain key, or None when it has none."""
        return self.job.key or None

    @property
    def payload(self) -> bytes:
        return self.job.payload

    @property
    def metadata(self) -> Dict[str, str]:
        return dict(self.job.metadata)

    @property
    def attempt(self) -> int:
        """Which run this is, from 1 (the server's Job.attempts counts the
        runs that ended without an ack, so it is 0 on the first run)."""
        return self.job.attempts + 1

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def lease_expires_at(self) -> datetime:
        """When the lease ends unless a heartbeat extends it (UTC)."""
        return datetime.fromtimestamp(self.lease_deadline(), tz=timezone.utc)

    def lease_deadline(self) -> float:
        """lease_expires_at as a Unix time."""
        with self._lock:
            return self._deadline

    def is_cancelled(self) -> bool:
        """Whether the handler has been told to stop."""
        with self._lock:
            return self._is_cancelled

    def json(self) -> Any:
        """The payload decoded as JSON. A payload that does not decode raises
        Fatal: retrying cannot fix it, so it must not burn every attempt."""
        return self.job.json()

    def progress(self, percent: int, message: str = "") -> None:
        """Reports how far the job has come: ``percent`` (kept within 0 to
        100) and a short message (cut to 256 bytes). The worker's next
        heartbeat (every lease/3) carries the latest report, which the
        server keeps with the job: ``get_job(id).progress``, ``watch`` and
        the dashboard show it. Reports between two heartbeats cost nothing
        but the last."""
        r = report(percent, message)
        with self._lock:
            self._unsent = r

    # -- the worker's side --------------------------------------------------
    def _report(self) -> Optional[Tuple[int, str]]:
        with self._lock:
            return self._unsent

    def _reported(self, sent: Tuple[int, str]) -> None:
        # Carried (or refused): forgotten, unless the handler reported again.
        with self._lock:
            if self._unsent == sent:
                self._unsent = None

    def _set_deadline(self, deadline: float) -> None:
        # Only later: of two heartbeats that overlap, the older one may
        # answer last.
        with self._lock:
            self._deadline = max(self._deadline, deadline)

    def _cancel(self, reason: str) -> None:
        with self._lock:
            if self._is_cancelled:
                return
            self.cancel_reason = reason
            self._is_cancelled = True
            callbacks = list(self._on_cancel)
        self._set_event()
        for cb in callbacks:
            cb()

    def _set_event(self) -> None:
        raise NotImplementedError

    def _add_cancel_callback(self, cb: Callable[[], object]) -> None:
        with self._lock:
            if not self._is_cancelled:
                self._on_cancel.append(cb)
                return
        cb()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(id={self.id!r}, kind={self.kind!r}, "
                f"attempt={self.attempt}, lease_id={self.lease_id!r})")


class JobContext(BaseJobContext):
    """What a ``Worker`` handler gets (see ``BaseJobContext`` for the
    fields). ``cancelled`` is a ``threading.Event``, set when the handler
    should stop: the lease was revoked (an operator's CancelJob) or
    reported lost, its deadline passed while heartbeats could not reach
    the server, or the worker's drain deadline passed. A thread cannot be
    stopped from outside: long handlers check ``ctx.cancelled.is_set()``
    or wait on it (``ctx.cancelled.wait(5)`` instead of ``sleep(5)``)."""

    def __init__(self, job: pb.Job, lease_id: str, worker_id: str,
                 lease_expires_at: float) -> None:
        super().__init__(job, lease_id, worker_id, lease_expires_at)
        #: Set when the handler should stop; ``cancel_reason`` says why.
        self.cancelled: threading.Event = threading.Event()

    def _set_event(self) -> None:
        self.cancelled.set()


class AsyncJobContext(BaseJobContext):
    """What an ``AsyncWorker`` handler gets (see ``BaseJobContext`` for the
    fields). ``cancelled`` is an ``asyncio.Event``: ``await
    ctx.cancelled.wait()``. When it is set the worker also cancels the
    handler's task (``asyncio.CancelledError``, whose message is
    ``cancel_reason``). Made and set on the worker's event loop."""

    def __init__(self, job: pb.Job, lease_id: str, worker_id: str,
                 lease_expires_at: float) -> None:
        super().__init__(job, lease_id, worker_id, lease_expires_at)
        #: Set when the handler should stop; ``cancel_reason`` says why.
        self.cancelled: asyncio.Event = asyncio.Event()

    def _set_event(self) -> None:
        self.cancelled.set()
