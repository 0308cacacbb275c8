"""The Python Worker behaves as the Rust Worker (crates/client/src/worker.rs),
each case against a real `jobq serve`:

- `ctx.attempt` is 1-based; the handler gets a JobContext;
- a kind with no handler fails *retryably*;
- a bare str for queues, or a client of the wrong kind, is a TypeError
  before anything is sent;
- `JOBQ_SERVER` is read as the CLI's http://host:port URL;
- CancelJob on a running job: the handler's ctx.cancelled is set within
  1 s, the late ack is ABORTED (JobLost), history says REVOKED, Retry
  brings the job back;
- an ack that cannot reach a server restarting for 3 s, three times the
  lease, is retried until it lands: the job runs once;
- a handler whose lease deadline passed while heartbeats could not get
  through is told to stop, and its job is not acked;
- SIGINT (Ctrl-C) and SIGTERM drain a worker process (sync and asyncio):
  exit 0, no traceback, no job reclaimed;
- the asyncio client and worker, on grpc.aio: the same, and a revoked job's
  handler task is cancelled within 1 s.

    .venv/bin/python clients/python/tests/parity_test.py   # after pip install ./clients/python
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List

import grpc
import grpc.aio

from harness import EXAMPLES, Server, lines, outcomes, run_tests, start_worker, wait_for
from jobq import (AsyncJobContext, Client, InvalidArgument, JobContext, JobLost, Status, Worker,
                  pb)
from jobq.aio import AsyncClient, AsyncWorker


class Captured(logging.Handler):
    """The jobq logger's messages, to wait on what the worker did."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: List[str] = []
        logging.getLogger("jobq").addHandler(self)
        logging.getLogger("jobq").setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in m for m in list(self.messages))

    def close(self) -> None:
        logging.getLogger("jobq").removeHandler(self)
        super().close()


