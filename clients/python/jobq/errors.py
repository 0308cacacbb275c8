"""What jobq raises, and what a handler raises to say how its job ends.

Every call the server refuses raises a ``JobqError`` subclass named for its
gRPC status (``NotFound``, ``Unavailable``, ``InvalidArgument``, …), with
the server's message (``str(e)``, ``e.message``) and the status
(``e.code()``)::

    try:
        client.get_job(job_id)
    except jobq.NotFound:
        ...
    except jobq.Unavailable:          # down, restarting, unreachable
        ...

``JobqError`` subclasses ``grpc.RpcError``, so ``except grpc.RpcError``
and ``e.code()`` / ``e.details()`` keep working.

A handler raises ``Fatal`` to fail its job for good, or ``Retry`` to have
it retried after a delay it chooses; any other exception fails the attempt
and the server retries it after its backoff.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Dict, Optional, Type, Union

import grpc

if TYPE_CHECKING:
    from jobq.models import Job

__all__ = [
    "JobqError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
    "Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
    "Unauthenticated", "JobLost", "Fatal", "Retry", "JobFailed", "WaitTimeout",
    "from_rpc_error",
]


class JobqError(grpc.RpcError):
    """A call the server refused or could not answer: ``message`` is the
    server's text, ``code()`` the gRPC status code."""

    #: The status this class stands for (JobqError itself: any).
    status: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(message)
        self.message = message
        self._code = code if code is not None else type(self).status

    def code(self) -> grpc.StatusCode:
        """The gRPC status code, e.g. ``grpc.StatusCode.NOT_FOUND``."""
        return self._code

    def details(self) -> str:
        """The server's message (as ``grpc.Call.details()``)."""
        return self.message

    def __str__(self) -> str:
        return self.message or self._code.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, {self._code.name})"


class Cancelled(JobqError):
    """The call was cancelled before it finished (CANCELLED)."""
    status = grpc.StatusCode.CANCELLED


class Unknown(JobqError):
    """UNKNOWN: the server or the transport failed without saying why."""
    status = grpc.StatusCode.UNKNOWN


class InvalidArgument(JobqError):
    """A request the server refuses as sent: a bad queue name, a payload
    over --max-payload, a priority outside -100..=100 (INVALID_ARGUMENT)."""
    status = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(JobqError):
    """No reply within the call's timeout (DEADLINE_EXCEEDED)."""
    status = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(JobqError):
    """No such job or schedule, or one in a queue the token may not read
    (NOT_FOUND)."""
    status = grpc.StatusCode.NOT_FOUND


class AlreadyExists(JobqError):
    status = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(JobqError):
    """The token lacks the call's role on that queue (PERMISSION_DENIED)."""
    status = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(JobqError):
    """A server limit was reached, e.g. --max-paused-queues, or a reply over
    the client's 64 MiB (RESOURCE_EXHAUSTED)."""
    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(JobqError):
    """The job is not in a state that allows it: cancelling a DONE job,
    deleting a RUNNING one (FAILED_PRECONDITION)."""
    status = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(JobqError):
    """A stale lease: this worker no longer holds the job (ABORTED)."""
    status = grpc.StatusCode.ABORTED


class OutOfRange(JobqError):
    status = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(JobqError):
    """The server does not have this call (UNIMPLEMENTED): an older server."""
    status = grpc.StatusCode.UNIMPLEMENTED


class Internal(JobqError):
    status = grpc.StatusCode.INTERNAL


class Unavailable(JobqError):
    """The server could not be reached: down, restarting, refused the
    connection or the TLS handshake (UNAVAILABLE). Safe to retry; pass
    ``wait_for_ready=True`` to the client to wait for the server instead."""
    status = grpc.StatusCode.UNAVAILABLE


class DataLoss(JobqError):
    status = grpc.StatusCode.DATA_LOSS


class Unauthenticated(JobqError):
    """No token, or one the server does not know (UNAUTHENTICATED)."""
    status = grpc.StatusCode.UNAUTHENTICATED


