"""Worker: sends each order's confirmation email once, however often its
job is delivered. Ctrl-C or SIGTERM drains.

    JOBQ_SERVER=http://127.0.0.1:50051 OUTBOX=outbox.jsonl python confirmation_worker.py
"""
import json
import os

from jobq import Client, JobContext, Worker

OUTBOX = os.environ.get("OUTBOX", "outbox.jsonl")  # stands in for the mail provider


def already_sent(order: str) -> bool:
    if not os.path.exists(OUTBOX):
        return False
    with open(OUTBOX) as f:
        return any(json.loads(line)["order"] == order for line in f)


def send_email(ctx: JobContext) -> None:
    email = ctx.json()  # a payload that is not JSON fails the job for good
    # Delivery is at least once: a worker may die after sending, before
    # its ack, and the job comes back. Check the *order*, not the job id.
    if already_sent(email["order"]):
        return
    with open(OUTBOX, "a") as f:  # "send" it
        f.write(json.dumps(email) + "\n")


if __name__ == "__main__":
    Worker(Client(), ["emails"], {"send-email": send_email}).run()
