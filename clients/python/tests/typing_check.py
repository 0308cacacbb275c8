"""Type-checked, not run: CI runs `mypy --strict` on this file. Each
`# type: ignore[...]` marks a call that must be a type error; with
--strict (warn_unused_ignores), a call that stopped being one fails the
check."""

from __future__ import annotations

from jobq import Client, JobContext, Worker
from jobq.aio import AsyncClient, AsyncWorker


def handler(ctx: JobContext) -> None:
    attempt: int = ctx.attempt
    assert attempt >= 1 and not ctx.cancelled.is_set()


async def async_handler(ctx: JobContext) -> None:
    handler(ctx)


def sync_side(client: Client) -> None:
    Worker(client, ["email"], handler)
    Worker(client, ("email", "sms"), {"send-email": handler})
    # A bare str is not a list of queues (it would be e, m, a, i, l).
    Worker(client, "email", handler)  # type: ignore[arg-type]
    # An async handler on the sync worker.
    Worker(client, ["email"], async_handler)  # type: ignore[arg-type]
    # An async client on the sync worker.
    Worker(AsyncClient(), ["email"], handler)  # type: ignore[arg-type]
    job, created = client.enqueue("email", "send-email", b"{}", key="order-1")
    name: str = job.id
    new: bool = created


async def async_side(client: AsyncClient) -> None:
    await AsyncWorker(client, ["email"], async_handler).run()
    AsyncWorker(client, "email", async_handler)  # type: ignore[arg-type]
    AsyncWorker(client, ["email"], handler)  # type: ignore[arg-type]
    job, created = await client.enqueue("email", "send-email")
    async for j in client.list_jobs("email", "DONE"):
        assert j.id
