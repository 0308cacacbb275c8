"""The typed surface of the Client against a real `jobq serve`: Job,
Status and UTC datetimes instead of protobuf messages, QueueStats,
enqueue_batch with NewJob keywords, queue policies and groups, the
JobqError classes with the
server's message and code, and wait_for_ready.

    .venv/bin/python clients/python/tests/api_test.py
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from datetime import datetime, timedelta, timezone
from typing import List

import grpc

from harness import Server, run_tests
from jobq import (Client, EnqueueResult, FailedPrecondition, InvalidArgument, Job, JobLost,
                  JobqError, NewJob, NotFound, QueuePolicy, QueueStats, RateLimit, Status,
                  Unavailable)
from jobq._common import revoke_reason
from jobq.aio import AsyncClient


def near(t: datetime | None, want: datetime, slack: float = 5) -> bool:
    return t is not None and abs((t - want).total_seconds()) <= slack


def typed_jobs(tmp: str, client: Client, addr: str) -> None:
    now = datetime.now(timezone.utc)
    job, created = client.enqueue("typed", "send-email", '{"order": 4711}', key="order-4711",
                                  max_attempts=4, priority=7, metadata={"tenant": "t1"},
                                  delay=timedelta(hours=1))
    assert isinstance(job, Job) and created, job
    assert job.status is Status.PENDING and job.status == 1, job.status
    assert job.enqueued_at is not None and job.enqueued_at.tzinfo is not None, job
    assert near(job.enqueued_at, now), job.enqueued_at
    assert near(job.run_at, now + timedelta(hours=1)), job.run_at
    assert (job.key, job.max_attempts, job.priority) == ("order-4711", 4, 7), job
    assert job.worker_id is None and job.last_error is None and job.finished_at is None, job
    again = client.enqueue("typed", "send-email", b"{}", key="order-4711")
    assert again.job.id == job.id and not again.created, again

    at = now + timedelta(minutes=10)
    later, _ = client.enqueue("typed", "send-email", b"{}", run_at=at)
    assert near(later.run_at, at), later.run_at
    for bad in ({"run_at": datetime.now()}, {"run_at": at, "delay": 5}):
        try:
            client.enqueue("typed", "k", **bad)  # type: ignore[arg-type]
            raise AssertionError(f"enqueue took {bad}")
        except ValueError:
            pass

    full = client.get_job(job.id)
    assert full.payload == b'{"order": 4711}' and full.json() == {"order": 4711}, full
    assert full.metadata["tenant"] == "t1", full.metadata
    listed = list(client.list_jobs("typed", Status.PENDING))
    assert [j.id for j in listed] == [job.id, later.id], listed
    assert all(isinstance(j, Job) for j in listed)

    stats = client.stats("typed")["typed"]
    assert isinstance(stats, QueueStats) and (stats.pending, stats.paused) == (2, False), stats
    assert stats.oldest_pending_age is None, stats  # neither is due yet
    assert stats["pending"] == 2 and stats.counts()["done"] == 0  # the older dict form


def leased_and_acked(tmp: str, client: Client, addr: str) -> None:
    job, _ = client.enqueue("typed-lease", "k", b"x")
    leased = client.dequeue(["typed-lease"], "api-test", lease=30)
    assert leased is not None and leased.job.id == job.id, leased
    assert leased.job.status is Status.RUNNING and leased.job.worker_id == "api-test"
    assert near(leased.lease_expires_at, datetime.now(timezone.utc) + timedelta(seconds=30))
    done = client.ack(job.id, leased.lease_id)
    assert done.status is Status.DONE and done.finished_at is not None, done
    try:
        client.ack(job.id, leased.lease_id)
        raise AssertionError("a second ack was taken")
    except FailedPrecondition as e:
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and e.message, e
    try:
        client.ack(job.id, "12345")
        raise AssertionError("an ack under another lease was taken")
    except JobqError as e:
        assert e.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION), e


def batch_with_keywords(tmp: str, client: Client, addr: str) -> None:
    results = client.enqueue_batch([
        NewJob("typed-batch", "send-email", b'{"order": 1}', key="order-1"),
        NewJob("bad queue!", "send-email"),
        NewJob("typed-batch", "send-email", '{"order": 2}', key="order-2",
               delay=timedelta(minutes=5), priority=-3, max_attempts=2),
        NewJob("typed-batch", "send-email", b"", key="order-1"),
    ])
    assert all(isinstance(r, EnqueueResult) for r in results)
    ok, bad, delayed, dup = results
    assert ok.ok and ok.created and ok.job is not None and ok.job.key == "order-1", ok
    assert not bad.ok and bad.job is None and isinstance(bad.error, InvalidArgument), bad
    assert "queue" in str(bad.error), bad.error
    assert delayed.job is not None and delayed.job.priority == -3, delayed
    assert dup.job is not None and ok.job is not None and dup.job.id == ok.job.id, dup
    assert not dup.created, dup
    assert client.stats("typed-batch")["typed-batch"].pending == 2


def queue_policies(tmp: str, client: Client, addr: str) -> None:
    """A group's jobs run one at a time: with group_max_running=1 a second
    job of the group is held (PENDING, counted in stats) until the first
    is acked; the policy reads back, and bad limits are refused."""
    client.set_queue_policy("py-policy", max_running=10, group_max_running=1)
    assert client.queue_policy("py-policy") == QueuePolicy(10, 1)
    first, _ = client.enqueue("py-policy", "import", b"1", group="customer-42")
    second, _ = client.enqueue("py-policy", "import", b"2", group="customer-42")
    assert first.group == "customer-42", first
    leased = client.dequeue(["py-policy"], "py-w")
    assert leased is not None and leased.job.id == first.id, leased
    assert client.dequeue(["py-policy"], "py-w") is None, "the second waits for the first"
    stats = client.stats("py-policy")["py-policy"]
    assert stats.policy == QueuePolicy(10, 1) and stats.held_group_max_running == 1, stats
    client.ack(leased.job.id, leased.lease_id)
    nxt = client.dequeue(["py-policy"], "py-w")
    assert nxt is not None and nxt.job.id == second.id, nxt
    try:
        client.set_queue_policy("py-policy", max_running=100_001)
        raise AssertionError("an out-of-range limit was accepted")
    except InvalidArgument as e:
        assert "max_running" in str(e), e
    client.set_queue_policy("py-policy")
    assert not client.queue_policy("py-policy")
    # Two takes an hour: the third job waits, PENDING, counted as held.
    hourly = RateLimit(2, timedelta(hours=1))
    client.set_queue_policy("py-rate", rate=hourly)
    assert client.queue_policy("py-rate").rate == hourly
    for i in range(3):
        client.enqueue("py-rate", "call-api", str(i))
    assert client.dequeue(["py-rate"], "py-w") is not None
    assert client.dequeue(["py-rate"], "py-w") is not None
    assert client.dequeue(["py-rate"], "py-w") is None, "the bucket is empty"
    assert client.stats("py-rate")["py-rate"].held_rate == 1
    # One take an hour per customer: customer b is not held by customer a.
    client.set_queue_policy("py-group-rate", group_rate=RateLimit(1, timedelta(hours=1)))
    assert client.queue_policy("py-group-rate").group_rate == RateLimit(1, timedelta(hours=1))
    for group in ("a", "a", "b"):
        client.enqueue("py-group-rate", "email", group, group=group)
    taken = [client.dequeue(["py-group-rate"], "py-w") for _ in range(3)]
    assert [t.job.group if t else None for t in taken] == ["a", "b", None], taken
    assert client.stats("py-group-rate")["py-group-rate"].held_group_rate == 1

    async def from_asyncio() -> None:
        async with AsyncClient(addr) as ac:
            await ac.set_queue_policy("py-policy-aio", max_running=2)
            assert await ac.queue_policy("py-policy-aio") == QueuePolicy(2, 0)
            job, _ = await ac.enqueue("py-policy-aio", "k", group="g")
            assert job.group == "g", job
    asyncio.run(from_asyncio())


def errors_by_status(tmp: str, client: Client, addr: str) -> None:
    try:
        client.get_job("999999999")
        raise AssertionError("an unknown job was found")
    except NotFound as e:
        assert isinstance(e, grpc.RpcError), "still catchable as grpc.RpcError"
        assert e.code() == grpc.StatusCode.NOT_FOUND and e.details() == e.message, e
        assert str(e) and "NotFound" in repr(e), repr(e)
    try:
        client.enqueue("bad queue!", "k")
        raise AssertionError("a bad queue name was taken")
    except InvalidArgument as e:
        assert "queue" in str(e), e
    job, _ = client.enqueue("typed-errors", "k")
    client.cancel_job(job.id, "order refunded")
    try:
        client.cancel_job(job.id)
        raise AssertionError("a FAILED job was cancelled again")
    except FailedPrecondition:
        pass
    assert issubclass(JobLost, JobqError)
    # Not a server message: how a lease revocation reads to the handler.
    assert revoke_reason("revoked (cancelled: order refunded)") == "cancelled: order refunded"
    assert revoke_reason("revoked (cancelled)") == "cancelled"
    assert revoke_reason("revoked") == "revoked"
    assert revoke_reason("lease expired") == "revoked: lease expired"

    async def aio() -> None:
        async with AsyncClient("http://" + addr) as a:
            try:
                await a.get_job("999999999")
                raise AssertionError("an unknown job was found")
            except NotFound as e:
                assert e.message, e
            assert (await a.get_job(job.id)).status is Status.FAILED
    asyncio.run(aio())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_ready(tmp: str, client: Client, addr: str) -> None:
    """Without wait_for_ready a call to a server that is not up is
    Unavailable at once; with it, the call waits and succeeds when the
    server starts."""
    port = free_port()
    with Client(f"http://127.0.0.1:{port}", timeout=5) as eager:
        try:
            eager.stats()
            raise AssertionError("a call to no server succeeded")
        except Unavailable as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
    patient = Client(f"http://127.0.0.1:{port}", timeout=30, wait_for_ready=True)
    got: List[object] = []
    call = threading.Thread(target=lambda: got.append(patient.enqueue("ready", "k")))
    call.start()
    call.join(1.0)
    assert call.is_alive() and not got, "the call did not wait for the server"
    server = Server(tmp, name="late", listen=f"127.0.0.1:{port}")
    try:
        call.join(30)
        assert got and got[0][1] is True, got  # type: ignore[index]
    finally:
        patient.close()
        server.stop()


if __name__ == "__main__":
    sys.exit(run_tests("python-api", [typed_jobs, leased_and_acked, batch_with_keywords,
                                      queue_policies, errors_by_status, wait_for_ready]))
