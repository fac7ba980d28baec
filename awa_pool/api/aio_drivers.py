"""The asyncio seam: what awa_pool.aio's functions accept as `conn`, and the
one way they run a plan (plan.py) on it.

Callers pass what their async code holds: a psycopg 3 AsyncConnection or
AsyncCursor, an asyncpg Connection (or a pool's connection proxy), or an
SQLAlchemy AsyncConnection or AsyncSession (asyncpg or psycopg dialect).
`adapt_async` finds the driver connection underneath and refuses anything
else, a synchronous connection included (the message names the sync API),
or a closed one, with one line before any SQL runs. Nothing here commits,
rolls back, blocks or hands work to a thread: every statement is awaited
on the driver's own non-blocking connection.

psycopg 3 runs the plans' `%(name)s` queries with client-side binding and
the decoders of the synchronous seam (drivers.psycopg_rows), so its rows
are the sync ones. asyncpg needs its own statement form and types,
converted here once per statement (see `positional` and `_Decoder`).

No driver or framework is imported until a caller passes one of its
objects: `import awa_pool.aio` loads no psycopg, asyncpg or SQLAlchemy.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import struct
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from .drivers import IDLE, INERROR, NO_ROWS, UNKNOWN, family_of, psycopg_rows, type_name
from .plan import Loads, Plan, Query, Rows, drive_async
from ..core.sql import QUERIES

ACCEPTED = ("a psycopg 3 AsyncConnection or AsyncCursor, an asyncpg Connection, "
            "or an SQLAlchemy AsyncConnection or AsyncSession")
SA_ASYNC_DRIVERS = ("asyncpg", "psycopg")
DONE_CHANNEL = "awa_done"   # what listen_done LISTENs to and awa.notify_done notifies
OUTSIDE_TRANSACTION = (
    "the asyncpg connection is not in a transaction, so the job would commit on its own at "
    "once: enqueue inside `async with conn.transaction():` to commit it with your writes")
JSON_PROBE_TEXT = '"probe"'     # what json_codec_probe returns through asyncpg's default codec
CODEC_MEMORY = 256              # asyncpg connections whose json codec is remembered

T = TypeVar("T")


class AsyncLink:
    """A caller's async connection, ready for awa_pool's plans. `framework`
    is "sqlalchemy" when SQLAlchemy owns the transaction, and `owner` is
    then its AsyncConnection."""

    def __init__(self, raw: Any, framework: Optional[str] = None, owner: Any = None) -> None:
        self.raw = raw
        self.framework = framework
        self.owner = owner

    async def run(self, plan: Plan[T]) -> T:
        raise NotImplementedError

    def driver_in_transaction(self) -> bool:
        raise NotImplementedError

    def listening(self, loads: Loads) -> "contextlib.AbstractAsyncContextManager[_Watch]":
        """For wait(): the connection in autocommit, LISTENing (see _Watch),
        its rows decoded with `loads`; as it was again on the way out."""
        raise NotImplementedError

    def in_transaction(self) -> bool:
        """True inside a transaction, including SQLAlchemy's before its first statement."""
        if self.driver_in_transaction():
            return True
        return self.owner is not None and bool(self.owner.in_transaction())


# -- psycopg 3 ------------------------------------------------------------------------

class PsycopgLink(AsyncLink):
    async def run(self, plan: Plan[T]) -> T:
        import psycopg

        cur = psycopg_rows(psycopg.AsyncClientCursor, self.raw, plan.loads)
        try:
            return await drive_async(plan.steps, functools.partial(_psycopg_execute, cur))
        finally:
            await cur.close()

    def driver_in_transaction(self) -> bool:
        return int(self.raw.info.transaction_status) != IDLE

    @contextlib.asynccontextmanager
    async def listening(self, loads: Loads) -> AsyncIterator["_Watch"]:
        import psycopg

        autocommit = self.raw.autocommit
        await self.raw.set_autocommit(True)
        cur = psycopg_rows(psycopg.AsyncClientCursor, self.raw, loads)
        watch = _PsycopgWatch(self.raw, cur)
        try:
            yield await watch.start(self.raw.info.backend_pid)
        finally:
            try:
                await watch.stop()
            finally:
                await cur.close()
                await self.raw.set_autocommit(autocommit)