class Running:
    """A Worker on a thread, stopped (drained) on exit."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"


def attempt_is_one_based(tmp, client, addr):
    seen: List[JobContext] = []

    def handler(ctx: JobContext) -> None:
        seen.append(ctx)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    job, _ = client.enqueue("attempts", "k", b'{"n": 1}', key="one")
    with Running(Worker(client, ["attempts"], handler, lease=10)):
        wait_for(lambda: client.get_job(job.id).status == pb.JOB_STATUS_DONE, 30,
                 "the job DONE on its second run")
    assert [c.attempt for c in seen] == [1, 2], [c.attempt for c in seen]
    ctx = seen[0]
    assert (ctx.id, ctx.queue, ctx.kind, ctx.key) == (job.id, "attempts", "k", "one"), ctx
    assert ctx.json() == {"n": 1} and ctx.payload == b'{"n": 1}'
    assert ctx.lease_id and ctx.lease_expires_at.timestamp() > time.time() - 60
    assert not ctx.is_cancelled()


def unknown_kind_is_retryable(tmp, client, addr):
    job, _ = client.enqueue("rolling", "new-kind", b"", max_attempts=5)
    with Running(Worker(client, ["rolling"], {"old-kind": lambda ctx: None}, lease=10)):
        wait_for(lambda: len(client.get_job(job.id).history) >= 1
                 and client.get_job(job.id).status != pb.JOB_STATUS_RUNNING, 20,
                 "the first attempt to end")
    j = client.get_job(job.id)
    assert outcomes(j)[0] == "ATTEMPT_OUTCOME_FAILED", outcomes(j)
    assert j.status == pb.JOB_STATUS_PENDING, (pb.JobStatus.Name(j.status), j.last_error)
    assert "no handler for kind 'new-kind'" in j.last_error, j.last_error
    client.cancel_job(job.id, "test over")


def wrong_arguments_are_refused(tmp, client, addr):
    before = client.stats()
    for bad in ("email", b"email", ["email", 3]):
        try:
            Worker(client, bad, lambda ctx: None)  # type: ignore[arg-type]
            raise AssertionError(f"Worker took queues={bad!r}")
        except TypeError as e:
            assert "queues" in str(e), e

    async def aio_channel_to_sync_client() -> None:
        channel = grpc.aio.insecure_channel(addr)
        try:
            Client(channel=channel)  # type: ignore[arg-type]
            raise AssertionError("Client took a grpc.aio channel")
        except TypeError as e:
            assert "AsyncClient" in str(e), e
        finally:
            await channel.close()
        sync_channel = grpc.insecure_channel(addr)
        try:
            AsyncClient(channel=sync_channel)  # type: ignore[arg-type]
            raise AssertionError("AsyncClient took a blocking channel")
        except TypeError:
            pass
        finally:
            sync_channel.close()
        aclient = AsyncClient("http://" + addr)
        try:
            try:
                Worker(aclient, ["q"], lambda ctx: None)  # type: ignore[arg-type]
                raise AssertionError("Worker took an AsyncClient")
            except TypeError:
                pass
        finally:
            await aclient.close()

    asyncio.run(aio_channel_to_sync_client())
    try:
        Client("ftp://" + addr)
        raise AssertionError("an ftp:// server was taken")
    except ValueError as e:
        assert "http://" in str(e), e
    if "priority" not in pb.EnqueueRequest.DESCRIPTOR.fields_by_name:
        try:
            client.enqueue("prio", "k", b"", priority=5)
            raise AssertionError("a priority was dropped silently")
        except ValueError as e:
            assert "priority" in str(e), e
    assert client.stats() == before, "something was sent"


def jobq_server_env(tmp, client, addr):
    old = os.environ.get("JOBQ_SERVER")
    os.environ["JOBQ_SERVER"] = "http://" + addr
    try:
        with Client() as from_env:
            job, _ = from_env.enqueue("env", "k", b"")
            assert client.get_job(job.id).queue == "env"
    finally:
        if old is None:
            del os.environ["JOBQ_SERVER"]
        else:
            os.environ["JOBQ_SERVER"] = old
    env = dict(os.environ, JOBQ_SERVER="http://" + addr)
    subprocess.run([sys.executable, os.path.join(EXAMPLES, "producer.py"), "--queue",
                    "env-producer", "--count", "3"], check=True, timeout=60, env=env)
    assert client.stats("env-producer")["env-producer"]["pending"] == 3


def cancel_revokes_the_running_handler(tmp, client, addr):
    runs: List[Dict[str, object]] = []
    started = threading.Event()

    def handler(ctx: JobContext) -> None:
        run: Dict[str, object] = {"attempt": ctx.attempt, "lease": ctx.lease_id}
        runs.append(run)
        if len(runs) > 1:
            return  # after Retry: done
        started.set()
        if ctx.cancelled.wait(30):
            run["cancelled_at"] = time.monotonic()
            run["reason"] = ctx.cancel_reason

    job, _ = client.enqueue("cancel", "k", b"")
    with Running(Worker(client, ["cancel"], handler, lease=30)):
        assert started.wait(20), "the handler did not start"
        t0 = time.monotonic()
        cancelled = client.cancel_job(job.id, "refunded")
        assert cancelled.last_error == "cancelled: refunded", cancelled
        wait_for(lambda: "cancelled_at" in runs[0], 5, "the handler to see the cancellation")
        took = float(runs[0]["cancelled_at"]) - t0  # type: ignore[arg-type]
        assert took < 1.0, f"cancellation seen after {took:.2f}s"
        # The operator's words after one prefix, as last_error has them.
        assert runs[0]["reason"] == "cancelled: refunded", runs[0]
        try:
            client.ack(job.id, str(runs[0]["lease"]))
            raise AssertionError("the late ack was accepted")
        except JobLost:
            pass
        j = client.get_job(job.id)
        assert j.status == pb.JOB_STATUS_FAILED, j
        assert outcomes(j) == ["ATTEMPT_OUTCOME_REVOKED"], outcomes(j)
        client.retry(job.id)
        wait_for(lambda: client.get_job(job.id).status == pb.JOB_STATUS_DONE, 20,
                 "the retried job DONE")
    assert [r["attempt"] for r in runs] == [1, 1], runs
    assert outcomes(client.get_job(job.id))[-1] == "ATTEMPT_OUTCOME_ACKED"
    print(f"  cancellation seen by the handler {took * 1000:.0f} ms after CancelJob")


def ack_survives_a_server_restart(tmp, client, addr):
    # A grace well past the 1 s lease: the worker's channel may take a few
    # seconds of gRPC reconnect backoff to notice the server is back.
    server = Server(tmp, "--restart-grace", "30s", name="restart")
    log = Captured()
    own = Client(server.url)
    release, started = threading.Event(), threading.Event()
    runs: List[int] = []

    def handler(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        started.set()
        release.wait(60)

    try:
        own.wait_ready()
        job, _ = own.enqueue("restart", "k", b"")
        # A 1 s lease and 3 s of downtime: the ack outlives the lease's
        # deadline on the worker's clock, and still lands (restart grace).
        with Running(Worker(own, ["restart"], handler, lease=1)):
            assert started.wait(20)
            # The take is made durable by the next flush round (a take lost
            # in a crash only means a redelivery): an enqueue, durable when
            # it answers, makes sure that round has happened before the kill.
            own.enqueue("restart-flush", "k", b"")
            server.kill()
            killed = time.monotonic()
            release.set()  # the handler returns while the server is down
            wait_for(lambda: log.count("ack/fail did not reach the server") >= 2
                     and time.monotonic() - killed >= 3, 30,
                     "3 s of downtime with the ack failing")
            server.restart()
            wait_for(lambda: _sync_status(own, job.id) == pb.JOB_STATUS_DONE, 30,
                     "the ack to land after the restart")
        j = own.get_job(job.id)
        assert outcomes(j) == ["ATTEMPT_OUTCOME_ACKED"], outcomes(j)
        assert runs == [1], runs
        print(f"  ack retried {log.count('ack/fail did not reach the server')} times "
              f"over {time.monotonic() - killed:.1f}s, landed once")
    finally:
        log.close()
        own.close()
        server.stop()


def lease_deadline_stops_the_handler(tmp, client, addr):
    server = Server(tmp, name="deadline")
    log = Captured()
    own = Client(server.url)
    started = threading.Event()
    seen: Dict[str, object] = {}

    def handler(ctx: JobContext) -> None:
        started.set()
        if ctx.cancelled.wait(60):
            seen["at"] = time.monotonic()
            seen["reason"] = ctx.cancel_reason

    try:
        own.wait_ready()
        own.enqueue("deadline", "k", b"")
        with Running(Worker(own, ["deadline"], handler, lease=2)):
            assert started.wait(20)
            server.kill()
            killed = time.monotonic()
            wait_for(lambda: "at" in seen, 15, "the handler to be told to stop")
            took = float(seen["at"]) - killed  # type: ignore[arg-type]
            assert "deadline" in str(seen["reason"]), seen
            # Lease 2 s from the last heartbeat that got through; slack for a loaded box.
            assert took <= 2 + 3, f"told to stop {took:.1f}s after the server went away"
        settled = [m for m in log.messages if m.startswith("job ")
                   and (m.endswith(": acked") or ": failed (" in m)]
        assert not settled, settled
        print(f"  handler told to stop {took:.1f}s after the server died (lease 2s)")
    finally:
        log.close()
        own.close()
        server.stop()


def _drain_on(sig: signal.Signals, tmp, client, addr, script: str = "worker.py"):
    queue = f"drain-{sig.name.lower()}-{script.split('.')[0].replace('_', '-')}"
    for i in range(60):
        client.enqueue(queue, "send-email", f'{{"order": {i}}}'.encode())
    proc, log = start_worker(tmp, addr, f"py-{queue}", "--queue", queue, "--capacity", "5",
                             "--work", "0.05", "--lease", "30", script=script)
    try:
        wait_for(lambda: len(lines(log)) >= 10, 30, "10 jobs handled")
        proc.send_signal(sig)
        assert proc.wait(20) == 0, f"worker did not exit 0 after {sig.name}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = open(os.path.join(tmp, f"py-{queue}.out")).read()
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-2000:]
    jobs = list(client.list_jobs(queue))
    done = [j for j in jobs if j.status == pb.JOB_STATUS_DONE]
    for j in jobs:
        assert outcomes(j) in ([], ["ATTEMPT_OUTCOME_ACKED"]), (j.id, outcomes(j))
        assert j.status in (pb.JOB_STATUS_PENDING, pb.JOB_STATUS_DONE), j
    assert len(done) == len(lines(log)), (len(done), len(lines(log)))
    print(f"  {script} {sig.name}: {len(done)} done, {len(jobs) - len(done)} untouched, none reclaimed")


def sigint_drains(tmp, client, addr):
    _drain_on(signal.SIGINT, tmp, client, addr)


def sigterm_drains(tmp, client, addr):
    _drain_on(signal.SIGTERM, tmp, client, addr)


def asyncio_sigint_drains(tmp, client, addr):
    _drain_on(signal.SIGINT, tmp, client, addr, script="async_worker.py")


def asyncio_sigterm_drains(tmp, client, addr):
    _drain_on(signal.SIGTERM, tmp, client, addr, script="async_worker.py")


def asyncio_client_and_worker(tmp, client, addr):
    async def main() -> None:
        async with AsyncClient("http://" + addr) as aio:
            await aio.wait_ready()
            attempts: Dict[str, List[int]] = {}
            started = asyncio.Event()
            seen: Dict[str, object] = {}

            async def work(ctx: AsyncJobContext) -> None:
                attempts.setdefault(ctx.key or "", []).append(ctx.attempt)
                if ctx.key == "flaky" and ctx.attempt == 1:
                    raise RuntimeError("first attempt fails")
                if ctx.key == "long":
                    started.set()
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        seen["at"] = time.monotonic()
                        seen["flag"] = ctx.is_cancelled()
                        raise
                await asyncio.sleep(0.01)

            ids = [(await aio.enqueue("aio", "k", b"", key=k))[0].id
                   for k in ("a", "b", "c", "flaky")]
            worker = AsyncWorker(aio, ["aio"], {"k": work}, capacity=3, lease=10)
            running = asyncio.ensure_future(worker.run())
            deadline = time.monotonic() + 30
            while (await aio.stats("aio"))["aio"]["done"] < 4:
                assert time.monotonic() < deadline, await aio.stats("aio")
                await asyncio.sleep(0.05)
            assert attempts == {"a": [1], "b": [1], "c": [1], "flaky": [1, 2]}, attempts

            long_job, _ = await aio.enqueue("aio", "k", b"", key="long")
            await asyncio.wait_for(started.wait(), 20)
            t0 = time.monotonic()
            await aio.cancel_job(long_job.id, "no longer wanted")
            while "at" not in seen:
                assert time.monotonic() - t0 < 5, "the handler task was not cancelled"
                await asyncio.sleep(0.01)
            took = float(seen["at"]) - t0  # type: ignore[arg-type]
            assert took < 1.0 and seen["flag"] is True, (took, seen)
            worker.stop()
            await asyncio.wait_for(running, 30)
            j = await aio.get_job(long_job.id)
            assert outcomes(j) == ["ATTEMPT_OUTCOME_REVOKED"], outcomes(j)
            for jid in ids:
                assert (await aio.get_job(jid)).status == pb.JOB_STATUS_DONE
            names = [j.key async for j in aio.list_jobs("aio", "DONE")]
            assert sorted(names) == ["a", "b", "c", "flaky"], names
            print(f"  async handler task cancelled {took * 1000:.0f} ms after CancelJob")

    asyncio.run(main())


def asyncio_ack_survives_a_server_restart(tmp, client, addr):
    server = Server(tmp, "--restart-grace", "30s", name="aio-restart")
    log = Captured()

    async def main() -> None:
        release, started = asyncio.Event(), asyncio.Event()

        async def handler(ctx: AsyncJobContext) -> None:
            started.set()
            await release.wait()

        async with AsyncClient(server.url) as aio:
            await aio.wait_ready()
            job, _ = await aio.enqueue("restart", "k", b"")
            worker = AsyncWorker(aio, ["restart"], handler, lease=1)
            running = asyncio.ensure_future(worker.run(handle_signals=False))
            await asyncio.wait_for(started.wait(), 20)
            server.kill()
            killed = time.monotonic()
            release.set()
            while not (log.count("ack/fail did not reach the server") >= 2
                       and time.monotonic() - killed >= 3):
                assert time.monotonic() - killed < 30
                await asyncio.sleep(0.05)
            server.restart()
            while (await _status(aio, job.id)) != pb.JOB_STATUS_DONE:
                assert time.monotonic() - killed < 60, "the ack did not land"
                await asyncio.sleep(0.1)
            worker.stop()
            await asyncio.wait_for(running, 30)
            assert outcomes(await aio.get_job(job.id)) == ["ATTEMPT_OUTCOME_ACKED"]

    try:
        asyncio.run(main())
    finally:
        log.close()
        server.stop()


def _sync_status(client: Client, job_id: str) -> int:
    try:
        return client.get_job(job_id).status
    except grpc.RpcError:  # the server is still coming back
        return -1


async def _status(aio: AsyncClient, job_id: str) -> int:
    try:
        return (await aio.get_job(job_id)).status
    except grpc.RpcError:  # a JobqError: the server is still coming back
        return -1


def drain_deadline_gives_the_job_back(tmp, client, addr):
    """A handler still running at the drain deadline is told to stop, and
    its job is given back at once (a snooze of zero): PENDING again, no
    attempt spent, its history saying SNOOZED, as in the Rust worker; and
    the handler's return afterwards acks nothing. The same for asyncio."""
    job, _ = client.enqueue("drain-deadline", "k", b"")
    started = threading.Event()

    def handler(ctx: JobContext) -> None:
        started.set()
        ctx.cancelled.wait(30)  # returns as soon as it is told to stop

    worker = Worker(client, ["drain-deadline"], handler, lease=30, drain_timeout=0.5)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert started.wait(15), "the handler never started"
    worker.stop()
    thread.join(30)
    assert not thread.is_alive(), "the worker did not stop"
    j = client.get_job(job.id)
    assert (pb.JobStatus.Name(j.status), outcomes(j), j.attempts, j.snoozes) == (
        "JOB_STATUS_PENDING", ["ATTEMPT_OUTCOME_SNOOZED"], 0, 1), j
    assert "drain deadline" in j.history[-1].error, j.history[-1].error
    client.cancel_job(job.id, "test over")

    async def main() -> None:
        async with AsyncClient("http://" + addr) as aio:
            job, _ = await aio.enqueue("drain-deadline-aio", "k")
            began = asyncio.Event()

            async def handler(ctx: AsyncJobContext) -> None:
                began.set()
                await ctx.cancelled.wait()

            worker = AsyncWorker(aio, ["drain-deadline-aio"], handler, lease=30,
                                 drain_timeout=0.5)
            running = asyncio.create_task(worker.run(handle_signals=False))
            await asyncio.wait_for(began.wait(), 15)
            worker.stop()
            await asyncio.wait_for(running, 30)
            got = await aio.get_job(job.id)
            assert (got.status, got.attempts, got.snoozes) == (Status.PENDING, 0, 1), got
            await aio.cancel_job(job.id, "test over")

    asyncio.run(main())


