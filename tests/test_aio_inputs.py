"""awa_pool.aio reads what the sync API reads and refuses what it cannot
use: records and queue depths equal the sync ones on every async handle
(asyncpg's own types converted in its seam, whatever jsonb codec the
caller set), and a sync connection, an async one given to the sync API, a
bare asyncpg connection outside a transaction, a closed connection or a
bad job fail with one line before any SQL runs."""
from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import datetime, timedelta, timezone

import asyncpg
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import apps.basic  # noqa: F401  (registers "add" for drain)
import awa_pool
from awa_pool import Job, aio, testing
from aio_handles import KINDS, opened, sqlalchemy_url
from helpers import connection, query, scalar


def _jobs_of_every_shape(dsn: str) -> list:
    """Jobs whose records exercise every column type, made with the sync API."""
    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    with connection(dsn) as conn:
        ids = [awa_pool.enqueue(conn, Job("full", {"a": [1, 2], "s": "it's 100%", "f": 0.1},
                                          queue="q1", priority=4, run_at=soon, max_attempts=3,
                                          timeout=12.5, tags=["x", "y"], metadata={"m": True},
                                          ordering_key="key", unique=awa_pool.Unique()))]
        batch = awa_pool.enqueue_batch(conn, [Job("add", {"a": 1, "b": 2}, queue="later")], then=Job("noop"))
        ids += [batch.then_id]                          # held: run_at 'infinity'
        ids += awa_pool.enqueue_many(conn, [Job("add", {"a": n, "b": 1}) for n in range(3)])
        conn.commit()
        ran = testing.drain(conn, queue="default")      # completed: attempts with real wall/cpu seconds
        conn.commit()
        ids += [job_id for job_id, _ in ran]
        # results that are JSON scalars: a string must not be decoded twice
        conn.cursor().execute("UPDATE awa.jobs_done SET result = to_jsonb('done'::text) WHERE id = %s", (ran[0][0],))
        conn.cursor().execute("UPDATE awa.jobs_done SET result = '1.5' WHERE id = %s", (ran[1][0],))
        conn.commit()
    return ids


def _sync_reads(dsn: str, ids: list) -> tuple:
    with connection(dsn) as conn:
        return [awa_pool.get_job(conn, i) for i in ids], awa_pool.queue_depth(conn)


@pytest.mark.parametrize("kind", KINDS)
def test_records_and_depths_read_as_through_the_sync_api(kind, dsn) -> None:
    ids = _jobs_of_every_shape(dsn)
    records, depths = _sync_reads(dsn, ids)
    assert records[1].run_at.year == 9999 and records[-1].attempts and records[-3].result == "done"

    async def scenario(sync) -> None:
        async with opened(kind, dsn) as db:
            await db.begin()
            assert [await aio.get_job(db.handle, i) for i in ids] == records
            assert await aio.get_job(db.handle, 10**12) is None
            assert await aio.queue_depth(db.handle) == depths
            assert await aio.queue_depth(db.handle, ["q1", "nowhere"]) == awa_pool.queue_depth(
                sync, ["q1", "nowhere"])
            await db.rollback()

    with connection(dsn) as sync:
        asyncio.run(scenario(sync))


def test_a_jsonb_codec_set_on_an_asyncpg_connection_changes_nothing(dsn) -> None:
    """Apps often decode json(b) on their asyncpg connections (SQLAlchemy's
    dialect does): awa_pool's JSON still goes in as JSON objects, not as
    strings encoded twice, and comes back as the sync API reads it."""
    ids = _jobs_of_every_shape(dsn)
    records, _ = _sync_reads(dsn, ids)

    async def with_codec(conn) -> None:
        for name in ("json", "jsonb"):
            await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")

    async def scenario() -> int:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1, init=with_codec)
        try:
            async with pool.acquire() as conn:
                assert await conn.fetchval("SELECT '{\"a\": 1}'::jsonb") == {"a": 1}   # the codec is on
                assert [await aio.get_job(conn, i) for i in ids] == records
                async with conn.transaction():
                    job_id = await aio.enqueue(conn, Job("coded", {"a": 1}, metadata={"m": [1]}))
                    await aio.enqueue_many(conn, [Job("coded", {"b": 2}), Job("coded", {"c": 3}, delay=60)])
            async with pool.acquire() as conn:   # another proxy of the same connection
                assert (await aio.get_job(conn, job_id)).args == {"a": 1}
            return job_id
        finally:
            await pool.close()

    job_id = asyncio.run(scenario())
    assert query(dsn, "SELECT jsonb_typeof(args), jsonb_typeof(metadata) FROM awa.jobs WHERE kind = 'coded'") == [
        ("object", "object")] * 3
    with connection(dsn) as conn:
        assert awa_pool.get_job(conn, job_id).metadata == {"m": [1]}