async def _psycopg_execute(cur: Any, query: Query) -> Rows:
    await cur.execute(QUERIES[query.name], query.params)
    description = cur.description
    if description is None:
        return NO_ROWS
    return Rows(await cur.fetchall(), tuple(column.name for column in description))


# -- asyncpg --------------------------------------------------------------------------

_PARAMETER = re.compile(r"%\((\w+)\)s(::jsonb?(?![\w\[]))?|%%")


@functools.lru_cache(maxsize=None)
def positional(statement: str) -> Tuple[str, Tuple[str, ...]]:
    """A `%(name)s` query in asyncpg's form: `$n` parameters (a name used
    twice is one parameter), `%%` as `%`, and a parameter cast to jsonb or
    json sent as text (`$n::text::jsonb`): the server parses awa_pool's
    JSON text itself, and a jsonb codec the caller set on the connection
    does not encode it a second time. Returns the statement and the
    parameter names in `$n` order."""
    names: List[str] = []

    def replace(match: "re.Match[str]") -> str:
        if match.group(0) == "%%":
            return "%"
        name = match.group(1)
        if name not in names:
            names.append(name)
        number = names.index(name) + 1
        return f"${number}::text{match.group(2)}" if match.group(2) else f"${number}"

    return _PARAMETER.sub(replace, statement), tuple(names)


# statement -> its columns' type names (asyncpg rows carry no types): what
# _Decoder needs, learnt once per process from a prepared statement.
_COLUMN_TYPES: Dict[str, Tuple[str, ...]] = {}
# the connection's settings -> whether its json codec decodes (see _json_decoded)
_JSON_DECODED: "OrderedDict[Any, bool]" = OrderedDict()


class AsyncpgLink(AsyncLink):
    async def run(self, plan: Plan[T]) -> T:
        if plan.writes and self.framework is None and not self.raw.is_in_transaction():
            raise ValueError(OUTSIDE_TRANSACTION)
        decoder = None if plan.loads is None else _Decoder(plan.loads, await self._json_decoded())
        return await drive_async(plan.steps, functools.partial(self.execute, decoder))

    def driver_in_transaction(self) -> bool:
        return bool(self.raw.is_in_transaction())

    async def execute(self, decoder: Optional["_Decoder"], query: Query) -> Rows:
        statement, names = positional(QUERIES[query.name])
        args = [query.params[name] for name in names]
        types = _COLUMN_TYPES.get(statement) if decoder is not None else ()
        if types is None:
            types, records = await self._learn_types(statement, args)
        else:
            records = await self.raw.fetch(statement, *args)
        if not records:
            return NO_ROWS
        columns = tuple(records[0].keys())
        if decoder is None:
            return Rows(records, columns)   # ids and counts: asyncpg's values as they come
        if len(types) != len(columns):      # the schema changed under this process: learn again (reads only)
            types, records = await self._learn_types(statement, args)
        return Rows(decoder.rows(records, types), columns)

    async def _learn_types(self, statement: str, args: List[Any]) -> Tuple[Tuple[str, ...], List[Any]]:
        """Run a statement through a prepared statement of its own, to learn
        its columns' types. It must run at once: asyncpg prepares with a
        Flush, not a Sync, and the server then holds an implicit transaction
        open (and its notifications back) until the next statement."""
        prepared = await self.raw.prepare(statement)
        types = _COLUMN_TYPES[statement] = tuple(a.type.name for a in prepared.get_attributes())
        return types, await prepared.fetch(*args)

    async def _json_decoded(self) -> bool:
        """Does this connection's jsonb codec hand back decoded values? asyncpg's
        own returns JSON text; SQLAlchemy's asyncpg dialect (and many apps)
        set one that decodes. Asked once per connection (by its settings
        object, which a pool's proxies share) with a probe query."""
        settings = self.raw.get_settings()
        decoded = _JSON_DECODED.get(settings)
        if decoded is None:
            decoded = await self.raw.fetchval(QUERIES["json_codec_probe"]) != JSON_PROBE_TEXT
            _JSON_DECODED[settings] = decoded
            while len(_JSON_DECODED) > CODEC_MEMORY:
                _JSON_DECODED.popitem(last=False)
        return decoded

    @contextlib.asynccontextmanager
    async def listening(self, loads: Loads) -> AsyncIterator["_Watch"]:
        # outside a transaction, asyncpg runs each statement in autocommit
        watch = _AsyncpgWatch(self, _Decoder(loads, await self._json_decoded()))
        try:
            yield await watch.start(self.raw.get_server_pid())
        finally:
            await watch.stop()


