"""A producer program for tests/test_tracing.py.

    python -m apps.tracing_host MODE DSN OUT

produce  SDK with an in-memory exporter; inside a "request" span, enqueue
         one job with enqueue, two with enqueue_many and a batch of one with
         a follow-up, commit; OUT gets {"ids": ..., "spans": [...]}.
inline   the same, then run every job inline (awa_pool.testing.drain) in
         this process; OUT gets every span.
aio      as inline, but the jobs are enqueued with awa_pool.aio on asyncpg.
blocked  opentelemetry cannot be imported (a finder refuses it and counts
         the attempts): enqueue, enqueue_many, enqueue_batch, drain and
         run_job work, and the import is tried once.
"""
from __future__ import annotations

import json
import sys

import psycopg2

MODE, DSN, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
OWN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class RefuseOpenTelemetry:
    """A meta path finder that makes `opentelemetry` not installed."""

    attempts = 0

    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            RefuseOpenTelemetry.attempts += 1
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


if MODE == "blocked":
    sys.meta_path.insert(0, RefuseOpenTelemetry())

import awa_pool  # noqa: E402
import awa_pool.testing  # noqa: E402
import apps.basic  # noqa: E402,F401 (the handlers, for drain)
from awa_pool import Job  # noqa: E402


def enqueue_all(conn) -> dict:
    with conn:
        one = awa_pool.enqueue(conn, Job("retry_then_ok", {"times": 2, "delay": 0}))
        # two of one shape (the args-only insert), one with metadata of its own (merged)
        many = awa_pool.enqueue_many(conn, [Job("add", {"a": 1, "b": 2}), Job("add", {"a": 3, "b": 4}),
                                            Job("add", {"a": 0, "b": 0}, metadata={"origin": "import"})])
        batch = awa_pool.enqueue_batch(conn, [Job("add", {"a": 5, "b": 6})], then=Job("noop"))
        # its own context is kept (a queue no one serves here: it never runs)
        own = awa_pool.enqueue(conn, Job("noop", queue="elsewhere", metadata={"traceparent": OWN}))
    return {"enqueue": one, "enqueue_many": many, "batch": list(batch.ids), "then": batch.then_id, "own": own}


async def enqueue_all_async(dsn: str) -> dict:
    """enqueue_all's calls, awaited with awa_pool.aio on an asyncpg connection."""
    import asyncpg
    from awa_pool import aio

    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            one = await aio.enqueue(conn, Job("retry_then_ok", {"times": 2, "delay": 0}))
            many = await aio.enqueue_many(conn, [Job("add", {"a": 1, "b": 2}), Job("add", {"a": 3, "b": 4}),
                                                 Job("add", {"a": 0, "b": 0}, metadata={"origin": "import"})])
            batch = await aio.enqueue_batch(conn, [Job("add", {"a": 5, "b": 6})], then=Job("noop"))
            own = await aio.enqueue(conn, Job("noop", queue="elsewhere", metadata={"traceparent": OWN}))
    finally:
        await conn.close()
    return {"enqueue": one, "enqueue_many": many, "batch": list(batch.ids), "then": batch.then_id, "own": own}


def metadata_of(conn, ids) -> dict:
    return {job_id: awa_pool.get_job(conn, job_id).metadata for job_id in ids}


def main() -> None:
    conn = psycopg2.connect(DSN)
    if MODE == "blocked":
        ids = enqueue_all(conn)
        with conn:
            ran = awa_pool.testing.drain(conn)
        inline = awa_pool.testing.run_job(Job("add", {"a": 1, "b": 1}))
        every = [ids["enqueue"], *ids["enqueue_many"], *ids["batch"], ids["then"]]
        from awa_pool.core import tracing

        result = {"attempts": RefuseOpenTelemetry.attempts, "available": tracing.available(),
                  "loaded": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
                  "ran": len(ran), "inline": inline.outcome, "metadata": metadata_of(conn, every)}
        with open(OUT, "w") as handle:
            json.dump(result, handle)
        return

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from apps.span_file import span_record

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    with trace.get_tracer("tests").start_as_current_span("request"):
        if MODE == "aio":
            import asyncio

            ids = asyncio.run(enqueue_all_async(DSN))
        else:
            ids = enqueue_all(conn)
    if MODE in ("inline", "aio"):
        with conn:
            awa_pool.testing.drain(conn)
    every = [ids["enqueue"], *ids["enqueue_many"], *ids["batch"], ids["then"], ids["own"]]
    with open(OUT, "w") as handle:
        json.dump({"ids": ids, "own": OWN, "metadata": metadata_of(conn, every),
                   "spans": [span_record(span) for span in exporter.get_finished_spans()]}, handle)


if __name__ == "__main__":
    main()
