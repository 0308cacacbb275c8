"""End-to-end test of the Python client against a real `jobq serve`.

Run from the repo root with a Python that has the package installed
(`pip install ./clients/python`) and after `cargo build -p jobq-cli`:

    .venv/bin/python clients/python/tests/e2e_test.py

Every producer and worker is a separate Python process, so one can be
SIGKILLed. Prints `python-e2e: N passed, M failed` and exits non-zero on a
failure. JOBQ_BIN overrides the server binary (default target/debug/jobq).
"""

import os
import signal
import subprocess
import sys
import threading
import time

from harness import EXAMPLES, JOBQ_BIN, Server, lines, outcomes, run_tests, start_worker, wait_for
from jobq import Client, JobContext, pb


def kill_one_worker(tmp, client, addr):
    """100 jobs, two workers with capacity 5 and a 60 s lease; one is
    SIGKILLed mid-way. All 100 end DONE well before any lease could expire,
    so the killed worker's jobs came back because its stream dropped."""
    subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "producer.py"), "--server", addr,
         "--count", "100"],
        check=True, timeout=60,
    )
    stats = client.stats("emails")["emails"]
    assert stats["pending"] == 100, stats

    common = ["--capacity", "5", "--lease", "60", "--work", "0.2",
              "--fail-first-attempt-every", "10"]
    victim, victim_log = start_worker(tmp, addr, "py-worker-1", *common)
    survivor, survivor_log = start_worker(tmp, addr, "py-worker-2", *common)
    procs = [victim, survivor]
    try:
        wait_for(lambda: len(lines(victim_log)) >= 15, 30, "py-worker-1 to handle 15 jobs")
        held = [j.id for j in client.list_jobs("emails", "RUNNING")
                if j.worker_id == "py-worker-1"]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        killed_at = time.monotonic()

        wait_for(lambda: client.stats("emails")["emails"]["done"] == 100, 20,
                 "all 100 jobs DONE within 20s of the kill (lease is 60s)")
        took = time.monotonic() - killed_at
        assert survivor.poll() is None, "the surviving worker exited"

        jobs = list(client.list_jobs("emails"))
        assert len(jobs) == 100, len(jobs)
        not_done = [j.id for j in jobs if j.status != pb.JOB_STATUS_DONE]
        assert not not_done, f"not DONE: {not_done}"
        stats = client.stats("emails")["emails"].counts()
        assert stats == {"pending": 0, "running": 0, "done": 100, "failed": 0}, stats

        disconnected = [j for j in jobs if "ATTEMPT_OUTCOME_WORKER_DISCONNECTED" in outcomes(j)]
        assert disconnected, "no job was reclaimed from the killed worker"
        for j in disconnected:
            assert j.history[0].worker_id == "py-worker-1", (j.id, j.history[0].worker_id)
            assert j.history[-1].worker_id == "py-worker-2", (j.id, j.history[-1].worker_id)
        assert held, "py-worker-1 held no job when it was killed"
        assert not [j.id for j in jobs if "ATTEMPT_OUTCOME_LEASE_EXPIRED" in outcomes(j)]

        # Orders 10, 20, ... fail their first attempt (unless that attempt
        # was on the killed worker), are retried after the backoff, and acked.
        failed_once = [j for j in jobs if "ATTEMPT_OUTCOME_FAILED" in outcomes(j)]
        for j in jobs:
            order = int(j.key.removeprefix("order-"))
            want_first = ("ATTEMPT_OUTCOME_FAILED", "ATTEMPT_OUTCOME_WORKER_DISCONNECTED")
            if order % 10 == 0:
                assert outcomes(j)[0] in want_first, (j.key, outcomes(j))
            else:
                assert "ATTEMPT_OUTCOME_FAILED" not in outcomes(j), (j.key, outcomes(j))
            assert outcomes(j)[-1] == "ATTEMPT_OUTCOME_ACKED", (j.key, outcomes(j))
        assert len(failed_once) >= 5, [j.key for j in failed_once]
        for j in failed_once:
            failed = [a for a in j.history if a.outcome == pb.ATTEMPT_OUTCOME_FAILED]
            assert failed[0].error.startswith("RuntimeError: mail server busy"), failed[0].error
        print(f"  100 DONE {took:.1f}s after the kill; {len(disconnected)} reclaimed "
              f"from the killed worker, {len(failed_once)} failed once and retried")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def heartbeat_keeps_lease(tmp, client, addr):
    """A 6 s job under a 1.5 s lease stays with its worker: heartbeats every
    lease/3 extend it, so it is DONE on its first attempt."""
    job, created = client.enqueue("slow", "send-email", b'{"order": 1}', key="order-1")
    assert created
    w, log = start_worker(tmp, addr, "py-slow", "--queue", "slow", "--capacity", "1",
                          "--lease", "1.5", "--work", "6")
    try:
        wait_for(lambda: client.get_job(job.id).status == pb.JOB_STATUS_DONE, 20,
                 "the slow job to be DONE")
        j = client.get_job(job.id)
        assert j.attempts == 0, j
        assert outcomes(j) == ["ATTEMPT_OUTCOME_ACKED"], outcomes(j)
        assert lines(log) == [f"{job.id} 1"], lines(log)
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


