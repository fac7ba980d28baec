"""The async connections awa_pool.aio accepts, opened the way an app opens
them, for tests/test_aio*.py: `async with opened(kind, dsn) as db:` gives
`db.handle` (what the test passes as conn), `db.begin()`, `db.commit()`,
`db.rollback()` and `db.execute(sql, value)` (an app's own statement in the
same transaction, one `$1`/`%s`/`:v` parameter written as `{}`)."""
from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

# every kind of handle; the four drivers (a cursor or a pool's proxy is the
# same driver) for the heavier tests
KINDS = ["psycopg", "psycopg-cursor", "asyncpg", "asyncpg-pool", "sqlalchemy-asyncpg",
         "sqlalchemy-psycopg", "sqlalchemy-connection"]
DRIVERS = ["psycopg", "asyncpg", "sqlalchemy-asyncpg", "sqlalchemy-psycopg"]


def sqlalchemy_url(dsn: str, driver: str) -> str:
    return "postgresql+" + driver + "://" + dsn.partition("://")[2]


class Handle:
    handle: Any

    async def begin(self) -> None:
        """Open a transaction where the driver does not do it implicitly."""

    async def commit(self) -> None:
        raise NotImplementedError

    async def rollback(self) -> None:
        raise NotImplementedError

    async def execute(self, sql: str, value: Any) -> None:
        raise NotImplementedError


class Psycopg(Handle):
    def __init__(self, raw: Any, cursor: bool) -> None:
        self.raw = raw
        self.handle = raw.cursor() if cursor else raw

    async def commit(self) -> None:
        await self.raw.commit()

    async def rollback(self) -> None:
        await self.raw.rollback()

    async def execute(self, sql: str, value: Any) -> None:
        await self.raw.execute(sql.format("%s"), (value,))


class Asyncpg(Handle):
    def __init__(self, conn: Any) -> None:
        self.handle = conn
        self.transaction: Any = None

    async def begin(self) -> None:
        self.transaction = self.handle.transaction()
        await self.transaction.start()

    async def commit(self) -> None:
        await self.transaction.commit()

    async def rollback(self) -> None:
        await self.transaction.rollback()

    async def execute(self, sql: str, value: Any) -> None:
        await self.handle.execute(sql.format("$1"), value)


class SQLAlchemy(Handle):
    def __init__(self, handle: Any) -> None:
        self.handle = handle   # an AsyncSession or an AsyncConnection: both autobegin

    async def commit(self) -> None:
        await self.handle.commit()

    async def rollback(self) -> None:
        await self.handle.rollback()

    async def execute(self, sql: str, value: Any) -> None:
        from sqlalchemy import text

        await self.handle.execute(text(sql.format(":v")), {"v": value})


@contextlib.asynccontextmanager
async def opened(kind: str, dsn: str) -> AsyncIterator[Handle]:
    if kind.startswith("psycopg"):
        import psycopg

        raw = await psycopg.AsyncConnection.connect(dsn)
        try:
            yield Psycopg(raw, cursor=kind == "psycopg-cursor")
        finally:
            await raw.close()
    elif kind == "asyncpg":
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            yield Asyncpg(conn)
        finally:
            await conn.close()
    elif kind == "asyncpg-pool":
        import asyncpg

        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
        try:
            async with pool.acquire() as conn:
                yield Asyncpg(conn)
        finally:
            await pool.close()
    elif kind.startswith("sqlalchemy"):
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        driver = "psycopg" if kind == "sqlalchemy-psycopg" else "asyncpg"
        engine = create_async_engine(sqlalchemy_url(dsn, driver))
        try:
            if kind == "sqlalchemy-connection":
                async with engine.connect() as conn:
                    yield SQLAlchemy(conn)
            else:
                async with AsyncSession(engine) as session:
                    yield SQLAlchemy(session)
        finally:
            await engine.dispose()
    else:
        raise ValueError(kind)
