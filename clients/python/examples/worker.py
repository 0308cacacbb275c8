"""A send-email worker: leases jobs from a queue and "sends" each email.

    python examples/worker.py --server http://127.0.0.1:50051 --capacity 5

It appends one line per handled job to --log (when given), so a test can see
its progress. SIGTERM or Ctrl-C drains: in-flight jobs finish and are acked.
"""
import argparse
import logging
import sys
import time
from typing import Optional, TextIO

from jobq import Client, JobContext, Worker


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", "--target", default=None,
                    help="http://host:port or https://host:port (default: $JOBQ_SERVER)")
    ap.add_argument("--queue", default="emails")
    ap.add_argument("--worker-id", default=None)
    ap.add_argument("--capacity", type=int, default=5)
    ap.add_argument("--lease", type=float, default=30.0, help="seconds")
    ap.add_argument("--work", type=float, default=0.1, help="seconds per job")
    ap.add_argument("--fail-first-attempt-every", type=int, default=0,
                    help="orders divisible by N fail their first attempt")
    ap.add_argument("--log", default=None, help="append 'job_id order' per handled job")
    ap.add_argument("--token", default=None, help="bearer token (default: $JOBQ_TOKEN)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    log_file: Optional[TextIO] = open(args.log, "a", buffering=1) if args.log else None

    def send_email(ctx: JobContext) -> None:
        order = ctx.json()["order"]  # a payload that is not JSON fails for good
        if ctx.cancelled.wait(args.work):  # "sending", or told to stop
            return
        n = args.fail_first_attempt_every
        if n and order % n == 0 and ctx.attempt == 1:
            raise RuntimeError(f"mail server busy for order {order}")
        # A real handler checks "was the email for this order already sent?"
        # here: delivery is at least once.
        if log_file:
            log_file.write(f"{ctx.id} {order}\n")

    client = Client(args.server, token=args.token)
    client.wait_ready()
    worker = Worker(client, [args.queue], {"send-email": send_email},
                    worker_id=args.worker_id, capacity=args.capacity, lease=args.lease)
    print(f"worker {worker.worker_id}: leasing from {args.queue}", flush=True)
    worker.run()  # SIGTERM and Ctrl-C drain
    print(f"worker {worker.worker_id}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