# -- bad input ----------------------------------------------------------------------

def _one_line(caught) -> str:
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_synchronous_and_foreign_handles_are_refused_by_aio(dsn) -> None:
    lite = sqlite3.connect(":memory:")
    engine = create_async_engine(sqlalchemy_url(dsn, "asyncpg"))
    sync_engine = create_engine(sqlalchemy_url(dsn, "psycopg"))
    calls = (lambda h: aio.enqueue(h, Job("x")), lambda h: aio.enqueue_many(h, [Job("x")]),
             lambda h: aio.get_job(h, 1), lambda h: aio.queue_depth(h), lambda h: aio.wait(h, [1]))
    try:
        with connection(dsn) as pg2, psycopg.connect(dsn) as pg3, Session(sync_engine) as session, \
                sync_engine.connect() as sa_conn:
            for handle in (pg2, pg2.cursor(), pg3, pg3.cursor(), session, sa_conn):
                for call in calls:
                    with pytest.raises(TypeError, match="awaited on an async connection") as caught:
                        asyncio.run(call(handle))
                    assert "call the same functions from awa_pool with it" in _one_line(caught)
        for bad in (lite, object(), dsn, None):
            with pytest.raises(TypeError, match="awa_pool.aio needs") as caught:
                asyncio.run(aio.get_job(bad, 1))
            assert "asyncpg Connection" in _one_line(caught) and "AsyncSession" in str(caught.value)
        with pytest.raises(TypeError, match="AsyncEngine has no transaction"):
            asyncio.run(aio.enqueue(engine, Job("x")))
    finally:
        lite.close()
        sync_engine.dispose()
        asyncio.run(engine.dispose())
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 0


def test_async_handles_are_refused_by_the_sync_api(dsn) -> None:
    async def scenario() -> None:
        pg3 = await psycopg.AsyncConnection.connect(dsn)
        apg = await asyncpg.connect(dsn)
        engine = create_async_engine(sqlalchemy_url(dsn, "psycopg"))
        try:
            async with AsyncSession(engine) as session, engine.connect() as sa_conn:
                for handle in (pg3, pg3.cursor(), apg, session, sa_conn):
                    with pytest.raises(TypeError, match="synchronous") as caught:
                        awa_pool.enqueue(handle, Job("x"))
                    assert "awa_pool.aio" in str(caught.value) and "\n" not in str(caught.value)
        finally:
            await pg3.close()
            await apg.close()
            await engine.dispose()

    asyncio.run(scenario())
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 0


def test_a_bare_asyncpg_connection_must_be_in_a_transaction_to_enqueue(dsn) -> None:
    """asyncpg has no implicit transaction: outside one, a job would commit
    on its own at once, whatever the caller does next. The producing calls
    refuse; reads and wait need no transaction."""
    async def scenario() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for call in (lambda: aio.enqueue(conn, Job("x")), lambda: aio.enqueue_many(conn, [Job("x")]),
                         lambda: aio.enqueue_batch(conn, [Job("x")], then=Job("y"))):
                with pytest.raises(ValueError, match=r"not in a transaction.*conn\.transaction\(\)"):
                    await call()
            assert await aio.get_job(conn, 1) is None and await aio.queue_depth(conn) == {}
            async with conn.transaction():
                await aio.enqueue(conn, Job("inside"))
        finally:
            await conn.close()

    asyncio.run(scenario())
    assert query(dsn, "SELECT kind FROM awa.jobs") == [("inside",)]


