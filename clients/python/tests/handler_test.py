"""What a handler can say and see, against a real `jobq serve`:
`raise Retry(after=…)` picks the retry delay (sync and asyncio),
`raise Snooze(after=…)` puts the job back without spending an attempt, what
a handler returns is the job's result (which `wait` hands the producer),
`ctx.progress()` reaches the producer with the heartbeats, and an
AsyncWorker handler's `ctx.cancelled` is an asyncio.Event it can await,
set with the operator's reason when its job is cancelled.

    .venv/bin/python clients/python/tests/handler_test.py
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Dict, List

from harness import Server, run_tests, wait_for
from jobq import (AsyncJobContext, Client, EnqueueOutcome, InvalidArgument, JobContext,
                  JobFailed, NewJob, Outcome, Retry, Snooze, Status, WaitTimeout, Worker)
from jobq.aio import AsyncClient, AsyncWorker


class Running:
    """A Worker on a thread, drained on exit."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False},
                                       daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(30)


def retry_after_delay(tmp: str, client: Client, addr: str) -> None:
    """Retry(after=1 h) leaves the job PENDING with run_at an hour after
    the failure; Retry(after=0) runs it again at once."""
    runs: List[int] = []

    def handler(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if ctx.key == "later":
            raise Retry("smtp said 421", after=timedelta(hours=1))
        if ctx.attempt == 1:
            raise Retry("try again now", after=0)

    later, _ = client.enqueue("retry-after", "k", key="later")
    now, _ = client.enqueue("retry-after", "k", key="now")
    with Running(Worker(client, ["retry-after"], handler, lease=10)):
        wait_for(lambda: client.get_job(now.id).status == Status.DONE, 10,
                 "Retry(after=0) run again at once and DONE")
        wait_for(lambda: client.get_job(later.id).history
                 and client.get_job(later.id).status == Status.PENDING, 10,
                 "Retry(after=1h) back to PENDING")
    j = client.get_job(later.id)
    failed_at = j.history[0].ended_at
    assert failed_at is not None and j.run_at is not None, j
    delay = (j.run_at - failed_at).total_seconds()
    assert 3590 <= delay <= 3610, f"retry delay {delay:.0f}s, asked for 3600s"
    assert j.history[0].outcome == Outcome.FAILED and j.last_error == "Retry: smtp said 421", j
    n = client.get_job(now.id)
    assert [a.outcome for a in n.history] == [Outcome.FAILED, Outcome.ACKED], n.history
    client.cancel_job(later.id, "test over")
    try:
        Retry(after=-1)
        raise AssertionError("a negative delay was taken")
    except ValueError:
        pass


def snooze_spends_no_attempt(tmp: str, client: Client, addr: str) -> None:
    """A job of one attempt snoozed twice (the API said 429) is then DONE:
    counted, the first snooze would have dead-lettered it."""
    runs: List[int] = []

    def handler(ctx: JobContext) -> None:
        runs.append(ctx.attempt)
        if len(runs) <= 2:
            raise Snooze("429: retry after 0.1s", after=0.1)

    job, _ = client.enqueue("snooze", "k", max_attempts=1)
    with Running(Worker(client, ["snooze"], handler, lease=10)):
        wait_for(lambda: client.get_job(job.id).status == Status.DONE, 20,
                 "DONE after two snoozes")
    j = client.get_job(job.id)
    assert [a.outcome for a in j.history] == [Outcome.SNOOZED, Outcome.SNOOZED,
                                              Outcome.ACKED], j.history
    assert j.attempts == 0 and j.last_error is None, j
    assert (j.snoozes, j.max_snoozes) == (2, 100), j
    assert "429" in (j.history[0].error or ""), j.history[0]
    # Past its max_snoozes, a snooze is a failed attempt: with one attempt,
    # the job is dead-lettered, saying why.
    runs.clear()
    capped, _ = client.enqueue("snooze", "k", max_attempts=1, max_snoozes=1)
    with Running(Worker(client, ["snooze"], handler, lease=10)):
        wait_for(lambda: client.get_job(capped.id).status == Status.FAILED, 20,
                 "FAILED at the second snooze")
    j = client.get_job(capped.id)
    assert [a.outcome for a in j.history] == [Outcome.SNOOZED, Outcome.FAILED], j.history
    assert (j.attempts, j.snoozes, j.max_snoozes) == (1, 1, 1), j
    assert "max_snoozes" in (j.last_error or ""), j.last_error
    try:
        Snooze(after=-1)
        raise AssertionError("a negative snooze was taken")
    except ValueError:
        pass


def key_rules_debounce_throttle_and_active(tmp: str, client: Client, addr: str) -> None:
    """on_conflict="replace" gives a PENDING job the latest payload
    (REPLACED); unique_for holds a key for a window; key_scope="active"
    frees it once the job is finished."""
    first = client.enqueue("keys", "reindex", b"v1", key="doc-9", delay=3600)
    assert first.outcome == EnqueueOutcome.CREATED and first.created
    job, created = client.enqueue("keys", "reindex", b"v2", key="doc-9",
                                  on_conflict="replace", delay=7200)
    assert (job.id, created) == (first.job.id, False)
    again = client.enqueue("keys", "reindex", b"v3", key="doc-9")
    assert again.outcome == EnqueueOutcome.EXISTING, again
    assert client.enqueue("keys", "reindex", b"v4", key="doc-9",
                          on_conflict="replace").outcome == EnqueueOutcome.REPLACED
    assert client.get_job(first.job.id).payload == b"v4"
    client.cancel_job(first.job.id, "finished")
    assert client.enqueue("keys", "reindex", key="doc-9").outcome == EnqueueOutcome.EXISTING
    fresh = client.enqueue("keys", "reindex", key="doc-9", key_scope="active")
    assert fresh.outcome == EnqueueOutcome.CREATED and fresh.job.id != first.job.id, fresh
    assert client.get_job(first.job.id).key is None
    window = client.enqueue("keys", "digest", key="digest-7", unique_for=0.2)
    wait_for(lambda: client.enqueue("keys", "digest", key="digest-7",
                                    unique_for=0.2).outcome == EnqueueOutcome.CREATED,
             10, "a new job once the window ended")
    assert window.outcome == EnqueueOutcome.CREATED
    results = client.enqueue_batch([NewJob("keys", "k", b"a", key="b-1"),
                                    NewJob("keys", "k", b"b", key="b-1", on_conflict="replace")])
    assert [r.outcome for r in results] == [EnqueueOutcome.CREATED, EnqueueOutcome.REPLACED]
    for bad in (dict(key_scope="forever"), dict(on_conflict="merge")):
        try:
            client.enqueue("keys", "k", key="x", **bad)  # type: ignore[arg-type]
            raise AssertionError(f"{bad} was taken")
        except ValueError:
            pass
    try:
        client.enqueue("keys", "k", unique_for=60)
        raise AssertionError("a window without a key was taken")
    except InvalidArgument:
        pass


def a_returned_value_is_the_result(tmp: str, client: Client, addr: str) -> None:
    """What a handler returns is stored by its ack as the job's result (a
    dict as JSON, bytes as they are), for sync and asyncio handlers alike;
    a result over the server's --max-result-bytes (1 MiB) fails the job for
    good, saying why."""
    def handler(ctx: JobContext) -> object:
        if ctx.key == "huge":
            return b"x" * (1024 * 1024 + 1)
        if ctx.key == "bytes":
            return b"\x00\xff"
        return {"order": ctx.key, "message_id": "<4711@mail.example>"}

    receipt, _ = client.enqueue("results", "k", key="order-4711")
    raw, _ = client.enqueue("results", "k", key="bytes")
    huge, _ = client.enqueue("results", "k", key="huge", max_attempts=5)
    with Running(Worker(client, ["results"], handler, lease=10)):
        wait_for(lambda: all(client.get_job(j.id).status in (Status.DONE, Status.FAILED)
                             for j in (receipt, raw, huge)), 20, "all three settled")
    assert client.get_job(receipt.id).result_json() == {
        "order": "order-4711", "message_id": "<4711@mail.example>"}
    assert client.get_job(raw.id).result == b"\x00\xff"
    failed = client.get_job(huge.id)
    assert failed.status == Status.FAILED and failed.attempts == 1, failed
    assert "the server refused the result" in (failed.last_error or ""), failed.last_error
    assert failed.result is None

    async def main() -> None:
        async with AsyncClient("http://" + addr) as aio:
            async def handler(ctx: AsyncJobContext) -> object:
                await asyncio.sleep(0)
                return "sent"

            job, _ = await aio.enqueue("results-aio", "k")
            worker = AsyncWorker(aio, ["results-aio"], handler, lease=10)
            running = asyncio.create_task(worker.run(handle_signals=False))
            deadline = time.monotonic() + 20
            while (await aio.get_job(job.id)).status != Status.DONE:
                assert time.monotonic() < deadline, "the asyncio job was not acked"
                await asyncio.sleep(0.05)
            worker.stop()
            await asyncio.wait_for(running, 30)
            assert (await aio.get_job(job.id)).result == b"sent"

    asyncio.run(main())


def progress_rides_on_the_heartbeats(tmp: str, client: Client, addr: str) -> None:
    """``ctx.progress(percent, message)`` reaches the producer with the
    worker's next heartbeat, and stays with the job after its ack, for sync
    and asyncio handlers; a server with a lower
    --max-progress-message-bytes than the client's cut cuts the message."""
    go_on = threading.Event()

    def handler(ctx: JobContext) -> None:
        ctx.progress(140, "row 4,000 of 10,000")
        go_on.wait(20)

    job, _ = client.enqueue("progress", "k")
    with Running(Worker(client, ["progress"], handler, lease=3)):
        wait_for(lambda: client.get_job(job.id).progress is not None, 20, "the report")
        p = client.get_job(job.id).progress
        assert p is not None and (p.percent, p.message) == (100, "row 4,000 of 10,000"), p
        assert p.reported_at is not None
        go_on.set()
        wait_for(lambda: client.get_job(job.id).status == Status.DONE, 20, "the ack")
    assert client.get_job(job.id).progress == p

    strict = Server(tmp, "--max-progress-message-bytes", "8", name="strict")
    try:
        sc = Client(strict.url)
        sc.wait_ready()
        go_on.clear()

        def wordy(ctx: JobContext) -> None:
            ctx.progress(10, "a message longer than eight bytes")
            go_on.wait(20)

        job, _ = sc.enqueue("progress", "k")
        with Running(Worker(sc, ["progress"], wordy, lease=3)):
            wait_for(lambda: sc.get_job(job.id).progress is not None, 20, "the cut report")
            got = sc.get_job(job.id).progress
            assert got is not None and got.message == "a mes…", got
            go_on.set()
            wait_for(lambda: sc.get_job(job.id).status == Status.DONE, 20, "the ack")
        sc.close()
    finally:
        strict.stop()

    async def main() -> None:
        async with AsyncClient("http://" + addr) as aio:
            release = asyncio.Event()

            async def handler(ctx: AsyncJobContext) -> None:
                ctx.progress(50, "half")
                await release.wait()

            job, _ = await aio.enqueue("progress-aio", "k")
            worker = AsyncWorker(aio, ["progress-aio"], handler, lease=3)
            running = asyncio.create_task(worker.run(handle_signals=False))
            deadline = time.monotonic() + 20
            while (await aio.get_job(job.id)).progress is None:
                assert time.monotonic() < deadline, "the asyncio report did not arrive"
                await asyncio.sleep(0.05)
            p = (await aio.get_job(job.id)).progress
            assert p is not None and (p.percent, p.message) == (50, "half"), p
            release.set()
            worker.stop()
            await asyncio.wait_for(running, 30)

    asyncio.run(main())


def wait_and_watch(tmp: str, client: Client, addr: str) -> None:
    """``wait`` returns the DONE job with its result, raises JobFailed for a
    cancelled one and WaitTimeout when nothing works the queue;
    ``watch_job`` yields each state up to the final one (sync and asyncio)."""
    job, _ = client.enqueue("waits", "k", key="order-4711")
    refunded, _ = client.enqueue("waits", "k", key="order-4712")
    never, _ = client.enqueue("nobody-works-here", "k")
    client.cancel_job(refunded.id, "order refunded")
    states: List[Status] = []
    watcher = threading.Thread(
        target=lambda: states.extend(j.status for j in client.watch_job(job.id, timeout=20)),
        daemon=True)
    watcher.start()

    def handler(ctx: JobContext) -> object:
        return {"sent": ctx.key}

    with Running(Worker(client, ["waits"], handler, lease=10)):
        done = client.wait(job.id, timeout=20)
    assert done.status == Status.DONE and done.result_json() == {"sent": "order-4711"}, done
    watcher.join(20)
    assert states[-1] == Status.DONE and states[0] in (Status.PENDING, Status.RUNNING), states
    try:
        client.wait(refunded.id, timeout=5)
        raise AssertionError("a cancelled job was waited for as DONE")
    except JobFailed as e:
        assert e.job.last_error == "cancelled: order refunded", e.job
    started = time.monotonic()
    try:
        client.wait(never.id, timeout=0.3)
        raise AssertionError("a job nobody works came back")
    except WaitTimeout:
        assert time.monotonic() - started < 5

    async def main() -> None:
        async with AsyncClient("http://" + addr) as aio:
            got = await aio.wait(job.id, timeout=5)
            assert got.result_json() == {"sent": "order-4711"}, got
            seen = [j.status async for j in aio.watch_job(job.id, refunded.id, timeout=5)]
            assert sorted(seen) == sorted([Status.DONE, Status.FAILED]), seen

    asyncio.run(main())


def async_retry_and_cancel(tmp: str, client: Client, addr: str) -> None:
    """On AsyncWorker: Retry(after=) works the same, and a cancelled job's
    handler, awaiting ctx.cancelled (an asyncio.Event), is told with the
    operator's words: 'cancelled: order refunded'."""
    seen: Dict[str, object] = {}

    async def main() -> None:
        async with AsyncClient("http://" + addr) as aio:
            started = asyncio.Event()

            async def handler(ctx: AsyncJobContext) -> None:
                if ctx.key == "retry":
                    raise Retry("rate limited", after=timedelta(minutes=30))
                seen["event"] = type(ctx.cancelled)
                started.set()
                try:
                    # The event is set first, then the task is cancelled:
                    # the wait ends in a CancelledError that says why.
                    await ctx.cancelled.wait()
                except asyncio.CancelledError as e:
                    seen["message"] = e.args[0] if e.args else None
                    raise
                finally:
                    seen["set"] = ctx.cancelled.is_set()
                    seen["reason"] = ctx.cancel_reason

            retry, _ = await aio.enqueue("aio-handler", "k", key="retry")
            worker = AsyncWorker(aio, ["aio-handler"], handler, lease=10)
            running = asyncio.ensure_future(worker.run(handle_signals=False))
            long, _ = await aio.enqueue("aio-handler", "k", key="long")
            await asyncio.wait_for(started.wait(), 20)
            t0 = time.monotonic()
            await aio.cancel_job(long.id, "order refunded")
            while "reason" not in seen:
                assert time.monotonic() - t0 < 5, "the handler was not told"
                await asyncio.sleep(0.01)
            deadline = time.monotonic() + 10
            while not (await aio.get_job(retry.id)).history:
                assert time.monotonic() < deadline, "the retry job did not fail"
                await asyncio.sleep(0.05)
            worker.stop()
            await asyncio.wait_for(running, 30)
            j = await aio.get_job(retry.id)
            ended = j.history[0].ended_at
            assert j.status == Status.PENDING and ended is not None and j.run_at is not None
            assert 1790 <= (j.run_at - ended).total_seconds() <= 1810, j
            await aio.cancel_job(retry.id, "test over")

    asyncio.run(main())
    assert seen["event"] is asyncio.Event, seen
    assert seen["reason"] == "cancelled: order refunded", seen
    assert seen["message"] == "cancelled: order refunded", seen
    assert seen["set"] is True, seen


if __name__ == "__main__":
    sys.exit(run_tests("python-handler", [retry_after_delay, snooze_spends_no_attempt,
                                               key_rules_debounce_throttle_and_active,
                                               a_returned_value_is_the_result,
                                               progress_rides_on_the_heartbeats, wait_and_watch,
                                               async_retry_and_cancel]))
