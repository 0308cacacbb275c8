"""Runs the book's grpcurl cookbook (docs/src/grpcurl.md) against a live
`jobq serve` and checks every reply.

The commands are read from docs/src/grpcurl.md, between
`<!-- cookbook:begin -->` and `<!-- cookbook:end -->`: each ```sh block is one step, run as written with
bash, except that 127.0.0.1:50051 becomes the test server's address. Like a
reader, the test sets JOB_ID and LEASE_ID from each Dequeue reply. Each step
must match the next entry of STEPS below, so a command added to or removed
from the cookbook without a check here fails the test.

    .venv/bin/python scripts/cookbook_test.py

grpcurl is taken from PATH, with the venv's bin/ (the folder of this Python)
put first. JOBQ_BIN overrides the server binary (default target/debug/jobq).
Prints `cookbook: N passed, M failed`; exits non-zero on a failure.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COOKBOOK = os.path.join(ROOT, "docs", "src", "grpcurl.md")
JOBQ_BIN = os.environ.get("JOBQ_BIN", os.path.join(ROOT, "target", "debug", "jobq"))
DEFAULT_ADDR = "127.0.0.1:50051"
RPCS = ["Enqueue", "EnqueueBatch", "Dequeue", "Ack", "Fail", "Retry", "Lease",
        "Heartbeat", "GetJob", "WatchJob", "ListJobs", "Stats", "CancelJob", "PauseQueue",
        "ResumeQueue", "SetQueuePolicy", "GetQueuePolicy", "DeleteJob", "PurgeJobs",
        "CreateSchedule", "ListSchedules", "DeleteSchedule"]
DEADLINE_EXCEEDED = 64 + 4  # grpcurl exits 64 + the gRPC status code


def extract_blocks(text):
    m = re.search(r"<!-- cookbook:begin -->(.*?)<!-- cookbook:end -->", text, re.S)
    if not m:
        raise SystemExit("docs/src/grpcurl.md has no cookbook markers")
    return [b.strip("\n") for b in re.findall(r"```sh\n(.*?)```", m.group(1), re.S)]


def parse_json_stream(out):
    """grpcurl prints one JSON object per message; a stream gives several."""
    dec, i, objs = json.JSONDecoder(), 0, []
    out = out.strip()
    while i < len(out):
        obj, j = dec.raw_decode(out, i)
        objs.append(obj)
        i = j
        while i < len(out) and out[i].isspace():
            i += 1
    return objs


class Result:
    def __init__(self, proc):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self):
        objs = parse_json_stream(self.out)
        assert len(objs) == 1, f"expected one JSON reply, got {len(objs)}"
        return objs[0]

    def ok(self):
        assert self.rc == 0, f"exit {self.rc}: {self.err.strip()}"
        return self


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


class Cookbook:
    def __init__(self, addr):
        self.addr = addr
        self.env = dict(os.environ)
        venv_bin = os.path.dirname(sys.executable)
        self.env["PATH"] = venv_bin + os.pathsep + self.env.get("PATH", "")
        self.env.pop("JOB_ID", None)
        self.env.pop("LEASE_ID", None)

    def run(self, block):
        cmd = block.replace(DEFAULT_ADDR, self.addr)
        proc = subprocess.run(["bash", "-euc", cmd], env=self.env, capture_output=True,
                              text=True, timeout=60)
        return Result(proc)

    def set_lease(self, reply):
        leased = reply["leased"]
        self.env["JOB_ID"] = leased["job"]["id"]
        self.env["LEASE_ID"] = leased["leaseId"]


# -- the checks, one per cookbook step, in order ------------------------------
# Each is (what the command must contain, check(cookbook, block, result)).
# A check may run its block again for a follow-up check; it returns a list of
# extra check names it passed (each counts as one more passed check).

def check_list(cb, block, r):
    services = r.ok().out.split()
    for s in ("jobq.v1.JobQueue", "grpc.health.v1.Health"):
        expect(s in services, f"{s} not listed: {services}")


def check_describe_service(cb, block, r):
    out = r.ok().out
    for rpc in RPCS:
        expect(re.search(rf"rpc {rpc} \(", out), f"describe lacks rpc {rpc}")
    expect("stream .jobq.v1.LeaseEvent" in out, "Lease is not shown as a stream")


def check_describe_message(cb, block, r):
    out = r.ok().out
    expect("message EnqueueRequest" in out and "string key = 4;" in out, out)


def check_health(cb, block, r):
    expect(r.ok().json() == {"status": "SERVING"}, r.out)


def check_enqueue(cb, block, r):
    reply = r.ok().json()
    job = reply["job"]
    expect(reply.get("created") is True, f"created is not true: {reply}")
    expect(job.get("id"), "no job id")
    expect(job["key"] == "order-4711" and job["status"] == "JOB_STATUS_PENDING", job)
    # Replies to writes never echo the payload (GetJob has it).
    expect("payload" not in job, job)
    # The cookbook says: run it again and the same job comes back, not created.
    again = cb.run(block).ok().json()
    expect(again["job"]["id"] == job["id"], f"second enqueue made a new job: {again}")
    expect(not again.get("created", False), f"second enqueue says created: {again}")
    return ["Enqueue again (same key) -> same job, created false"]


def check_enqueue_batch(cb, block, r):
    results = r.ok().json()["results"]
    expect([x["job"]["key"] for x in results] == ["order-4712", "order-4713"], results)
    expect(all(x.get("created") is True for x in results), results)
    expect(all("errorCode" not in x for x in results), results)


def dequeue_check(key):
    def check(cb, block, r):
        leased = r.ok().json()["leased"]
        job = leased["job"]
        expect(job["key"] == key, f"dequeued {job['key']}, want {key}")
        expect(job["status"] == "JOB_STATUS_RUNNING", job)
        expect(job["workerId"] == "cli-worker", job)
        expect(leased.get("leaseId") and leased.get("leaseExpiresAt"), leased)
        cb.set_lease(r.json())
    return check


def check_heartbeat(cb, block, r):
    expect(r.ok().json() == {}, f"heartbeat reports lost leases: {r.out}")


def check_ack(cb, block, r):
    job = r.ok().json()["job"]
    expect(job["id"] == cb.env["JOB_ID"] and job["status"] == "JOB_STATUS_DONE", job)
    # The cookbook says a second ack is refused with FailedPrecondition.
    again = cb.run(block)
    expect(again.rc != 0 and "FailedPrecondition" in again.err,
           f"second ack: exit {again.rc}: {again.err}")
    return ["Ack again -> FailedPrecondition"]


def check_get_job(cb, block, r):
    job = r.ok().json()
    expect(job["id"] == cb.env["JOB_ID"] and job["status"] == "JOB_STATUS_DONE", job)
    outcomes = [a.get("outcome") for a in job["history"]]
    expect(outcomes == ["ATTEMPT_OUTCOME_ACKED"], outcomes)


def check_watch_job(cb, block, r):
    # Already DONE: its one final state, then the stream ends (grpcurl exits).
    job = r.ok().json()
    expect(job["id"] == cb.env["JOB_ID"] and job["status"] == "JOB_STATUS_DONE", job)
    expect("payload" not in job, job)


def check_list_by_key(cb, block, r):
    jobs = r.ok().json()["jobs"]
    expect(len(jobs) == 1, jobs)
    expect(jobs[0]["key"] == "order-4711" and jobs[0]["status"] == "JOB_STATUS_DONE", jobs)


def check_fail(cb, block, r):
    job = r.ok().json()["job"]
    expect(job["id"] == cb.env["JOB_ID"] and job["status"] == "JOB_STATUS_FAILED", job)
    expect(job["lastError"] == "mail server said 550", job)
    expect(job["history"][-1]["outcome"] == "ATTEMPT_OUTCOME_FAILED", job)


def check_list_failed(cb, block, r):
    jobs = r.ok().json()["jobs"]
    expect([j["key"] for j in jobs] == ["order-4712"], jobs)
    expect(jobs[0]["status"] == "JOB_STATUS_FAILED", jobs)


def check_retry(cb, block, r):
    job = r.ok().json()["job"]
    expect(job["id"] == cb.env["JOB_ID"] and job["status"] == "JOB_STATUS_PENDING", job)
    expect(job.get("attempts", 0) == 0, job)


def check_lease(cb, block, r):
    expect(r.rc in (0, DEADLINE_EXCEEDED), f"exit {r.rc}: {r.err}")
    if r.rc:
        expect("DeadlineExceeded" in r.err, r.err)
    events = parse_json_stream(r.out)
    leased = [e["leased"] for e in events if "leased" in e]
    keys = [le["job"]["key"] for le in leased]
    expect(keys == ["order-4713", "order-4712"], f"leased {keys}, events: {events}")
    for le in leased:
        expect(le["leaseId"] and le["job"]["status"] == "JOB_STATUS_RUNNING", le)
        expect(le["job"]["workerId"] == "cli-worker", le)


def check_stats(cb, block, r):
    # The stream just ended; the server reclaims its jobs at once, but "at
    # once" is after it sees the connection close: allow it a moment.
    deadline = time.monotonic() + 5
    while True:
        queues = r.ok().json().get("queues", [])
        got = {k: q.get(k, "0") for q in queues for k in
               ("queue", "pending", "running", "done", "failed")}
        want = {"queue": "emails", "pending": "2", "running": "0", "done": "1",
                "failed": "0"}
        if len(queues) == 1 and got == want:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"stats {queues}, want {want}")
        time.sleep(0.1)
        r = cb.run(block)
    expect("oldestPendingAge" in queues[0], queues)


def check_cancel(cb, block, r):
    job = r.ok().json()["job"]
    expect(job["id"] == cb.env["JOB_ID"] and job["status"] == "JOB_STATUS_FAILED", job)
    expect(job["lastError"] == "cancelled: order refunded", job)
    # The cookbook says a second cancel (the job is FAILED now) is refused.
    again = cb.run(block)
    expect(again.rc != 0 and "FailedPrecondition" in again.err,
           f"second cancel: exit {again.rc}: {again.err}")
    return ["CancelJob again -> FailedPrecondition"]


def check_empty_reply(cb, block, r):
    expect(r.ok().json() == {}, r.out)


def check_paused_stats(cb, block, r):
    queues = r.ok().json().get("queues", [])
    expect(len(queues) == 1 and queues[0].get("paused") is True, queues)
    expect(queues[0].get("pending") == "1", queues)
    # While paused, a Dequeue gets nothing (the cookbook says so).
    dq = cb.run("grpcurl -plaintext -d '{\"queues\": [\"emails\"], \"worker_id\": "
                "\"cli-worker\"}' 127.0.0.1:50051 jobq.v1.JobQueue/Dequeue").ok().json()
    expect(dq == {}, f"a paused queue handed out {dq}")
    return ["Dequeue while paused -> {}"]


def check_resume(cb, block, r):
    expect(r.ok().json() == {}, r.out)
    stats = cb.run("grpcurl -plaintext -d '{\"queue\": \"emails\"}' 127.0.0.1:50051 "
                   "jobq.v1.JobQueue/Stats").ok().json()
    expect("paused" not in stats["queues"][0], stats)
    return ["Stats after resume -> not paused"]


def check_delete(cb, block, r):
    expect(r.ok().json() == {}, r.out)
    got = cb.run("grpcurl -plaintext -d '{\"id\": \"" + cb.env["JOB_ID"] + "\"}' "
                 "127.0.0.1:50051 jobq.v1.JobQueue/GetJob")
    expect(got.rc != 0 and "NotFound" in got.err, f"GetJob after delete: {got.rc} {got.err}")
    return ["GetJob after DeleteJob -> NotFound"]


def check_purge(cb, block, r):
    expect(r.ok().json() == {"deleted": "1"}, r.out)
    stats = cb.run("grpcurl -plaintext -d '{\"queue\": \"emails\"}' 127.0.0.1:50051 "
                   "jobq.v1.JobQueue/Stats").ok().json()
    q = stats["queues"][0]
    expect(q.get("pending") == "1" and "done" not in q and "failed" not in q, q)


def check_priority(cb, block, r):
    results = r.ok().json()["results"]
    expect([x["job"]["key"] for x in results] == ["report-2026-11", "reset-77"], results)
    expect("priority" not in results[0]["job"], results)
    expect(results[1]["job"].get("priority") == 10, results)
    # The cookbook says a Dequeue of `accounts` hands out the reset first.
    dq = cb.run("grpcurl -plaintext -d '{\"queues\": [\"accounts\"], \"worker_id\": "
                "\"cli-worker\"}' 127.0.0.1:50051 jobq.v1.JobQueue/Dequeue").ok().json()
    job = dq["leased"]["job"]
    expect(job["key"] == "reset-77" and job.get("priority") == 10, dq)
    return ["Dequeue -> the priority 10 job first"]


def check_debounce(cb, block, r):
    reply = r.ok().json()
    expect(reply.get("outcome") == "ENQUEUE_OUTCOME_REPLACED", reply)
    expect(not reply.get("created", False), reply)
    job = reply["job"]
    expect(job["key"] == "report-2026-11" and job["status"] == "JOB_STATUS_PENDING", job)
    got = cb.run("grpcurl -plaintext -d '{\"id\": \"" + job["id"] + "\"}' "
                 "127.0.0.1:50051 jobq.v1.JobQueue/GetJob").ok().json()
    expect(got.get("payload") == "eyJtb250aCI6IjIwMjYtMTEifQ==", got)
    return ["GetJob -> the replaced payload"]


def check_grouped_batch(cb, block, r):
    results = r.ok().json()["results"]
    expect([x["job"]["key"] for x in results] == ["import-1", "import-2"], results)
    expect(all(x["job"].get("group") == "customer-42" and x.get("created") for x in results),
           results)
    # The cookbook says: the first Dequeue hands out import-1, the second
    # nothing while it runs.
    dequeue = ("grpcurl -plaintext -d '{\"queues\": [\"imports\"], \"worker_id\": "
               "\"cli-worker\"}' 127.0.0.1:50051 jobq.v1.JobQueue/Dequeue")
    first = cb.run(dequeue).ok().json()
    expect(first["leased"]["job"]["key"] == "import-1", first)
    second = cb.run(dequeue).ok().json()
    expect(second == {}, f"the sequence handed out {second}")
    return ["Dequeue -> import-1", "Dequeue again -> {} (held)"]


def check_policy_stats(cb, block, r):
    q = r.ok().json()["queues"][0]
    expect(q["queue"] == "imports" and q.get("running") == "1" and q.get("pending") == "1", q)
    expect(q.get("policy") == {"maxRunning": 10, "groupMaxRunning": 1}, q)
    expect(q.get("heldGroupMaxRunning") == "1", q)


def check_get_policy(cb, block, r):
    expect(r.ok().json() == {"policy": {"maxRunning": 10, "groupMaxRunning": 1}}, r.out)


def check_create_schedule(cb, block, r):
    s = r.ok().json()["schedule"]
    expect(s["name"] == "nightly-report" and s["timezone"] == "Europe/Berlin", s)
    expect(s["cron"] == "0 3 * * *" and s.get("nextRunAt"), s)
    # The next 03:00 in Berlin is 01:00 or 02:00 UTC.
    expect(re.search(r"T0[12]:00:00Z$", s["nextRunAt"]), s)
    expect("lastRunAt" not in s, s)


def check_list_schedules(cb, block, r):
    schedules = r.ok().json()["schedules"]
    expect([s["name"] for s in schedules] == ["nightly-report"], schedules)
    expect(schedules[0].get("nextRunAt"), schedules)


def check_delete_schedule(cb, block, r):
    expect(r.ok().json() == {}, r.out)
    listed = cb.run("grpcurl -plaintext -d '{}' 127.0.0.1:50051 "
                    "jobq.v1.JobQueue/ListSchedules").ok().json()
    expect(listed == {}, f"still listed after delete: {listed}")
    again = cb.run(block)
    expect(again.rc != 0 and "NotFound" in again.err, f"second delete: {again.rc} {again.err}")
    return ["ListSchedules after delete -> {}", "DeleteSchedule again -> NotFound"]


STEPS = [
    ("list", check_list),
    ("describe jobq.v1.JobQueue", check_describe_service),
    ("describe jobq.v1.EnqueueRequest", check_describe_message),
    ("grpc.health.v1.Health/Check", check_health),
    ("jobq.v1.JobQueue/Enqueue", check_enqueue),
    ("jobq.v1.JobQueue/EnqueueBatch", check_enqueue_batch),
    ("jobq.v1.JobQueue/Dequeue", dequeue_check("order-4711")),
    ("jobq.v1.JobQueue/Heartbeat", check_heartbeat),
    ("jobq.v1.JobQueue/Ack", check_ack),
    ("jobq.v1.JobQueue/GetJob", check_get_job),
    ("jobq.v1.JobQueue/WatchJob", check_watch_job),
    ("jobq.v1.JobQueue/ListJobs", check_list_by_key),
    ("jobq.v1.JobQueue/Dequeue", dequeue_check("order-4712")),
    ("jobq.v1.JobQueue/Fail", check_fail),
    ("jobq.v1.JobQueue/ListJobs", check_list_failed),
    ("jobq.v1.JobQueue/Retry", check_retry),
    ("jobq.v1.JobQueue/Lease", check_lease),
    ("jobq.v1.JobQueue/Stats", check_stats),
    ("jobq.v1.JobQueue/CancelJob", check_cancel),
    ("jobq.v1.JobQueue/PauseQueue", check_empty_reply),
    ("jobq.v1.JobQueue/Stats", check_paused_stats),
    ("jobq.v1.JobQueue/ResumeQueue", check_resume),
    ("jobq.v1.JobQueue/DeleteJob", check_delete),
    ("jobq.v1.JobQueue/PurgeJobs", check_purge),
    ("jobq.v1.JobQueue/EnqueueBatch", check_priority),
    ("jobq.v1.JobQueue/Enqueue", check_debounce),
    ("jobq.v1.JobQueue/SetQueuePolicy", check_empty_reply),
    ("jobq.v1.JobQueue/EnqueueBatch", check_grouped_batch),
    ("jobq.v1.JobQueue/Stats", check_policy_stats),
    ("jobq.v1.JobQueue/GetQueuePolicy", check_get_policy),
    ("jobq.v1.JobQueue/CreateSchedule", check_create_schedule),
    ("jobq.v1.JobQueue/ListSchedules", check_list_schedules),
    ("jobq.v1.JobQueue/DeleteSchedule", check_delete_schedule),
]


def step_matches(block, marker):
    if marker == "list":
        return re.search(r"\slist\s*$", block) is not None
    return re.search(re.escape(marker) + r"(\s|$)", block) is not None


def start_server(tmp):
    log_path = os.path.join(tmp, "server.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [JOBQ_BIN, "serve", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
         "--data", os.path.join(tmp, "data")],
        stdout=log, stderr=log,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"jobq serving addr=(\S+)", open(log_path).read())
        if m:
            return proc, m.group(1), log_path
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("jobq serve did not start:\n" + open(log_path).read())


def main():
    blocks = extract_blocks(open(COOKBOOK).read())
    passed = failed = 0

    def report(ok, name, detail=""):
        nonlocal passed, failed
        if ok:
            passed += 1
            print(f"ok   {name}")
        else:
            failed += 1
            print(f"FAIL {name}\n     {detail}")

    # Static checks: every RPC and health has a command; only grpcurl calls
    # to the default address with -plaintext.
    joined = "\n".join(blocks)
    missing = [rpc for rpc in RPCS
               if not re.search(rf"jobq\.v1\.JobQueue/{rpc}(\s|$)", joined)]
    report(not missing, "every JobQueue RPC has a command", f"missing: {missing}")
    bad = [b for b in blocks if not (b.startswith("grpcurl -plaintext ") and DEFAULT_ADDR in b)]
    report(not bad, "every command is grpcurl -plaintext to " + DEFAULT_ADDR, f"{bad}")

    if len(blocks) != len(STEPS):
        report(False, "cookbook steps match the test's steps",
               f"the cookbook has {len(blocks)} commands, the test knows {len(STEPS)}")

    with tempfile.TemporaryDirectory(prefix="jobq-cookbook-") as tmp:
        proc, addr, log_path = start_server(tmp)
        try:
            cb = Cookbook(addr)
            for i, (block, (marker, check)) in enumerate(zip(blocks, STEPS), 1):
                first = block.splitlines()[0]
                name = f"step {i}: {marker}"
                if not step_matches(block, marker):
                    report(False, name, f"cookbook step {i} is `{first}`, expected {marker}")
                    break
                try:
                    r = cb.run(block)
                    extra = check(cb, block, r) or []
                except Exception as e:  # noqa: BLE001
                    detail = f"{type(e).__name__}: {e}"
                    if "r" in locals():
                        detail += f"\n     stdout: {r.out[-1500:]}\n     stderr: {r.err[-1500:]}"
                    report(False, name, detail)
                    break  # later steps depend on this one
                report(True, name)
                for x in extra:
                    report(True, f"step {i}: {x}")
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
            if failed:
                print("--- server log (tail):\n" + open(log_path).read()[-3000:])
    print(f"cookbook: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