_INFINITY = {datetime.max: datetime.max.replace(tzinfo=timezone.utc),
             datetime.min: datetime.min.replace(tzinfo=timezone.utc)}


def _shortest_real(value: float) -> float:
    """A real (float4) as PostgreSQL prints it, and so as the sync drivers
    read it: the shortest decimal that is the same float4 (0.1, not
    asyncpg's exact 0.10000000149011612)."""
    single = struct.unpack("f", struct.pack("f", value))[0]
    for digits in range(1, 10):
        shortest = float(f"{value:.{digits}g}")
        if struct.unpack("f", struct.pack("f", shortest))[0] == single:
            return shortest
    return value


class _Decoder:
    """asyncpg rows decoded as the sync seam decodes them: json and jsonb
    with the plan's loads (unless the connection's codec already decoded
    them), uuid as str, real as its shortest decimal, a timestamptz of
    'infinity' as an aware datetime.max (asyncpg gives a naive one)."""

    def __init__(self, loads: Loads, json_decoded: bool) -> None:
        self.by_type: Dict[str, Callable[[Any], Any]] = {
            "uuid": str, "float4": _shortest_real, "timestamptz": lambda v: _INFINITY.get(v, v)}
        if not json_decoded:
            self.by_type["json"] = self.by_type["jsonb"] = loads

    def rows(self, records: Sequence[Any], types: Tuple[str, ...]) -> List[tuple]:
        converters = [(i, self.by_type[name]) for i, name in enumerate(types) if name in self.by_type]
        decoded = []
        for record in records:
            row = list(record)
            for i, convert in converters:
                if row[i] is not None:
                    row[i] = convert(row[i])
            decoded.append(tuple(row))
        return decoded


# -- waiting (LISTEN) -----------------------------------------------------------------

class _Watch:
    """A connection set up for wait(): autocommit, LISTENing for terminal
    jobs unless behind a pooler, and a way to sleep until a notification."""

    listening = False

    async def start(self, connect_pid: int) -> "_Watch":
        # Through a pooler (its answer to the connect names another backend)
        # a LISTEN would stay behind on a server session other clients share.
        rows = await self.look(Query("backend_pid", {}))
        self.listening = rows.values[0][0] == connect_pid
        if self.listening:
            await self._listen()
        return self

    async def stop(self) -> None:
        if self.listening:
            await self._unlisten()

    async def look(self, query: Query) -> Rows:
        raise NotImplementedError

    async def _listen(self) -> None:
        raise NotImplementedError

    async def _unlisten(self) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def pending(self) -> bool:
        raise NotImplementedError

    async def sleep(self, timeout: float) -> None:
        raise NotImplementedError


