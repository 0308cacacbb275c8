"""The typed values the clients return: ``Job``, ``Attempt``, ``Status``,
``Outcome``, ``QueueStats``, ``EnqueueResult``, ``LeasedJob``,
``Schedule``, and ``NewJob`` (one entry of a batch enqueue). Times are
UTC-aware ``datetime``s, durations ``timedelta``s, empty strings None; the
field names are the proto's, so code written against the messages reads
the same."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple, Union

from google.protobuf import duration_pb2, timestamp_pb2

from jobq.errors import Fatal, JobqError, from_code
from jobq.v1 import jobq_pb2 as pb

__all__ = ["Status", "Outcome", "Job", "Attempt", "QueueStats", "EnqueueResult", "Enqueued",
           "EnqueueOutcome",
           "LeasedJob", "Schedule", "NewJob"]


class Status(enum.IntEnum):
    """Where a job is in its life (``JobStatus``). An ``int``, so it
    compares equal to the proto's numbers."""
    #: Not a status: "any" in filters.
    UNSPECIFIED = 0
    #: Waiting to be taken (possibly not before ``run_at``).
    PENDING = 1
    #: Leased to a worker.
    RUNNING = 2
    #: Acknowledged. Final.
    DONE = 3
    #: Attempts used up, or cancelled: a dead letter until retried.
    FAILED = 4


class Outcome(enum.IntEnum):
    """How one attempt ended (``AttemptOutcome``)."""
    #: Still running (only the last attempt of a RUNNING job).
    UNSPECIFIED = 0
    ACKED = 1
    FAILED = 2
    LEASE_EXPIRED = 3
    WORKER_DISCONNECTED = 4
    #: An operator (CancelJob) or the server took the lease back.
    REVOKED = 5
    #: The worker put the job back without counting the attempt (a snooze).
    SNOOZED = 6


def _time(msg: Any, name: str) -> Optional[datetime]:
    if not msg.HasField(name):
        return None
    ts: timestamp_pb2.Timestamp = getattr(msg, name)
    return ts.ToDatetime(tzinfo=timezone.utc)


def _span(msg: Any, name: str) -> Optional[timedelta]:
    if not msg.HasField(name):
        return None
    d: duration_pb2.Duration = getattr(msg, name)
    return d.ToTimedelta()


@dataclass(frozen=True)
class Attempt:
    """One run of a job."""
    worker_id: str
    started_at: Optional[datetime]
    #: None while it runs.
    ended_at: Optional[datetime]
    outcome: Outcome
    #: Why it ended badly; None for an ack or a running attempt.
    error: Optional[str]

    @classmethod
    def from_pb(cls, a: pb.Attempt) -> "Attempt":
        return cls(worker_id=a.worker_id, started_at=_time(a, "started_at"),
                   ended_at=_time(a, "ended_at"), outcome=Outcome(a.outcome),
                   error=a.error or None)


@dataclass(frozen=True)
class Progress:
    """How far a job has come, as its handler reported it
    (``ctx.progress(percent, message)``)."""
    #: 0 to 100.
    percent: int
    message: str
    #: When the server took the report.
    reported_at: Optional[datetime]

    @classmethod
    def from_pb(cls, p: pb.Progress) -> "Progress":
        return cls(percent=p.percent, message=p.message,
                   reported_at=_time(p, "reported_at"))