def sigterm_drains(tmp, client, addr):
    """SIGTERM: the worker takes no new job, finishes and acks what it holds,
    then exits 0; nothing is reclaimed."""
    ids = [client.enqueue("drain", "send-email", f'{{"order": {i}}}'.encode())[0].id
           for i in range(1, 6)]
    w, log = start_worker(tmp, addr, "py-drain", "--queue", "drain", "--capacity", "3",
                          "--lease", "30", "--work", "1.5")
    try:
        wait_for(lambda: client.stats("drain")["drain"]["running"] == 3, 20,
                 "3 jobs RUNNING")
        w.send_signal(signal.SIGTERM)
        assert w.wait(15) == 0, "worker did not exit 0 after SIGTERM"
        st = client.stats("drain")["drain"].counts()
        assert st == {"pending": 2, "running": 0, "done": 3, "failed": 0}, st
        for jid in ids:
            j = client.get_job(jid)
            assert j.attempts == 0, (jid, outcomes(j))
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


def trace_follows_the_job(tmp, client, addr):
    """Metadata is stored with the job; with opentelemetry installed the
    producer's span travels in it and the worker's handler span (on every
    delivery) is its child, in the same trace."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from jobq import Worker

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("e2e")
    with tracer.start_as_current_span("checkout") as producer:
        job, _ = client.enqueue("traced", "send-email", b"{}", metadata={"request-id": "r-1"})
    ctx = producer.get_span_context()
    assert job.metadata["request-id"] == "r-1", job.metadata
    assert f"{ctx.trace_id:032x}" in job.metadata["traceparent"], job.metadata
    # Every call also carries the caller's trace context as gRPC headers,
    # for the server's span of the call (as the Rust client does).
    with tracer.start_as_current_span("stats") as call:
        headers = dict(client._md)
        client.stats("traced")
    assert f"{call.get_span_context().trace_id:032x}" in headers["traceparent"], headers
    assert "traceparent" not in dict(client._md), "no span, no header"

    runs = []

    def handler(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise RuntimeError("smtp timeout")  # redelivered after the backoff

    worker = Worker(client, ["traced"], handler, capacity=1, lease=10)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_for(lambda: client.get_job(job.id).status == pb.JOB_STATUS_DONE, 30,
                 "the traced job to be DONE on its second run")
    finally:
        worker.stop()
        t.join(15)
    spans = [s for s in exporter.get_finished_spans() if s.name == "job"]
    assert len(spans) == 2, [s.name for s in exporter.get_finished_spans()]
    for s in spans:
        assert s.context.trace_id == ctx.trace_id, s
        assert s.parent is not None and s.parent.span_id == ctx.span_id, s
    assert sorted(s.attributes["job.attempt"] for s in spans) == [1, 2]
    assert runs == [1, 2], runs


def tokens(tmp, client, addr):
    """A server with --auth-tokens: no token is UNAUTHENTICATED, a token
    outside its queues PERMISSION_DENIED; a worker with a consume token
    runs what a producer token enqueued."""
    import grpc
    import json

    def new_token(name, roles, queues):
        out = subprocess.run(
            [JOBQ_BIN, "--json", "token", "new", name, "--roles", roles, "--queues", queues],
            check=True, capture_output=True, text=True, timeout=30,
        ).stdout
        return json.loads(out)

    producer = new_token("producer", "produce,read", "emails")
    worker = new_token("worker", "consume", "emails")
    path = os.path.join(tmp, "tokens.toml")
    with open(path, "w") as f:
        f.write(producer["toml"] + "\n" + worker["toml"])
    server = Server(tmp, "--auth-tokens", path, name="token-server")
    anon = Client(server.addr)
    mine = Client(server.addr, token=producer["secret"])
    proc = None
    try:
        anon.wait_ready()
        try:
            anon.stats()
            raise AssertionError("a call without a token was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
        try:
            mine.enqueue("billing", "send-email", b"{}")
            raise AssertionError("a token outside its queues was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED, e
        for order in range(5):
            mine.enqueue("emails", "send-email", json.dumps({"order": order}).encode(),
                         key=f"order-{order}")
        proc, log = start_worker(tmp, server.addr, "py-token-worker", "--token", worker["secret"])
        wait_for(lambda: mine.stats("emails")["emails"]["done"] == 5, 30,
                 "the token worker to finish 5 jobs")
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        anon.close()
        mine.close()
        server.stop()


def make_pki(tmp):
    """A throwaway CA and a server certificate for localhost/127.0.0.1,
    made with the openssl command line; returns (ca, cert, key) paths."""
    ca_key, ca = os.path.join(tmp, "ca.key"), os.path.join(tmp, "ca.pem")
    key, csr, cert = (os.path.join(tmp, n) for n in ("server.key", "server.csr", "server.pem"))
    ext = os.path.join(tmp, "san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True, timeout=60)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=jobq py test CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=localhost")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext)
    return ca, cert, key


def tls_and_token(tmp, client, addr):
    """A server with TLS and tokens: the client with the CA and a token
    works; without the CA, or over plaintext, it does not."""
    import grpc
    import json

    ca, cert, key = make_pki(tmp)
    out = subprocess.run(
        [JOBQ_BIN, "--json", "token", "new", "py", "--roles", "admin", "--queues", "*"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout
    token = json.loads(out)
    path = os.path.join(tmp, "tls-tokens.toml")
    with open(path, "w") as f:
        f.write(token["toml"])
    server = Server(tmp, "--tls-cert", cert, "--tls-key", key, "--auth-tokens", path,
                    name="tls-server")
    port = server.addr.rsplit(":", 1)[1]
    good = Client(f"https://localhost:{port}", token=token["secret"],
                  root_certificates=open(ca, "rb").read())
    untrusted = Client(f"https://localhost:{port}", token=token["secret"], timeout=5)
    plain = Client(server.addr, token=token["secret"], timeout=5)
    try:
        good.wait_ready()
        job, _ = good.enqueue("tls", "k", b"over tls")
        assert good.get_job(job.id).payload == b"over tls"
        for bad in (untrusted, plain):
            try:
                bad.stats()
                raise AssertionError("a call without the server's CA went through")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e

        async def over_aio():
            from jobq.aio import AsyncClient
            async with AsyncClient(f"https://localhost:{port}", token=token["secret"],
                                   root_certificates=open(ca, "rb").read()) as aio:
                j, _ = await aio.enqueue("tls", "k", b"over aio tls")
                assert (await aio.get_job(j.id)).payload == b"over aio tls"
        import asyncio
        asyncio.run(over_aio())
    finally:
        for c in (good, untrusted, plain):
            c.close()
        server.stop()


def operator_calls(tmp, client, addr):
    """cancel, pause/resume, delete and purge through the Python Client."""
    import grpc

    a = client.enqueue("ops", "send-email", b"a")[0]
    b = client.enqueue("ops", "send-email", b"b")[0]
    cancelled = client.cancel_job(a.id, "refunded")
    assert cancelled.status == pb.JOB_STATUS_FAILED, cancelled
    assert cancelled.last_error == "cancelled: refunded", cancelled
    client.pause_queue("ops")
    assert client.paused("ops")
    assert client.dequeue(["ops"], "py-ops") is None
    client.resume_queue("ops")
    assert not client.paused("ops")
    leased = client.dequeue(["ops"], "py-ops")
    assert leased is not None and leased.job.id == b.id, leased
    try:
        client.delete_job(b.id)
        raise AssertionError("a RUNNING job was deleted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
    assert client.purge_jobs("ops", "FAILED") == 1
    c = client.enqueue("ops", "send-email", b"c")[0]
    client.delete_job(c.id)
    try:
        client.get_job(c.id)
        raise AssertionError("a deleted job was found")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e


def schedules(tmp, client, addr):
    """create/list/delete a schedule through the sync and asyncio clients;
    its first tick lands as one job keyed schedule:<name>:<tick>."""
    import asyncio

    import grpc
    from jobq.aio import AsyncClient

    s = client.create_schedule("py-every-second", "py-sched", "tick", "*/1 * * * * *",
                               payload=b"{}", max_attempts=2)
    assert s.timezone == "UTC" and s.next_run_at is not None, s
    assert [x.name for x in client.list_schedules()] == ["py-every-second"]
    deadline = time.time() + 15
    keys: list = []
    while time.time() < deadline and not keys:
        keys = [j.key for j in client.list_jobs("py-sched")]
        time.sleep(0.1)
    assert keys and all(k.startswith("schedule:py-every-second:") for k in keys), keys
    client.delete_schedule("py-every-second")
    assert client.list_schedules() == []
    try:
        client.delete_schedule("py-every-second")
        raise AssertionError("a deleted schedule was deleted again")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
    try:
        client.create_schedule("bad", "py-sched", "tick", "every day")
        raise AssertionError("a bad cron expression was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e

    async def via_aio() -> None:
        ac = AsyncClient("http://" + addr)
        try:
            made = await ac.create_schedule("py-nightly", "py-sched", "report", "0 3 * * *",
                                            timezone="Europe/Berlin")
            assert made.timezone == "Europe/Berlin", made
            assert [x.name for x in await ac.list_schedules()] == ["py-nightly"]
            await ac.delete_schedule("py-nightly")
            assert await ac.list_schedules() == []
        finally:
            await ac.close()

    asyncio.run(via_aio())


def server_urls(tmp, client, addr):
    """A URL without a port means the scheme's, as in the Rust client."""
    from jobq._common import parse_server
    assert parse_server("http://jobs.internal") == ("jobs.internal:80", False)
    assert parse_server("https://jobs.internal/") == ("jobs.internal:443", True)
    assert parse_server("jobs.internal") == ("jobs.internal:80", False)
    assert parse_server("https://[::1]") == ("[::1]:443", True)
    assert parse_server("http://[::1]:50051") == ("[::1]:50051", False)
    assert parse_server("https://jobs.internal:8443") == ("jobs.internal:8443", True)
    assert parse_server("http://" + addr) == (addr, False)


