"""jobq's Python client: a Client with one method per RPC, a Worker that
runs handlers over a Lease stream, and their asyncio twins in ``jobq.aio``.

    from jobq import Client, JobContext, Worker

    with Client("http://127.0.0.1:50051") as client:   # or $JOBQ_SERVER
        job, created = client.enqueue("emails", "send-email", b'{"order": 4711}',
                                      key="order-4711")

    def send_email(ctx: JobContext) -> None:
        order = ctx.json()["order"]   # ctx.attempt is 1 on the first run
        ...                           # raise to fail the attempt; return to ack

    Worker(Client(), ["emails"], {"send-email": send_email}, capacity=5).run()

Results are typed (``Job``, ``Status``, ``QueueStats``, UTC ``datetime``s);
refused calls raise ``JobqError`` subclasses (``NotFound``,
``Unavailable``, …). The raw generated stubs are ``jobq.pb`` (messages)
and ``jobq.pb_grpc`` (``JobQueueStub``), built from the proto the package
carries.
Delivery is at least once: make handlers idempotent on the job's domain key.
"""

from jobq._common import (DEFAULT_SERVER, MAX_HEARTBEAT_LEASES, MAX_RECEIVE_BYTES,
                          STATUS_NAMES, Seconds)
from jobq.client import Client
from jobq.context import AsyncJobContext, BaseJobContext, JobContext
from jobq.errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded,
                         FailedPrecondition, Fatal, Internal, InvalidArgument, JobFailed,
                         JobLost, JobqError, NotFound, OutOfRange, PermissionDenied,
                         ResourceExhausted, Retry, Snooze, Unauthenticated, Unavailable,
                         Unimplemented, Unknown, WaitTimeout)
from jobq.models import (Attempt, EnqueueOutcome, EnqueueResult, Enqueued, Job, LeasedJob,
                         NewJob, Outcome, Progress,
                         QueuePolicy, QueueStats, RateLimit, Schedule, Status)
from jobq.v1 import jobq_pb2 as pb
from jobq.v1 import jobq_pb2_grpc as pb_grpc
from jobq.worker import Handler, Queues, Worker

__all__ = [
    "Client", "Worker", "JobContext", "AsyncJobContext", "BaseJobContext", "Handler", "Queues",
    "Job", "Attempt", "Progress", "Status", "Outcome", "QueueStats", "QueuePolicy", "RateLimit",
    "EnqueueResult", "Enqueued", "EnqueueOutcome",
    "LeasedJob", "Schedule", "NewJob",
    "Fatal", "Retry", "Snooze",
    "JobqError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "JobLost", "JobFailed", "WaitTimeout",
    "Seconds", "STATUS_NAMES", "DEFAULT_SERVER", "MAX_HEARTBEAT_LEASES", "MAX_RECEIVE_BYTES",
    "pb", "pb_grpc",
]