@dataclass(frozen=True)
class Job:
    """A job and what the queue remembers about it. Replies to writes
    (enqueue, ack, fail, retry, cancel) leave ``payload`` empty and keep
    only the latest attempt in ``history``; ``get_job`` has everything."""
    id: str
    queue: str
    kind: str
    payload: bytes
    #: The domain key (e.g. "order-4711"), or None.
    key: Optional[str]
    status: Status
    #: Runs that ended without an ack (0 on the first run).
    attempts: int
    max_attempts: int
    enqueued_at: Optional[datetime]
    #: Not to be run before this time.
    run_at: Optional[datetime]
    #: When the current lease began (RUNNING only).
    taken_at: Optional[datetime]
    #: When the current lease ends unless extended (RUNNING only).
    lease_expires_at: Optional[datetime]
    #: When it became DONE or FAILED.
    finished_at: Optional[datetime]
    #: The worker holding it (RUNNING only), else None.
    worker_id: Optional[str]
    #: Why the last attempt ended badly, e.g. "cancelled: order refunded".
    last_error: Optional[str]
    #: One entry per attempt, oldest first.
    history: Tuple[Attempt, ...]
    #: What the producer attached (trace context, request ids).
    metadata: Dict[str, str] = field(default_factory=dict)
    priority: int = 0
    #: What the worker's ack stored (a DONE job's output); ``get_job``
    #: alone reads it, else None.
    result: Optional[bytes] = None
    #: The job's group (a tenant, a customer), or None.
    group: Optional[str] = None
    #: Snoozes since enqueue (or the last retry): runs put back uncounted.
    snoozes: int = 0
    #: Snoozes allowed; a snooze past them counts as a failed attempt.
    max_snoozes: int = 0
    #: The latest progress its handler reported in the latest attempt, or
    #: None. Kept after the job ends.
    progress: Optional[Progress] = None

    @classmethod
    def from_pb(cls, j: pb.Job) -> "Job":
        return cls(
            id=j.id, queue=j.queue, kind=j.kind, payload=j.payload, key=j.key or None,
            status=Status(j.status), attempts=j.attempts, max_attempts=j.max_attempts,
            enqueued_at=_time(j, "enqueued_at"), run_at=_time(j, "run_at"),
            taken_at=_time(j, "taken_at"), lease_expires_at=_time(j, "lease_expires_at"),
            finished_at=_time(j, "finished_at"), worker_id=j.worker_id or None,
            last_error=j.last_error or None,
            history=tuple(Attempt.from_pb(a) for a in j.history),
            metadata=dict(j.metadata), priority=j.priority,
            result=j.result or None, group=j.group or None,
            snoozes=j.snoozes, max_snoozes=j.max_snoozes,
            progress=Progress.from_pb(j.progress) if j.HasField("progress") else None,
        )

    def result_json(self) -> Any:
        """The result decoded as JSON; None when the job has no result."""
        return None if self.result is None else json.loads(self.result)

    def json(self) -> Any:
        """The payload decoded as JSON (``Fatal`` if it is not JSON)."""
        try:
            return json.loads(self.payload)
        except (ValueError, UnicodeDecodeError) as e:
            raise Fatal(f"payload is not JSON: {e}") from e


class EnqueueOutcome(enum.IntEnum):
    """What an enqueue did (``EnqueueOutcome``)."""
    UNSPECIFIED = 0
    #: A new job.
    CREATED = 1
    #: A job held the key and is returned unchanged.
    EXISTING = 2
    #: A PENDING job held the key and took this enqueue's payload,
    #: metadata and due time (``on_conflict="replace"``).
    REPLACED = 3

    @classmethod
    def of(cls, outcome: int, created: bool) -> "EnqueueOutcome":
        """From the wire (a server from before outcomes sends none)."""
        if outcome in (1, 2, 3):
            return cls(outcome)
        return cls.CREATED if created else cls.EXISTING


class _JobCreated(NamedTuple):
    job: Job
    #: False when the key named an existing job and nothing was added.
    created: bool


class Enqueued(_JobCreated):
    """What ``enqueue`` returns: unpacks as ``job, created = …``, and
    says what it did in ``outcome`` (CREATED, EXISTING or REPLACED)."""
    outcome: EnqueueOutcome

    def __new__(cls, job: Job, created: bool,
                outcome: Optional[EnqueueOutcome] = None) -> "Enqueued":
        self = super().__new__(cls, job, created)
        self.outcome = outcome if outcome is not None else EnqueueOutcome.of(0, created)
        return self


@dataclass(frozen=True)
class EnqueueResult:
    """One entry of ``enqueue_batch``'s reply: ``job`` and ``created``
    when accepted, ``error`` (a JobqError, e.g. InvalidArgument) when not."""
    job: Optional[Job]
    created: bool
    error: Optional[JobqError]
    #: What the entry did, when accepted.
    outcome: EnqueueOutcome = EnqueueOutcome.UNSPECIFIED

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def from_pb(cls, r: pb.EnqueueResult) -> "EnqueueResult":
        error = from_code(r.error_code, r.error_message) if r.error_code else None
        return cls(job=Job.from_pb(r.job) if r.HasField("job") else None,
                   created=r.created, error=error,
                   outcome=(EnqueueOutcome.UNSPECIFIED if error
                            else EnqueueOutcome.of(r.outcome, r.created)))


@dataclass(frozen=True)
class LeasedJob:
    """A job leased by ``dequeue``: ack or fail it with ``lease_id``."""
    job: Job
    lease_id: str
    lease_expires_at: Optional[datetime]

    @classmethod
    def from_pb(cls, m: pb.LeasedJob) -> "LeasedJob":
        return cls(job=Job.from_pb(m.job), lease_id=m.lease_id,
                   lease_expires_at=_time(m, "lease_expires_at"))