def token_in_clear(tmp, client, addr):
    """A token goes over plaintext only to this machine: to another host it
    is a ValueError when the client is created, before anything is sent,
    unless insecure=True. 0.0.0.0 is not a loopback address, but Linux
    delivers connections to it locally: with insecure=True the same real
    server answers."""
    import asyncio
    from jobq.aio import AsyncClient
    port = addr.rsplit(":", 1)[1]
    remote = f"http://0.0.0.0:{port}"
    for server in (remote, f"0.0.0.0:{port}", "http://jobs.internal:50051",
                   "http://192.0.2.1:50051", "http://[2001:db8::1]:50051"):
        for make in (Client, AsyncClient):
            try:
                make(server, token="s3cret")
                raise AssertionError(f"{make.__name__}({server!r}) took a token over plaintext")
            except ValueError as e:
                assert "refusing to send the token in clear" in str(e), e
                assert "insecure=True" in str(e), e
                assert "s3cret" not in str(e), e
    # From $JOBQ_TOKEN too.
    os.environ["JOBQ_TOKEN"] = "s3cret"
    try:
        try:
            Client(remote)
            raise AssertionError("$JOBQ_TOKEN went over plaintext")
        except ValueError as e:
            assert "refusing to send the token in clear" in str(e), e
    finally:
        del os.environ["JOBQ_TOKEN"]
    # Said so, to this machine, over TLS, or without a token: no refusal.
    with Client(remote, token="s3cret", insecure=True) as allowed:
        allowed.wait_ready()
        job, _ = allowed.enqueue("in-clear", "k", b"x")
        assert allowed.get_job(job.id).queue == "in-clear"

    async def over_aio():
        async with AsyncClient(remote, token="s3cret", insecure=True) as aio:
            await aio.wait_ready()
            assert "in-clear" in await aio.stats("in-clear")
    asyncio.run(over_aio())
    for server in (f"http://127.0.0.1:{port}", f"http://127.1.2.3:{port}",
                   f"http://localhost:{port}", f"http://[::1]:{port}",
                   "https://jobs.internal:50051"):
        Client(server, token="s3cret").close()
    Client(remote).close()


TESTS = [server_urls, token_in_clear, kill_one_worker, heartbeat_keeps_lease, sigterm_drains, trace_follows_the_job, tokens,
         tls_and_token, operator_calls, schedules]


if __name__ == "__main__":
    sys.exit(run_tests("python-e2e", TESTS))
