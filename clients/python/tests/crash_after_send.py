"""The README's failure, on purpose: a worker that sends an order's
confirmation email with the example's handler, then dies before it acks
(as a kill -9 or an OOM would). story_test.py runs it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
from confirmation_worker import send_email  # noqa: E402

from jobq import Client, JobContext, Worker  # noqa: E402


def send_then_die(ctx: JobContext) -> None:
    send_email(ctx)
    os._exit(1)  # sent, not acked


Worker(Client(), ["emails"], {"send-email": send_then_die}).run()