def odd_handler_errors_fail_the_job(tmp, client, addr):
    """As the Rust worker fails a handler that panicked: a handler that
    calls sys.exit, raises an error whose message cannot be read, or one
    with a lone surrogate (a file name that is not UTF-8) fails its job;
    none stays RUNNING with the worker's only slot."""

    class Unreadable(Exception):
        def __str__(self) -> str:
            raise ValueError("no message")

    def handler(ctx: JobContext) -> None:
        if ctx.key == "exit":
            sys.exit(3)
        if ctx.key == "unreadable":
            raise Unreadable()
        raise RuntimeError("cannot read /tmp/caf\udce9")

    jobs = [client.enqueue("odd", "k", b"", key=k, max_attempts=1)[0]
            for k in ("exit", "unreadable", "surrogate")]
    with Running(Worker(client, ["odd"], handler, capacity=1, lease=10)):
        wait_for(lambda: all(client.get_job(j.id).status == pb.JOB_STATUS_FAILED
                             for j in jobs), 30, "every job FAILED")
    errors = [client.get_job(j.id).last_error for j in jobs]
    assert errors[0] == "SystemExit: 3", errors
    assert errors[1] == "Unreadable (its message could not be read)", errors
    assert errors[2] == "RuntimeError: cannot read /tmp/caf\\udce9", errors

    async def cancelled_inside() -> None:
        aio = AsyncClient("http://" + addr)
        try:
            async def work(ctx: AsyncJobContext) -> None:
                inner = asyncio.ensure_future(asyncio.sleep(60))
                asyncio.get_running_loop().call_later(0.05, inner.cancel)
                await inner

            job, _ = await aio.enqueue("odd-aio", "k", b"", max_attempts=1)
            worker = AsyncWorker(aio, ["odd-aio"], work, lease=10)
            running = asyncio.ensure_future(worker.run(handle_signals=False))
            deadline = time.monotonic() + 30
            while (await aio.get_job(job.id)).status != pb.JOB_STATUS_FAILED:
                assert time.monotonic() < deadline, "the job did not fail"
                await asyncio.sleep(0.05)
            assert "cancelled" in (await aio.get_job(job.id)).last_error
            worker.stop()
            await running
        finally:
            await aio.close()

    asyncio.run(cancelled_inside())


