"""Enqueues N send-email jobs, keyed by order, so running it twice adds nothing.

    python examples/producer.py --server http://127.0.0.1:50051 --count 100

--server defaults to $JOBQ_SERVER, then http://127.0.0.1:50051 (as the CLI).
"""
import argparse
import json
import sys

from jobq import Client


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", "--target", default=None,
                    help="http://host:port or https://host:port (default: $JOBQ_SERVER)")
    ap.add_argument("--queue", default="emails")
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--first-order", type=int, default=1)
    args = ap.parse_args()

    created = 0
    with Client(args.server) as client:
        client.wait_ready()
        for order in range(args.first_order, args.first_order + args.count):
            payload = json.dumps({"order": order}).encode()
            _, new = client.enqueue(args.queue, "send-email", payload, key=f"order-{order}")
            created += new
    print(f"producer: enqueued {args.count} jobs ({created} new)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