class _PsycopgWatch(_Watch):
    """As drivers.Listener: notifications read along with a query's result
    reach the handler; between queries it sleeps until the socket is
    readable (the event loop's reader, not a thread) and reads them there."""

    def __init__(self, raw: Any, cur: Any) -> None:
        self.raw, self.cur, self.seen = raw, cur, False
        raw.add_notify_handler(self._on_notify)

    def _on_notify(self, _notify: Any) -> None:
        self.seen = True

    async def look(self, query: Query) -> Rows:
        return await _psycopg_execute(self.cur, query)

    async def _listen(self) -> None:
        await self.cur.execute(QUERIES["listen_done"])

    async def _unlisten(self) -> None:
        await self.cur.execute(QUERIES["unlisten_done"])

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            self.raw.remove_notify_handler(self._on_notify)

    def clear(self) -> None:
        self.seen = False

    def pending(self) -> bool:
        return self.seen

    async def sleep(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        fd = self.raw.fileno()
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await asyncio.wait_for(readable, timeout)
        except asyncio.TimeoutError:
            return
        finally:
            loop.remove_reader(fd)
        pgconn = self.raw.pgconn
        pgconn.consume_input()
        while pgconn.notifies() is not None:
            self.seen = True


class _AsyncpgWatch(_Watch):
    """asyncpg hands each notification to a listener callback on the loop."""

    def __init__(self, link: AsyncpgLink, decoder: _Decoder) -> None:
        self.link, self.decoder = link, decoder
        self.arrived = asyncio.Event()

    def _on_notify(self, *_args: Any) -> None:
        self.arrived.set()

    async def look(self, query: Query) -> Rows:
        return await self.link.execute(self.decoder, query)

    async def _listen(self) -> None:
        await self.link.raw.add_listener(DONE_CHANNEL, self._on_notify)
        await self.link.raw.execute(QUERIES["listen_done"])

    async def _unlisten(self) -> None:
        try:
            await self.link.raw.execute(QUERIES["unlisten_done"])
        finally:
            await self.link.raw.remove_listener(DONE_CHANNEL, self._on_notify)

    def clear(self) -> None:
        self.arrived.clear()

    def pending(self) -> bool:
        return self.arrived.is_set()

    async def sleep(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.arrived.wait(), timeout)
        except asyncio.TimeoutError:
            pass


# -- recognising what the caller passed ---------------------------------------------

async def adapt_async(conn: Any, *, begin: bool = True) -> AsyncLink:
    """The AsyncLink for a caller's async connection, cursor or session.

    Raises TypeError for anything else (a synchronous connection's message
    names awa_pool's sync functions), ValueError for a closed connection,
    a failed transaction or a database other than PostgreSQL. With
    begin=False an SQLAlchemy AsyncConnection is not made to start its
    transaction (wait() needs none).
    """
    family = family_of(type(conn))
    if family == "asyncpg":
        return _asyncpg_link(conn, conn)
    if family == "psycopg":
        return _psycopg_link(conn, conn)
    if family == "sqlalchemy":
        return await _sqlalchemy_link(conn, begin)
    if family in ("psycopg2", "django"):
        raise TypeError(_synchronous(conn))
    raise TypeError(f"awa_pool.aio needs {ACCEPTED}; got {type_name(conn)}")


def _synchronous(obj: Any) -> str:
    return (f"awa_pool.aio's functions are awaited on an async connection; got {type_name(obj)}: "
            "call the same functions from awa_pool with it")


def _asyncpg_link(obj: Any, shown: Any, framework: Optional[str] = None, owner: Any = None) -> AsyncLink:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    if isinstance(obj, asyncpg.Pool):
        raise TypeError("an asyncpg Pool has no transaction to join: pass a connection "
                        "(async with pool.acquire() as conn)")
    if not isinstance(obj, (asyncpg.Connection, PoolConnectionProxy)):
        raise TypeError(f"awa_pool.aio needs {ACCEPTED}; got {type_name(shown)}")
    try:
        closed = obj.is_closed()
    except asyncpg.InterfaceError:   # a pool's proxy, after the connection went back to the pool
        raise ValueError(f"the connection passed ({type_name(shown)}) was released to its pool") from None
    if closed:
        raise ValueError(f"the connection passed ({type_name(shown)}) is closed")
    return AsyncpgLink(obj, framework, owner)


def _psycopg_link(obj: Any, shown: Any, framework: Optional[str] = None, owner: Any = None) -> AsyncLink:
    import psycopg

    if isinstance(obj, psycopg.AsyncConnection):
        raw = obj
    elif isinstance(getattr(obj, "connection", None), psycopg.AsyncConnection):
        raw = obj.connection   # one of psycopg's async cursor classes
    elif isinstance(obj, psycopg.Connection) or isinstance(getattr(obj, "connection", None), psycopg.Connection):
        raise TypeError(_synchronous(shown))
    else:
        raise TypeError(f"awa_pool.aio needs {ACCEPTED}; got {type_name(shown)}")
    if raw.closed:
        raise ValueError(f"the connection passed ({type_name(shown)}) is closed")
    status = raw.info.transaction_status
    if status == INERROR:
        raise ValueError(f"the transaction of the connection passed ({type_name(shown)}) has already "
                         "failed (an earlier statement raised an error): roll it back first")
    if status == UNKNOWN:
        raise ValueError(f"the connection passed ({type_name(shown)}) is broken")
    return PsycopgLink(raw, framework, owner)


async def _sqlalchemy_link(obj: Any, begin: bool) -> AsyncLink:
    from sqlalchemy.exc import PendingRollbackError
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_scoped_session

    if isinstance(obj, async_scoped_session):
        obj = obj()
    if isinstance(obj, AsyncSession):
        try:
            sa_conn = await obj.connection()   # begins the session's transaction, as a query would
        except PendingRollbackError:
            raise ValueError("the SQLAlchemy AsyncSession's transaction has already failed: await "
                             "session.rollback() first") from None
    elif isinstance(obj, AsyncConnection):
        if obj.closed or obj.invalidated:
            raise ValueError(f"the SQLAlchemy AsyncConnection passed is "
                             f"{'closed' if obj.closed else 'invalidated'}")
        transaction = obj.get_transaction()
        if transaction is not None and not transaction.is_active:
            raise ValueError("the SQLAlchemy AsyncConnection's transaction has already failed: "
                             "roll it back first")
        if begin and transaction is None:
            await obj.begin()   # what SQLAlchemy's autobegin does on the first statement
        sa_conn = obj
    elif isinstance(obj, AsyncEngine):
        raise TypeError("an SQLAlchemy AsyncEngine has no transaction to join: pass "
                        "engine.connect() / engine.begin(), or an AsyncSession")
    elif type(obj).__module__.startswith(("sqlalchemy.orm", "sqlalchemy.engine")):
        raise TypeError(_synchronous(obj))
    else:
        raise TypeError(f"awa_pool.aio needs {ACCEPTED}; got {type_name(obj)}")
    dialect = sa_conn.dialect
    if dialect.name != "postgresql" or dialect.driver not in SA_ASYNC_DRIVERS:
        raise ValueError(f"the SQLAlchemy connection uses {dialect.name}+{dialect.driver}: awa_pool.aio "
                         "needs postgresql+asyncpg or postgresql+psycopg")
    raw = (await sa_conn.get_raw_connection()).driver_connection
    if family_of(type(raw)) == "asyncpg":
        link = _asyncpg_link(raw, obj, "sqlalchemy", sa_conn)
        if begin and sa_conn.in_transaction() and not raw.is_in_transaction():
            # SQLAlchemy's asyncpg adapter sends its BEGIN with the first
            # statement it runs, not at begin(): run one, so that awa_pool's
            # statements join that transaction instead of committing alone.
            # (Still none after it: the engine is in AUTOCOMMIT, as chosen.)
            await sa_conn.exec_driver_sql(QUERIES["start_transaction"])
        return link
    return _psycopg_link(raw, obj, "sqlalchemy", sa_conn)

