"""jobq's Python client: a Client with one method per RPC, a Worker that
runs handlers over a Lease stream, and their asyncio twins in ``jobq.aio``.

    from jobq import Client, JobContext, Worker

    with Client("http://127.0.0.1:50051") as client:   # or $JOBQ_SERVER
        job, created = client.enqueue("email", "send-email", b'{"order": 4711}',
                                      key="order-4711")

    def send_email(ctx: JobContext) -> None:
        order = ctx.json()["order"]   # ctx.attempt is 1 on the first run
        ...                           # raise to fail the attempt; return to ack

    Worker(Client(), ["email"], {"send-email": send_email}, capacity=5).run()

The generated stubs are ``jobq.pb`` (messages) and ``jobq.pb_grpc``
(``JobQueueStub``), built from the proto when the package is installed.
Delivery is at least once: make handlers idempotent on the job's domain key.
"""

from jobq._common import (DEFAULT_SERVER, MAX_HEARTBEAT_LEASES, MAX_RECEIVE_BYTES,
                          STATUS_NAMES, Fatal, JobLost, Seconds)
from jobq.client import Client
from jobq.context import JobContext
from jobq.v1 import jobq_pb2 as pb
from jobq.v1 import jobq_pb2_grpc as pb_grpc
from jobq.worker import Handler, Queues, Worker

__all__ = [
    "Client", "Worker", "JobContext", "Handler", "Queues", "Fatal", "JobLost", "Seconds",
    "STATUS_NAMES", "DEFAULT_SERVER", "MAX_HEARTBEAT_LEASES", "MAX_RECEIVE_BYTES",
    "pb", "pb_grpc",
]
