"""The worker's book of in-flight leases (the Rust client's inflight.rs):
what the heartbeat extends, and whose handler to cancel when a lease is lost.
Pure bookkeeping, no I/O; thread-safe."""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

from jobq.context import BaseJobContext as JobContext

LeaseRef = Tuple[str, str]  # (job_id, lease_id)


class _Entry:
    __slots__ = ("ctx", "settling")

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        # Its ack or fail has been sent: that call's answer, not a heartbeat
        # or revoke that crossed it, says whether the lease was lost.
        self.settling = False


class Book:
    """In-flight jobs by id, from the lease's arrival until its ack/fail is
    settled or the lease is found lost."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: Dict[str, _Entry] = {}

    def insert(self, ctx: JobContext) -> Optional[JobContext]:
        """Books a lease; returns the same job's older run, whose lease is
        necessarily lost (a job has one lease at a time)."""
        with self._lock:
            old = self._jobs.get(ctx.id)
            self._jobs[ctx.id] = _Entry(ctx)
        return old.ctx if old is not None else None

    def settling(self, ctx: JobContext) -> None:
        with self._lock:
            e = self._jobs.get(ctx.id)
            if e is not None and e.ctx.lease_id == ctx.lease_id:
                e.settling = True

    def claim(self, ctx: JobContext) -> bool:
        """Marks the lease settling for a give-back, unless its ack or fail
        is on its way already (or it left the book): True when claimed."""
        with self._lock:
            e = self._jobs.get(ctx.id)
            if e is None or e.ctx.lease_id != ctx.lease_id or e.settling:
                return False
            e.settling = True
            return True

    def remove(self, ctx: JobContext) -> bool:
        """Forgets the job, but only under the lease it ran with."""
        with self._lock:
            e = self._jobs.get(ctx.id)
            if e is not None and e.ctx.lease_id == ctx.lease_id:
                del self._jobs[ctx.id]
                return True
            return False

    def holds(self, ctx: JobContext) -> bool:
        with self._lock:
            e = self._jobs.get(ctx.id)
            return e is not None and e.ctx.lease_id == ctx.lease_id

    def snapshot(self) -> List[LeaseRef]:
        with self._lock:
            return sorted((j, e.ctx.lease_id) for j, e in self._jobs.items())

    def beats(self) -> Tuple[List[LeaseRef], Dict[str, Tuple[int, str]]]:
        """snapshot(), and the progress reports of those leases that no
        heartbeat has carried yet, by job id: one look at the book."""
        with self._lock:
            entries = sorted((j, e.ctx) for j, e in self._jobs.items())
        leases = [(j, ctx.lease_id) for j, ctx in entries]
        reports: Dict[str, Tuple[int, str]] = {}
        for j, ctx in entries:
            r = ctx._report()
            if r is not None:
                reports[j] = r
        return leases, reports

    def reported(self, sent: Sequence[LeaseRef], reports: Dict[str, Tuple[int, str]]) -> None:
        """A heartbeat carried ``reports`` with the leases ``sent``: each is
        forgotten, unless its handler reported again, or its job was leased
        again since."""
        with self._lock:
            entries = [(e.ctx, reports[j]) for j, lid in sent
                       if j in reports and (e := self._jobs.get(j)) is not None
                       and e.ctx.lease_id == lid]
        for ctx, r in entries:
            ctx._reported(r)

    def contexts(self) -> List[JobContext]:
        with self._lock:
            return [e.ctx for e in self._jobs.values()]

    def apply_heartbeat(self, sent: Sequence[LeaseRef], lost: Sequence[LeaseRef],
                        new_deadline: float) -> List[JobContext]:
        """Lost leases leave the book and are returned for cancelling; the
        other sent leases still held get the new deadline."""
        out = [ctx for ctx in (self._take(j, lid) for j, lid in lost) if ctx is not None]
        with self._lock:
            for j, lid in sent:
                e = self._jobs.get(j)
                if e is not None and e.ctx.lease_id == lid:
                    e.ctx._set_deadline(new_deadline)
        return out

    def revoke(self, job_id: str, lease_id: str) -> Optional[JobContext]:
        return self._take(job_id, lease_id)

    def expired(self, now: float) -> List[JobContext]:
        """Takes out the leases whose deadline passed (no heartbeat got
        through): the server may have given those jobs to someone else."""
        with self._lock:
            gone = [j for j, e in self._jobs.items()
                    if not e.settling and e.ctx.lease_deadline() <= now]
            return [self._jobs.pop(j).ctx for j in gone]

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def _take(self, job_id: str, lease_id: str) -> Optional[JobContext]:
        with self._lock:
            e = self._jobs.get(job_id)
            if e is None or e.ctx.lease_id != lease_id or e.settling:
                return None
            del self._jobs[job_id]
            return e.ctx
