"""Type-checked, not run: CI runs `mypy --strict` on this file. Each
`# type: ignore[...]` marks a call that must be a type error; with
--strict (warn_unused_ignores), a call that stopped being one fails the
check. The plain assignments pin what the typed API returns."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta
from typing import Dict, List, Optional

import grpc

from jobq import (AsyncJobContext, Attempt, Client, EnqueueResult, Enqueued, Job, JobContext,
                  JobqError, LeasedJob, NewJob, NotFound, Outcome, QueueStats, Retry, Schedule,
                  Status, Unavailable, Worker)
from jobq.aio import AsyncClient, AsyncWorker


def handler(ctx: JobContext) -> None:
    attempt: int = ctx.attempt
    expires: datetime = ctx.lease_expires_at
    key: Optional[str] = ctx.key
    event: threading.Event = ctx.cancelled
    reason: str = ctx.cancel_reason
    job: Job = ctx.job
    assert attempt >= 1 and not event.is_set() and expires and key != reason and job.id
    raise Retry("smtp said 421", after=timedelta(seconds=30))


async def async_handler(ctx: AsyncJobContext) -> None:
    event: asyncio.Event = ctx.cancelled
    await event.wait()
    # The async context's event is not a threading.Event.
    bad: threading.Event = ctx.cancelled  # type: ignore[assignment]
    expires: datetime = ctx.lease_expires_at
    assert bad and expires


def sync_side(client: Client) -> None:
    Worker(client, ["emails"], handler)
    Worker(client, ("emails", "sms"), {"send-email": handler})
    # A bare str is not a list of queues (it would be e, m, a, i, l, s).
    Worker(client, "emails", handler)  # type: ignore[arg-type]
    # An async handler on the sync worker.
    Worker(client, ["emails"], async_handler)  # type: ignore[arg-type]
    # An async client on the sync worker.
    Worker(AsyncClient(), ["emails"], handler)  # type: ignore[arg-type]
    Client(wait_for_ready=True, timeout=5)

    job, created = client.enqueue("emails", "send-email", b"{}", key="order-4711",
                                  delay=timedelta(minutes=5), max_attempts=5,
                                  metadata={"tenant": "t1"}, priority=10)
    name: str = job.id
    new: bool = created
    enqueued: Enqueued = client.enqueue("emails", "send-email", "{}", run_at=datetime.now())
    status: Status = enqueued.job.status
    when: Optional[datetime] = job.enqueued_at
    history: List[Attempt] = list(client.get_job(name).history)
    outcome: Outcome = history[0].outcome
    # Keywords only after the payload.
    client.enqueue("emails", "send-email", b"{}", "order-4711")  # type: ignore[call-arg]
    client.enqueue("emails", "send-email", delay="5m")  # type: ignore[arg-type]

    results: List[EnqueueResult] = client.enqueue_batch([
        NewJob("emails", "send-email", b"{}", key="order-1", delay=30),
        NewJob("emails", "send-email", key="order-2", run_at=datetime.now()),
    ])
    error: Optional[JobqError] = results[0].error
    stats: Dict[str, QueueStats] = client.stats()
    pending: int = stats["emails"].pending
    age: Optional[timedelta] = stats["emails"].oldest_pending_age
    leased: Optional[LeasedJob] = client.dequeue(["emails"], "w1")
    schedules: List[Schedule] = client.list_schedules()
    done: bool = status == Status.DONE
    assert new and when and outcome and error and pending and age and leased and schedules
    assert done

    try:
        client.get_job("1")
    except NotFound as e:
        code: grpc.StatusCode = e.code()
        message: str = e.message
        assert code and message
    except Unavailable:
        pass


async def async_side(client: AsyncClient) -> None:
    await AsyncWorker(client, ["emails"], async_handler).run()
    AsyncWorker(client, "emails", async_handler)  # type: ignore[arg-type]
    AsyncWorker(client, ["emails"], handler)  # type: ignore[arg-type]
    # A sync-context handler: its ctx.cancelled would be the wrong kind of event.
    AsyncWorker(client, ["emails"], sync_ctx_handler)  # type: ignore[arg-type]
    job, created = await client.enqueue("emails", "send-email", key="order-4711")
    typed: Job = job
    async for j in client.list_jobs("emails", Status.DONE):
        assert j.id and typed and created
    stats: Dict[str, QueueStats] = await client.stats("emails")
    assert stats


async def sync_ctx_handler(ctx: JobContext) -> None:
    pass