def settings_no_job_could_survive_are_refused(tmp, client, addr):
    async def handle(ctx: AsyncJobContext) -> None:
        pass

    def sync_handle(ctx: JobContext) -> None:
        pass

    for kwargs in ({"capacity": 0}, {"lease": 0}, {"lease": 3, "heartbeat_every": 3},
                   {"drain_timeout": -1}):
        try:
            Worker(client, ["q"], sync_handle, **kwargs)  # type: ignore[arg-type]
            raise AssertionError(f"Worker took {kwargs}")
        except ValueError:
            pass
    try:
        Worker(client, ["q"], handle)  # type: ignore[arg-type]
        raise AssertionError("Worker took an async handler (it would ack without running it)")
    except TypeError as e:
        assert "AsyncWorker" in str(e), e
    try:
        Worker(client, ["q"], {"k": "not a function"})  # type: ignore[dict-item]
        raise AssertionError("Worker took a handler that cannot be called")
    except TypeError as e:
        assert "'k'" in str(e), e

    async def aio_side() -> None:
        aio = AsyncClient("http://" + addr)
        try:
            # A sync function (it cannot be told from a lambda that returns
            # a coroutine until it runs): it ran once, so its job fails for
            # good rather than running again on every attempt.
            runs: List[str] = []

            def sync_side_effect(ctx: JobContext) -> None:
                runs.append(ctx.id)

            job, _ = await aio.enqueue("sync-on-aio", "k", b"", max_attempts=3)
            worker = AsyncWorker(aio, ["sync-on-aio"], sync_side_effect,  # type: ignore[arg-type]
                                 lease=10)
            running = asyncio.ensure_future(worker.run(handle_signals=False))
            deadline = time.monotonic() + 30
            while (await aio.get_job(job.id)).status != pb.JOB_STATUS_FAILED:
                assert time.monotonic() < deadline, "the job did not fail"
                await asyncio.sleep(0.05)
            assert runs == [job.id], runs
            assert "jobq.Worker" in (await aio.get_job(job.id)).last_error
            worker.stop()
            await running

            async def coro_of(ctx: AsyncJobContext) -> None:
                runs.append("lambda")

            # A lambda that returns a coroutine is an async handler.
            job, _ = await aio.enqueue("lambda-on-aio", "k", b"")
            worker = AsyncWorker(aio, ["lambda-on-aio"], lambda ctx: coro_of(ctx), lease=10)
            running = asyncio.ensure_future(worker.run(handle_signals=False))
            while (await aio.get_job(job.id)).status != pb.JOB_STATUS_DONE:
                assert time.monotonic() < deadline, "the lambda's job was not acked"
                await asyncio.sleep(0.05)
            worker.stop()
            await running
            # A first stream refused for good (a queue name the server
            # refuses) ends run() with the error, as in Rust.
            try:
                await asyncio.wait_for(
                    AsyncWorker(aio, ["bad queue!"], handle).run(handle_signals=False), 20)
                raise AssertionError("run() returned")
            except InvalidArgument as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        finally:
            await aio.close()

    asyncio.run(aio_side())
    outcome: List[BaseException] = []

    def run_refused() -> None:
        try:
            Worker(client, ["bad queue!"], sync_handle).run(handle_signals=False)
        except BaseException as e:  # noqa: BLE001
            outcome.append(e)

    t = threading.Thread(target=run_refused, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "run() kept retrying a refused stream"
    assert isinstance(outcome[0], InvalidArgument), outcome
    assert outcome[0].code() == grpc.StatusCode.INVALID_ARGUMENT, outcome


TESTS = [attempt_is_one_based, drain_deadline_gives_the_job_back, unknown_kind_is_retryable, wrong_arguments_are_refused,
         odd_handler_errors_fail_the_job, settings_no_job_could_survive_are_refused,
         jobq_server_env, cancel_revokes_the_running_handler, ack_survives_a_server_restart,
         lease_deadline_stops_the_handler, sigint_drains, sigterm_drains,
         asyncio_client_and_worker, asyncio_ack_survives_a_server_restart,
         asyncio_sigint_drains, asyncio_sigterm_drains]

if __name__ == "__main__":
    sys.exit(run_tests("python-parity", TESTS))