class JobLost(Aborted):
    """Ack or Fail was refused because this worker no longer holds the
    lease (ABORTED): revoked, expired, or the job was cancelled."""


_BY_CODE: Dict[grpc.StatusCode, Type[JobqError]] = {
    cls.status: cls for cls in (
        Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
        PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
        Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}


def code_of(error: BaseException) -> Optional[grpc.StatusCode]:
    """The gRPC status code of a JobqError, a grpc.Call or a grpc.aio
    error; None for anything else."""
    if isinstance(error, JobqError):
        return error.code()
    if isinstance(error, (grpc.Call, grpc.aio.AioRpcError)):
        return error.code()
    return None


def from_rpc_error(error: grpc.RpcError) -> JobqError:
    """The JobqError for a gRPC error (itself if it already is one)."""
    if isinstance(error, JobqError):
        return error
    code = code_of(error) or grpc.StatusCode.UNKNOWN
    details: Optional[str] = None
    if isinstance(error, (grpc.Call, grpc.aio.AioRpcError)):
        details = error.details()
    out = _BY_CODE.get(code, JobqError)(details or code.name.lower().replace("_", " "), code)
    out.__cause__ = error
    out.__suppress_context__ = True
    return out


def from_code(code: int, message: str) -> JobqError:
    """The JobqError for a numeric status (an EnqueueResult's error_code)."""
    status = next((s for s in grpc.StatusCode if s.value[0] == code), grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(status, JobqError)(message, status)


# -- what a handler raises -------------------------------------------------

class Fatal(Exception):
    """Raise from a handler to fail the job without retrying it: it becomes
    FAILED (a dead letter) at once, whatever attempts it has left."""


class Retry(Exception):
    """Raise from a handler to fail this attempt and have the job retried
    ``after`` a delay of your choosing (seconds or a ``timedelta``; 0 means
    due at once) instead of the server's exponential backoff, e.g. when the
    mail server says "try again in a minute"::

        raise Retry("smtp said 421", after=timedelta(minutes=1))

    As with any failure, a job that has used up its ``max_attempts``
    becomes FAILED instead. ``after=None`` is the server's backoff."""

    def __init__(self, message: str = "", *,
                 after: Union[int, float, timedelta, None] = None) -> None:
        super().__init__(message)
        if after is not None:
            secs = after.total_seconds() if isinstance(after, timedelta) else float(after)
            if secs < 0:
                raise ValueError(f"Retry(after=) must not be negative, not {after!r}")
            after = timedelta(seconds=secs)
        #: The delay asked for, or None for the server's backoff.
        self.after: Optional[timedelta] = after


class Snooze(Exception):
    """Raise from a handler to put the job back, due ``after`` a delay
    (seconds or a ``timedelta``; 0 means due at once), without it counting
    as an attempt: not a failure (the API said "429, Retry-After: 30").
    The attempt's history entry reads SNOOZED with the message::

        raise Snooze("429: retry after 30s", after=30)
    """

    def __init__(self, message: str = "", *,
                 after: Union[int, float, timedelta] = 0) -> None:
        super().__init__(message)
        secs = after.total_seconds() if isinstance(after, timedelta) else float(after)
        if secs < 0:
            raise ValueError(f"Snooze(after=) must not be negative, not {after!r}")
        #: How long until the job is due again.
        self.after: timedelta = timedelta(seconds=secs)


class JobFailed(Exception):
    """``Client.wait``: the job ended FAILED (its attempts ran out, a
    handler failed it for good, or it was cancelled: then ``last_error``
    reads ``cancelled: <reason>``). ``job`` is the job as it ended."""

    def __init__(self, job: "Job") -> None:
        super().__init__(f"job {job.id} FAILED: {job.last_error or 'no error given'}")
        self.job = job


class WaitTimeout(TimeoutError):
    """``Client.wait``: the job was not finished when the time ran out."""

    def __init__(self, job_id: str, after: float) -> None:
        super().__init__(f"job {job_id} was not finished after {after:.1f} s")
        self.job_id = job_id