class Base(DeclarativeBase):
    pass


class Thing(Base):
    __tablename__ = "things"
    id: Mapped[int] = mapped_column(primary_key=True)


def test_closed_failed_and_busy_connections_are_refused_before_any_sql(dsn) -> None:
    query(dsn, "CREATE TABLE things (id integer PRIMARY KEY)")

    async def scenario() -> None:
        closed = await psycopg.AsyncConnection.connect(dsn)
        await closed.close()
        apg = await asyncpg.connect(dsn)
        await apg.close()
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
        async with pool.acquire() as proxy:
            pass
        for handle, pattern in ((closed, "is closed"), (apg, "is closed"), (proxy, "released to its pool")):
            for call in (lambda h=handle: aio.enqueue(h, Job("x")), lambda h=handle: aio.get_job(h, 1)):
                with pytest.raises(ValueError, match=pattern):
                    await call()
        with pytest.raises(TypeError, match="Pool has no transaction"):
            await aio.enqueue(pool, Job("x"))
        await pool.close()

        async with await psycopg.AsyncConnection.connect(dsn) as failed:
            with pytest.raises(psycopg.errors.UndefinedTable):
                await failed.execute("SELECT * FROM no_such_table")
            with pytest.raises(ValueError, match="already failed.*roll it back first"):
                await aio.enqueue(failed, Job("x"))
            await failed.rollback()
            # wait() needs to see other commits: not inside a transaction
            await failed.execute("SELECT 1")
            with pytest.raises(ValueError, match="outside a transaction"):
                await aio.wait(failed, [1])

        engine = create_async_engine(sqlalchemy_url(dsn, "psycopg"))
        try:
            async with engine.connect() as conn:
                with pytest.raises(Exception):
                    await conn.execute(text("SELECT * FROM no_such_table"))
                with pytest.raises(ValueError, match="already failed"):
                    await aio.enqueue(conn, Job("x"))
            async with AsyncSession(engine) as session:
                session.add(Thing(id=1))
                await session.commit()
                session.add(Thing(id=1))
                with pytest.raises(IntegrityError):
                    await session.flush()
                with pytest.raises(ValueError, match="AsyncSession's transaction has already failed"):
                    await aio.enqueue(session, Job("x"))
            async with AsyncSession(engine) as session:
                with pytest.raises(ValueError, match="outside a transaction"):
                    await aio.wait(session, [1])   # a session is always in a transaction
            conn = await engine.connect()
            await conn.close()
            with pytest.raises(ValueError, match="AsyncConnection passed is closed"):
                await aio.enqueue(conn, Job("x"))
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 0


@pytest.mark.parametrize("kind", ["psycopg", "asyncpg", "sqlalchemy-asyncpg"])
def test_bad_jobs_fail_in_one_line_before_any_sql(kind, dsn) -> None:
    async def scenario() -> None:
        async with opened(kind, dsn) as db:
            await db.begin()
            for call in (lambda: aio.enqueue(db.handle, {"kind": "x"}),
                         lambda: aio.enqueue_many(db.handle, [Job("ok"), "not a job"]),
                         lambda: aio.enqueue_batch(db.handle, [Job("m", unique=awa_pool.Unique())]),
                         lambda: aio.get_job(db.handle, "7"),
                         lambda: aio.queue_depth(db.handle, "default"),
                         lambda: aio.wait(db.handle, [1.5])):
                with pytest.raises((TypeError, ValueError)) as caught:
                    await call()
                assert "\n" not in str(caught.value)
            # nothing was sent: the transaction is still good for the next call
            assert await aio.enqueue(db.handle, Job("after"))
            await db.commit()

    asyncio.run(scenario())
    assert query(dsn, "SELECT kind FROM awa.jobs") == [("after",)]
