"""The acceptance story, with the book's two examples against a real
`jobq serve`: order 4711's confirmation email is enqueued (twice: one
job); a worker sends it and dies before it acks; the job comes back at
once ("worker disconnected"); the example worker, idempotent on the
order, acks it without sending a second email.

CI runs it with the package installed from its wheel in a fresh
virtualenv outside the checkout:

    .venv/bin/python clients/python/tests/story_test.py
"""

import os
import signal
import subprocess
import sys

from harness import EXAMPLES, HERE, lines, outcomes, run_tests, wait_for
from jobq import Client, Outcome, Status


def run_example(script: str, env: dict, *args: str) -> str:
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args],
                          check=True, capture_output=True, text=True, timeout=60,
                          env=env).stdout


def one_email_for_order_4711(tmp: str, client: Client, addr: str) -> None:
    outbox = os.path.join(tmp, "outbox.jsonl")
    env = dict(os.environ, JOBQ_SERVER="http://" + addr, OUTBOX=outbox)
    first = run_example("confirmation_producer.py", env)
    again = run_example("confirmation_producer.py", env)
    assert "created=True, status=PENDING" in first, first
    assert "created=False" in again, again  # the key: still one job
    [job] = list(client.list_jobs("emails", key="order-4711"))

    crash = subprocess.run([sys.executable, os.path.join(HERE, "crash_after_send.py")],
                           env=env, capture_output=True, text=True, timeout=60)
    assert crash.returncode == 1, crash.stderr[-2000:]
    assert len(lines(outbox)) == 1, lines(outbox)
    wait_for(lambda: client.get_job(job.id).status == Status.PENDING, 10,
             "the job back to PENDING when the worker's stream dropped")

    with open(os.path.join(tmp, "confirmation-worker.out"), "w") as out:
        worker = subprocess.Popen([sys.executable, os.path.join(EXAMPLES,
                                                                "confirmation_worker.py")],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: client.get_job(job.id).status == Status.DONE, 30,
                     "the redelivered job DONE")
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(20) == 0, "the example worker did not drain on SIGTERM"
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    done = client.get_job(job.id)
    assert [a.outcome for a in done.history] == [Outcome.WORKER_DISCONNECTED, Outcome.ACKED], \
        outcomes(done)
    assert done.attempts == 1 and done.finished_at is not None, done
    assert len(lines(outbox)) == 1, f"a second email was sent: {lines(outbox)}"
    print(f"  order 4711: 2 deliveries, 1 email ({done.history[0].worker_id} died after "
          f"sending; {done.history[1].worker_id} acked)")


if __name__ == "__main__":
    sys.exit(run_tests("python-story", [one_email_for_order_4711]))
