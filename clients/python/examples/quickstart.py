"""The quick start: enqueue one job, then work it (Ctrl-C stops).

    python examples/quickstart.py
"""
from jobq import Client, JobContext, Worker


def send_email(ctx: JobContext) -> None:
    # Delivery is at least once: a real handler first checks whether this
    # order's email was already sent. Returning acks the job; raising fails it.
    print(f"attempt {ctx.attempt}: sending {ctx.json()}")


client = Client()  # $JOBQ_SERVER, else http://127.0.0.1:50051
job, created = client.enqueue(
    "emails", "send-email", b'{"order": "order-4711", "to": "ada@example.com"}',
    key="order-4711",
)
print(f"job {job.id} created: {created}")
Worker(client, ["emails"], {"send-email": send_email}).run()  # Ctrl-C drains
