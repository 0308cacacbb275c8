"""JobContext: what a handler gets, the job plus its lease (the Rust
client's JobContext)."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional

from jobq._common import Fatal
from jobq.v1 import jobq_pb2 as pb


class JobContext:
    """One leased job as its handler sees it.

    - ``attempt`` is 1-based: 1 on the first run, 2 on the first retry.
    - ``lease_expires_at`` moves forward with every heartbeat that gets
      through.
    - ``cancelled`` (a ``threading.Event``) is set when the handler should
      stop: the lease was revoked (e.g. an operator's CancelJob) or reported
      lost, its deadline passed while heartbeats could not reach the server,
      or the worker's drain deadline passed. ``cancel_reason`` says which.
      The worker then neither acks nor fails the job: after a drain
      deadline the server reclaims it when the lease ends. A thread cannot be stopped
      from outside: long sync handlers should check ``cancelled``; the
      asyncio worker also cancels the handler's task.
    """

    def __init__(self, job: pb.Job, lease_id: str, worker_id: str,
                 lease_expires_at: float) -> None:
        #: The raw proto job (RUNNING), with its payload and metadata.
        self.job = job
        #: The lease's fencing token (Ack and Fail present it).
        self.lease_id = lease_id
        #: The id of the worker running the job.
        self.worker_id = worker_id
        #: Set when the handler should stop (see the class doc).
        self.cancelled = threading.Event()
        self.cancel_reason = ""
        self._deadline = lease_expires_at
        self._lock = threading.Lock()
        self._on_cancel: List[Callable[[], object]] = []

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
        return self.cancelled.is_set()

    def json(self) -> Any:
        """The payload decoded as JSON. A payload that does not decode raises
        Fatal: retrying cannot fix it, so it must not burn every attempt."""
        try:
            return json.loads(self.job.payload)
        except (ValueError, UnicodeDecodeError) as e:
            raise Fatal(f"payload is not JSON: {e}") from e

    # -- the worker's side --------------------------------------------------
    def _set_deadline(self, deadline: float) -> None:
        # Only later: of two heartbeats that overlap, the older one may
        # answer last.
        with self._lock:
            self._deadline = max(self._deadline, deadline)

    def _cancel(self, reason: str) -> None:
        with self._lock:
            if self.cancelled.is_set():
                return
            self.cancel_reason = reason
            self.cancelled.set()
            callbacks = list(self._on_cancel)
        for cb in callbacks:
            cb()

    def _add_cancel_callback(self, cb: Callable[[], object]) -> None:
        with self._lock:
            if not self.cancelled.is_set():
                self._on_cancel.append(cb)
                return
        cb()

    def __repr__(self) -> str:
        return (f"JobContext(id={self.id!r}, kind={self.kind!r}, attempt={self.attempt}, "
                f"lease_id={self.lease_id!r})")