@dataclass(frozen=True)
class QueueStats:
    """Counts for one queue (``stats``). ``stats()["emails"]["done"]``,
    the older dict form, still reads the four counts."""
    queue: str
    pending: int
    running: int
    done: int
    failed: int
    #: How long the oldest due PENDING job has waited; None when none is due.
    oldest_pending_age: Optional[timedelta]
    #: Nothing is taken from the queue until it is resumed.
    paused: bool
    #: The queue's policy (all zero: none).
    policy: "QueuePolicy" = field(default_factory=lambda: QueuePolicy())
    #: Due PENDING jobs held back because the queue runs max_running.
    held_max_running: int = 0
    #: Due PENDING jobs held back by group_max_running.
    held_group_max_running: int = 0
    #: Due PENDING jobs held back because the rate limit has no token.
    held_rate: int = 0
    #: Due PENDING jobs held back because their group's rate limit has none.
    held_group_rate: int = 0

    @classmethod
    def from_pb(cls, q: pb.QueueStats) -> "QueueStats":
        return cls(queue=q.queue, pending=q.pending, running=q.running, done=q.done,
                   failed=q.failed, oldest_pending_age=_span(q, "oldest_pending_age"),
                   paused=q.paused, policy=QueuePolicy.from_pb(q.policy),
                   held_max_running=q.held_max_running,
                   held_group_max_running=q.held_group_max_running,
                   held_rate=q.held_rate, held_group_rate=q.held_group_rate)

    def counts(self) -> Dict[str, int]:
        """{"pending": n, "running": n, "done": n, "failed": n}."""
        return {"pending": self.pending, "running": self.running, "done": self.done,
                "failed": self.failed}

    def __getitem__(self, name: str) -> int:
        return self.counts()[name]


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: ``limit`` takes per ``per``, at most ``burst`` at
    once after a quiet spell (0: ``limit``)."""
    limit: int
    per: timedelta = timedelta(seconds=1)
    burst: int = 0


@dataclass(frozen=True)
class QueuePolicy:
    """How a queue's work is shaped (``set_queue_policy``); 0 means no
    limit. ``group_max_running=1`` runs each group's jobs one at a time, in
    enqueue order."""
    #: RUNNING jobs of the queue at once, over every server.
    max_running: int = 0
    #: RUNNING jobs of one group (``enqueue(group=…)``) at once.
    group_max_running: int = 0
    #: Takes of the queue's jobs per period, over every server.
    rate: Optional[RateLimit] = None
    #: Takes of one group's jobs per period, over every server.
    group_rate: Optional[RateLimit] = None

    @classmethod
    def from_pb(cls, p: pb.QueuePolicy) -> "QueuePolicy":
        def rate(r: pb.RateLimit) -> Optional[RateLimit]:
            if r.limit == 0:
                return None
            return RateLimit(r.limit, r.per.ToTimedelta(), r.burst)
        return cls(max_running=p.max_running, group_max_running=p.group_max_running,
                   rate=rate(p.rate), group_rate=rate(p.group_rate))

    def __bool__(self) -> bool:
        return bool(self.max_running or self.group_max_running or self.rate
                    or self.group_rate)


@dataclass(frozen=True)
class Schedule:
    """A job enqueued on every tick of a cron expression."""
    name: str
    queue: str
    kind: str
    payload: bytes
    cron: str
    #: IANA zone ("UTC" when none was given).
    timezone: str
    max_attempts: int
    #: None when the expression has no future tick.
    next_run_at: Optional[datetime]
    last_run_at: Optional[datetime]
    created_at: Optional[datetime]

    @classmethod
    def from_pb(cls, s: pb.Schedule) -> "Schedule":
        return cls(name=s.name, queue=s.queue, kind=s.kind, payload=s.payload, cron=s.cron,
                   timezone=s.timezone, max_attempts=s.max_attempts,
                   next_run_at=_time(s, "next_run_at"), last_run_at=_time(s, "last_run_at"),
                   created_at=_time(s, "created_at"))


@dataclass(frozen=True)
class NewJob:
    """One job of ``enqueue_batch``, with ``enqueue``'s keywords::

        client.enqueue_batch([
            NewJob("emails", "send-email", b'{"order": 4711}', key="order-4711"),
            NewJob("emails", "send-email", b'{"order": 4712}', key="order-4712",
                   delay=timedelta(minutes=5)),
        ])
    """
    queue: str
    kind: str
    payload: Union[bytes, str] = b""
    key: Optional[str] = None
    max_attempts: int = 0
    delay: Union[int, float, timedelta, None] = None
    run_at: Optional[datetime] = None
    metadata: Optional[Mapping[str, str]] = None
    priority: int = 0
    group: Optional[str] = None
    max_snoozes: Optional[int] = None
    key_scope: Optional[str] = None
    on_conflict: Optional[str] = None
    unique_for: Union[int, float, timedelta, None] = None
