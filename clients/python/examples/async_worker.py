"""The send-email worker of worker.py on asyncio (jobq.aio.AsyncWorker).

    python examples/async_worker.py --server http://127.0.0.1:50051 --capacity 5

SIGTERM or Ctrl-C drains: in-flight jobs finish and are acked.
"""
import argparse
import asyncio
import logging
import sys
from typing import Optional, TextIO

from jobq import AsyncJobContext
from jobq.aio import AsyncClient, AsyncWorker


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", "--target", default=None,
                    help="http://host:port or https://host:port (default: $JOBQ_SERVER)")
    ap.add_argument("--queue", default="emails")
    ap.add_argument("--worker-id", default=None)
    ap.add_argument("--capacity", type=int, default=5)
    ap.add_argument("--lease", type=float, default=30.0, help="seconds")
    ap.add_argument("--work", type=float, default=0.1, help="seconds per job")
    ap.add_argument("--log", default=None, help="append 'job_id order' per handled job")
    ap.add_argument("--token", default=None, help="bearer token (default: $JOBQ_TOKEN)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    log_file: Optional[TextIO] = open(args.log, "a", buffering=1) if args.log else None

    async def send_email(ctx: AsyncJobContext) -> None:
        order = ctx.json()["order"]
        await asyncio.sleep(args.work)  # "sending"; cancelled if the lease is lost
        if log_file:
            log_file.write(f"{ctx.id} {order}\n")

    async with AsyncClient(args.server, token=args.token) as client:
        await client.wait_ready()
        worker = AsyncWorker(client, [args.queue], {"send-email": send_email},
                             worker_id=args.worker_id, capacity=args.capacity,
                             lease=args.lease)
        print(f"worker {worker.worker_id}: leasing from {args.queue}", flush=True)
        await worker.run()  # SIGTERM and Ctrl-C drain
        print(f"worker {worker.worker_id}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
