"""awa_pool.aio: the producer and read API for asyncio code (SPEC §12).

With asyncpg, for example (docs/producers.md has every driver):

    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO orders ...")
        job_id = await awa_pool.aio.enqueue(conn, Job("send_receipt", {"order_id": 42}))

Each function is the awaited twin of the synchronous one of the same name:
the same validation and the same statements (one plan, built in
awa_pool/api), run on a psycopg 3 AsyncConnection or AsyncCursor, an
asyncpg Connection, or an SQLAlchemy AsyncConnection or AsyncSession
(asyncpg or psycopg dialect), in the caller's transaction. Nothing commits
or rolls back for the caller, nothing blocks the event loop or runs in a
thread. A bare asyncpg connection outside a transaction is refused by the
producing functions (asyncpg has no implicit transaction: the job would
commit on its own at once); psycopg's autocommit and SQLAlchemy's
AUTOCOMMIT are the caller's explicit choice and are respected.

enqueue_workflow joins this module when workflows land (SPEC §10).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence

from .api.admin import NOT_OUTSIDE_TRANSACTION, Waiting, get_job_plan
from .api.aio_drivers import adapt_async
from .api.producer import Batch, enqueue_batch_plan, enqueue_many_plan, enqueue_plan
from .core.errors import Seconds
from .core.job import Job, JobRecord, decode_json_for_record
from .core.tracing import producer_span
from .ops.stats import QueueDepth, queue_depth_plan

__all__ = ["enqueue", "enqueue_many", "enqueue_batch", "get_job", "wait", "queue_depth"]


@producer_span("enqueue")
async def enqueue(conn: Any, job: Job) -> int:
    """Insert one job in the connection's current transaction; returns its id
    (an existing job's id for a `unique` duplicate)."""
    plan = enqueue_plan(job)   # bad jobs fail before the connection is looked at
    return await (await adapt_async(conn)).run(plan)


@producer_span("enqueue_many")
async def enqueue_many(conn: Any, jobs: Iterable[Job]) -> List[int]:
    """Insert many jobs in one round trip per 5,000; ids come back in input order."""
    plan = enqueue_many_plan(jobs)
    return await (await adapt_async(conn)).run(plan)


@producer_span("enqueue_batch")
async def enqueue_batch(conn: Any, jobs: Iterable[Job], then: Optional[Job] = None) -> Batch:
    """Insert a batch of jobs and, with `then`, a follow-up job that becomes
    available exactly once, after every member reached a terminal state."""
    plan = enqueue_batch_plan(jobs, then)
    return await (await adapt_async(conn)).run(plan)


async def get_job(conn: Any, job_id: int) -> Optional[JobRecord]:
    """The job with this id, or None."""
    plan = get_job_plan(job_id)
    return await (await adapt_async(conn)).run(plan)


async def queue_depth(conn: Any, queues: Optional[Iterable[str]] = None) -> Dict[str, QueueDepth]:
    """Live jobs per queue and state (see awa_pool.queue_depth)."""
    plan = queue_depth_plan(queues)
    return await (await adapt_async(conn)).run(plan)


async def wait(conn: Any, ids: Sequence[int], timeout: Optional[Seconds] = None) -> List[JobRecord]:
    """Until every job in `ids` is terminal, return their records in the
    order of `ids`. Sleeps on the connection's LISTEN (no polling; through
    a pooler it looks every 0.25 s) without blocking the event loop.
    Raises TimeoutError after `timeout`. `conn` must not be inside a
    transaction: waiting needs to see other transactions commit."""
    waiting = Waiting(ids, timeout)
    link = await adapt_async(conn, begin=False)
    if link.in_transaction():
        raise ValueError(NOT_OUTSIDE_TRANSACTION)
    async with link.listening(decode_json_for_record) as watch:
        while True:
            # a notification that arrives while the query runs counts too
            watch.clear()
            done = waiting.finished(await watch.look(waiting.query))
            if done is not None:
                return done
            if not watch.pending():
                await watch.sleep(waiting.pause_s(watch.listening))
