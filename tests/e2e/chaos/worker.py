"""The fault suite's Python worker: the Python client's Worker on one
server, writing the history the suite's checker reads (the format of
chaos/worker.rs: one line per event, `<unix ns>\t<event>\t<job>\t<lease>\t
<extra>`, each line one write(2), so a SIGKILL loses no line written).

It records what it sees through a Client whose calls write the history:
every Lease stream it opens (`stream`), every job its handler starts
(`leased`), every heartbeat answer (`confirm` with the time it was sent,
or `lost`), and every ack (`acked` with the time it was sent, or
`ack_refused`). Runs until killed.

Environment: JOBQ_CHAOS_WORKER (the worker id), JOBQ_CHAOS_SERVER (its
server's URL), JOBQ_CHAOS_SLOT (that server's slot), JOBQ_CHAOS_HISTORY
(the history file), JOBQ_CHAOS_LEASE_S, JOBQ_CHAOS_HEARTBEAT_S,
JOBQ_CHAOS_CAPACITY.
"""

import os
import random
import threading
import time
from typing import Any, List, Sequence, Tuple

import jobq

HISTORY = os.open(os.environ["JOBQ_CHAOS_HISTORY"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
SLOT = os.environ["JOBQ_CHAOS_SLOT"]


def rec(event: str, job: str = "", lease: str = "", extra: str = "") -> None:
    os.write(HISTORY, f"{time.time_ns()}\t{event}\t{job}\t{lease}\t{extra}\n".encode())


class RecordingClient(jobq.Client):
    def ack(self, job_id: str, lease_id: str, **kw: Any) -> Any:
        sent = time.time_ns()
        try:
            job = super().ack(job_id, lease_id, **kw)
        except jobq.JobLost as e:
            rec("ack_refused", job_id, lease_id, str(e))
            raise
        rec("acked", job_id, lease_id, str(sent))
        return job

    def heartbeat(self, worker_id: str, leases: Sequence[Tuple[str, str]],
                  **kw: Any) -> List[Tuple[str, str]]:
        sent = time.time_ns()
        lost = super().heartbeat(worker_id, leases, **kw)
        gone = set(lost)
        for job, lease in leases:
            if (job, lease) in gone:
                rec("lost", job, lease)
            else:
                rec("confirm", job, lease, str(sent))
        return lost

    def lease(self, request: Any) -> Any:
        rec("stream", extra=SLOT)
        return super().lease(request)


def handle(ctx: jobq.JobContext) -> None:
    rec("leased", ctx.id, ctx.lease_id, SLOT)
    # "Works" 10 to 250 ms; a lost lease ends the run (never acked).
    ctx.cancelled.wait(random.uniform(0.010, 0.250))


def main() -> None:
    client = RecordingClient(os.environ["JOBQ_CHAOS_SERVER"], timeout=1.0)
    lease = float(os.environ["JOBQ_CHAOS_LEASE_S"])
    worker = jobq.Worker(
        client, ["chaos"], {"chaos": handle},
        worker_id=os.environ["JOBQ_CHAOS_WORKER"],
        capacity=int(os.environ["JOBQ_CHAOS_CAPACITY"]),
        lease=lease,
        heartbeat_every=float(os.environ["JOBQ_CHAOS_HEARTBEAT_S"]),
    )
    threading.current_thread().name = "chaos-worker"
    worker.run(handle_signals=False)


if __name__ == "__main__":
    main()
