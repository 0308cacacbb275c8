"""Producer: asks for order 4711's confirmation email (the README's story).

    JOBQ_SERVER=http://127.0.0.1:50051 python confirmation_producer.py [order-4711]
"""
import json
import sys

from jobq import Client

order = sys.argv[1] if len(sys.argv) > 1 else "order-4711"
email = {"order": order, "to": "ada@example.com"}

with Client() as client:  # $JOBQ_SERVER, else http://127.0.0.1:50051
    # The key makes a retried enqueue safe: the same order is one job.
    job, created = client.enqueue("emails", "send-email", json.dumps(email),
                                  key=order, max_attempts=5)
    print(f"job {job.id} for {order}: created={created}, status={job.status.name}")
