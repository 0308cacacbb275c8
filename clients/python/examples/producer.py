"""Enqueues N send-email jobs, keyed by order, so running it twice adds nothing.

    python examples/producer.py --target 127.0.0.1:50051 --count 100
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobq import Client  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--queue", default="email")
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--first-order", type=int, default=1)
    args = ap.parse_args()

    created = 0
    with Client(args.target) as client:
        client.wait_ready()
        for order in range(args.first_order, args.first_order + args.count):
            payload = json.dumps({"order": order}).encode()
            job, new = client.enqueue(args.queue, "send-email", payload,
                                      key=f"order-{order}")
            created += new
    print(f"producer: enqueued {args.count} jobs ({created} new)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
