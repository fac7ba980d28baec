"""The driver seam: what awa_pool's functions accept as `conn`, and the one
way they run SQL on it.

Callers pass what their code already holds: a psycopg2 or psycopg 3
connection or cursor, Django's `connection`, or an SQLAlchemy 2 Connection
or Session (psycopg2 or psycopg dialect). `adapt` finds the driver
connection underneath, refuses anything else (or a closed connection, or
one whose transaction already failed) with one line before any SQL runs,
and returns a `Link`: cursors that take the queries' `%(name)s` parameters
and return plain tuples, with JSON, UUID and timestamptz columns decoded
the same way whatever the driver or the framework configured, plus the
transaction status and LISTEN for `wait`. Nothing here commits or rolls back.

No driver or framework is imported here until a caller passes one of its
objects (found by the module its type comes from), so psycopg 3, Django
and SQLAlchemy stay optional.
"""
from __future__ import annotations

import functools
import json
import select
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, TypeVar

from .plan import Plan, Query, Rows, drive
from ..core.sql import QUERIES

ACCEPTED = ("a psycopg2 or psycopg 3 connection or cursor, Django's connection, "
            "or an SQLAlchemy Connection or Session")

# libpq's PQtransactionStatus values; both drivers report these numbers.
IDLE, ACTIVE, INTRANS, INERROR, UNKNOWN = range(5)

JSON_OIDS = (114, 3802)         # json, jsonb
JSON_ARRAY_OIDS = (199, 3807)   # json[], jsonb[]
UUID_OID, UUID_ARRAY_OID = 2950, 2951
SA_DRIVERS = ("psycopg2", "psycopg")
NO_ROWS = Rows(())

Loads = Callable[[Any], Any]
T = TypeVar("T")


class Link:
    """A caller's connection, ready for awa_pool's SQL. `framework` is
    "django" or "sqlalchemy" when a framework owns the transaction, and
    `owner` is then its Django DatabaseWrapper or SQLAlchemy Connection."""

    __slots__ = ("raw", "driver", "framework", "owner")

    def __init__(self, raw: Any, driver: str, framework: Optional[str] = None,
                 owner: Any = None) -> None:
        self.raw = raw
        self.driver = driver
        self.framework = framework
        self.owner = owner

    @contextmanager
    def cursor(self, loads: Optional[Loads] = json.loads) -> Iterator[Any]:
        """A fresh cursor in the caller's transaction (see new_cursor), closed
        on the way out."""
        cur = self.new_cursor(loads)
        try:
            yield cur
        finally:
            cur.close()

    def new_cursor(self, loads: Optional[Loads] = json.loads) -> Any:
        """A cursor with tuple rows; jsonb and json decoded with `loads`,
        uuids as str and timestamptz 'infinity' as psycopg2 does. With
        loads=None the decoders are not set up (a few microseconds, most of
        the set-up on psycopg 3): for statements that return none of those
        types, like the producer's inserts."""
        if self.driver == "psycopg2":
            return _psycopg2_cursor(self.raw, loads)
        return _psycopg_cursor(self.raw, loads)

    def run(self, plan: Plan[T]) -> T:
        """Run a plan (plan.py) on one fresh cursor in the caller's transaction."""
        cur = self.new_cursor(plan.loads)
        try:
            return drive(plan.steps, functools.partial(_execute, cur))
        finally:
            cur.close()

    @property
    def error(self) -> type:
        """The driver's base exception class (psycopg2.Error or psycopg.Error)."""
        return _driver_module(self.driver).Error

    def transaction_status(self) -> int:
        return int(self.raw.info.transaction_status)

    def in_transaction(self) -> bool:
        """True inside a transaction, including a framework's that has not
        sent a statement yet (the driver then still reports idle)."""
        if self.transaction_status() != IDLE:
            return True
        if self.framework == "django":
            return bool(self.owner.in_atomic_block)
        if self.framework == "sqlalchemy" and self.owner is not None:
            return bool(self.owner.in_transaction())
        return False

    @property
    def autocommit(self) -> bool:
        return bool(self.raw.autocommit)

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self.raw.autocommit = value

    def commit(self) -> None:
        self.raw.commit()

    def rollback(self) -> None:
        self.raw.rollback()

    def listener(self) -> "Listener":
        return Listener(self)


def _execute(cur: Any, query: Query) -> Rows:
    cur.execute(QUERIES[query.name], query.params)
    description = cur.description
    if description is None:
        return NO_ROWS
    return Rows(cur.fetchall(), tuple(column.name for column in description))


@contextmanager
def cursor_for(conn: Any, loads: Optional[Loads] = json.loads) -> Iterator[Any]:
    """A fresh cursor on whatever the caller passed (see adapt and
    Link.new_cursor), closed on the way out."""
    cur = adapt(conn).new_cursor(loads)
    try:
        yield cur
    finally:
        cur.close()


def sqlstate(exc: BaseException) -> Optional[str]:
    """The SQLSTATE of a database error from either driver, else None."""
    return getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None)


class Listener:
    """Notifications arriving on a Link's connection, for `wait`: `clear`,
    run a query, then `pending()` tells whether one came in meanwhile, and
    `wait(timeout)` sleeps on the socket until one does."""

    def __init__(self, link: Link) -> None:
        self.raw = link.raw
        self.driver = link.driver
        self.seen = False
        if self.driver == "psycopg":
            # psycopg 3 hands notifications read along with query results to
            # its handlers; without one they would pile up in its backlog.
            self.raw.add_notify_handler(self._on_notify)

    def _on_notify(self, _notify: Any) -> None:
        self.seen = True

    def clear(self) -> None:
        self.seen = False
        if self.driver == "psycopg2":
            del self.raw.notifies[:]

    def pending(self) -> bool:
        return self.seen or (self.driver == "psycopg2" and bool(self.raw.notifies))

    def wait(self, timeout: float) -> None:
        readable, _, _ = select.select([self.raw.fileno()], [], [], timeout)
        if not readable:
            return
        if self.driver == "psycopg2":
            self.raw.poll()
            return
        pgconn = self.raw.pgconn
        pgconn.consume_input()
        while pgconn.notifies() is not None:
            self.seen = True

    def close(self) -> None:
        if self.driver == "psycopg":
            self.raw.remove_notify_handler(self._on_notify)


# -- recognising what the caller passed -------------------------------------------

def adapt(conn: Any, *, begin: bool = True) -> Link:
    """The Link for a caller's connection, cursor or framework handle.

    Raises TypeError for anything that is not one, ValueError for a closed
    connection, a failed transaction or a database other than PostgreSQL.
    With begin=False an SQLAlchemy Connection is not made to start its
    transaction (wait() needs none).
    """
    family = family_of(type(conn))
    if family in ("psycopg2", "psycopg"):
        return _driver_link(conn, family, shown=conn)
    if family == "django":
        return _django_link(conn)
    if family == "sqlalchemy":
        return _sqlalchemy_link(conn, begin)
    if family == "asyncpg":
        raise TypeError(f"awa_pool's functions are synchronous; got {type_name(conn)}: await the same "
                        "functions from awa_pool.aio with it")
    raise TypeError(f"awa_pool needs {ACCEPTED}; got {type_name(conn)}")


@functools.lru_cache(maxsize=256)
def family_of(klass: type) -> Optional[str]:
    """Which library a type comes from (a subclass counts as its base's)."""
    for base in klass.__mro__:
        root = base.__module__.partition(".")[0]
        if root in ("psycopg2", "psycopg", "django", "sqlalchemy", "asyncpg"):
            return root
    return None


def type_name(obj: Any) -> str:
    klass = type(obj)
    return f"{klass.__module__}.{klass.__qualname__}"


def _driver_module(driver: str) -> Any:
    if driver == "psycopg2":
        import psycopg2

        return psycopg2
    import psycopg

    return psycopg


# type -> True for a driver connection type, False for a cursor type whose
# `.connection` is one: each type is checked once, then adapt() is a lookup.
_DRIVER_TYPES: Dict[type, bool] = {}


def _classify(obj: Any, driver: str, shown: Any) -> bool:
    if driver == "psycopg2":
        import psycopg2.extensions as ext

        connection_type, cursor_type = ext.connection, ext.cursor
    else:
        import psycopg

        connection_type, cursor_type = psycopg.Connection, psycopg.Cursor
    if isinstance(obj, connection_type):
        return True
    if isinstance(getattr(obj, "connection", None), connection_type) and \
            (driver == "psycopg" or isinstance(obj, cursor_type)):
        return False   # a cursor (psycopg 3 has several cursor classes)
    if driver == "psycopg" and "Async" in type(obj).__name__:
        raise TypeError(f"awa_pool's functions are synchronous: pass a psycopg.Connection "
                        f"or Cursor, not {type_name(obj)} (or await awa_pool.aio's functions with it)")
    raise TypeError(f"awa_pool needs {ACCEPTED}; got {type_name(shown)}")


def _driver_link(obj: Any, driver: str, shown: Any, framework: Optional[str] = None,
                 owner: Any = None) -> Link:
    """Link for a psycopg2/psycopg connection or cursor, after checking it is usable."""
    is_connection = _DRIVER_TYPES.get(type(obj))
    if is_connection is None:
        is_connection = _DRIVER_TYPES[type(obj)] = _classify(obj, driver, shown)
    raw = obj if is_connection else obj.connection
    if raw.closed:
        raise ValueError(f"the connection passed ({type_name(shown)}) is closed")
    status = raw.info.transaction_status
    if status == INERROR:
        raise ValueError(f"the transaction of the connection passed ({type_name(shown)}) has already "
                         "failed (an earlier statement raised an error): roll it back first")
    if status == UNKNOWN:
        raise ValueError(f"the connection passed ({type_name(shown)}) is broken")
    return Link(raw, driver, framework, owner)


def _django_link(obj: Any) -> Link:
    # django.db.connection is a proxy that forwards attributes to the
    # DatabaseWrapper; a Django CursorWrapper knows its wrapper as `.db`.
    wrapper = obj
    if not hasattr(wrapper, "ensure_connection") and hasattr(wrapper, "db"):
        wrapper = wrapper.db
    if not (hasattr(wrapper, "ensure_connection") and hasattr(wrapper, "in_atomic_block")):
        raise TypeError(f"awa_pool needs {ACCEPTED}; got {type_name(obj)}")
    vendor = getattr(wrapper, "vendor", None)
    if vendor != "postgresql":
        raise ValueError(f"the Django connection {wrapper.alias!r} is a {vendor} database: "
                         "awa_pool needs PostgreSQL")
    if wrapper.in_atomic_block and wrapper.needs_rollback:
        raise ValueError("the Django atomic() block has already failed (an earlier query raised "
                         "an error): leave the block, or roll back to a savepoint, first")
    wrapper.ensure_connection()
    raw = wrapper.connection
    family = family_of(type(raw))
    if family not in ("psycopg2", "psycopg"):
        raise ValueError(f"the Django connection {wrapper.alias!r} uses {type_name(raw)}: "
                         "awa_pool needs the psycopg2 or psycopg 3 driver")
    return _driver_link(raw, family, shown=obj, framework="django", owner=wrapper)


def _sqlalchemy_link(obj: Any, begin: bool) -> Link:
    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.exc import PendingRollbackError
    from sqlalchemy.orm import Session, scoped_session

    if isinstance(obj, scoped_session):
        obj = obj()
    if isinstance(obj, Session):
        try:
            sa_conn = obj.connection()   # begins the session's transaction, as a query would
            owner = None                 # a Session is always in a transaction: ask the driver
        except PendingRollbackError:
            raise ValueError("the SQLAlchemy Session's transaction has already failed: call "
                             "session.rollback() first") from None
    elif isinstance(obj, Connection):
        if obj.closed or obj.invalidated:
            raise ValueError(f"the SQLAlchemy Connection passed is "
                             f"{'closed' if obj.closed else 'invalidated'}")
        transaction = obj.get_transaction()
        if transaction is not None and not transaction.is_active:
            raise ValueError("the SQLAlchemy Connection's transaction has already failed: "
                             "roll it back first")
        if begin and transaction is None:
            obj.begin()   # what SQLAlchemy's own autobegin does on the first statement
        sa_conn = owner = obj
    elif isinstance(obj, Engine):
        raise TypeError("an SQLAlchemy Engine has no transaction to join: pass "
                        "engine.connect() / engine.begin(), or a Session")
    elif hasattr(obj, "driver_connection"):   # a pool's DBAPI connection (conn.connection)
        return _sqlalchemy_raw(obj.driver_connection, obj, owner=None)
    elif type(obj).__module__.startswith("sqlalchemy.ext.asyncio"):
        raise TypeError(f"awa_pool's functions are synchronous; got {type_name(obj)}: await the same "
                        "functions from awa_pool.aio with it")
    else:
        raise TypeError(f"awa_pool needs {ACCEPTED}; got {type_name(obj)}")
    dialect = sa_conn.dialect
    if dialect.name != "postgresql" or dialect.driver not in SA_DRIVERS:
        raise ValueError(f"the SQLAlchemy connection uses {dialect.name}+{dialect.driver}: awa_pool "
                         "needs postgresql+psycopg2 or postgresql+psycopg")
    return _sqlalchemy_raw(sa_conn.connection.driver_connection, obj, owner)


def _sqlalchemy_raw(raw: Any, shown: Any, owner: Any) -> Link:
    family = family_of(type(raw))
    if family not in ("psycopg2", "psycopg"):
        raise ValueError(f"the SQLAlchemy connection uses {type_name(raw)}: awa_pool needs "
                         "postgresql+psycopg2 or postgresql+psycopg")
    return _driver_link(raw, family, shown=shown, framework="sqlalchemy", owner=owner)


# -- cursors --------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _psycopg2_casters(loads: Loads) -> Tuple[Any, ...]:
    import psycopg2.extensions as ext

    def decode(value: Optional[str], _cur: Any) -> Any:
        return None if value is None else loads(value)

    json_caster = ext.new_type(JSON_OIDS, "AWA_JSON", decode)
    uuid_caster = ext.new_type((UUID_OID,), "AWA_UUID", lambda value, _cur: value)
    return (json_caster, ext.new_array_type(JSON_ARRAY_OIDS, "AWA_JSON_ARRAY", json_caster),
            uuid_caster, ext.new_array_type((UUID_ARRAY_OID,), "AWA_UUID_ARRAY", uuid_caster))


def _psycopg2_cursor(raw: Any, loads: Optional[Loads]) -> Any:
    import psycopg2.extensions as ext

    # the base class: a caller's cursor_factory (dict rows, logging) must not change our rows
    cur = raw.cursor(cursor_factory=ext.cursor)
    if loads is not None:
        for caster in _psycopg2_casters(loads):
            ext.register_type(caster, cur)
    return cur


@functools.lru_cache(maxsize=1)
def _psycopg_timestamptz_loader() -> type:
    from psycopg.types.datetime import TimestamptzLoader

    class InfinityTimestamptzLoader(TimestamptzLoader):
        """'infinity' (a held batch follow-up's run_at) as psycopg2 loads it,
        instead of psycopg 3's DataError."""

        def load(self, data: Any) -> Any:
            text = bytes(data)
            if text == b"infinity":
                return datetime.max.replace(tzinfo=timezone.utc)
            if text == b"-infinity":
                return datetime.min.replace(tzinfo=timezone.utc)
            return super().load(data)

    return InfinityTimestamptzLoader


def _psycopg_cursor(raw: Any, loads: Optional[Loads]) -> Any:
    import psycopg

    # Client-side binding, as psycopg2 does it: parameters become literals
    # whose types the server infers from the query, so each query means the
    # same on both drivers, and nothing is prepared on the caller's
    # connection. A server-side prepared `SELECT * FROM awa.jobs` fails with
    # "cached plan must not change result type" once a migration changes the
    # view, and a transaction-mode pooler loses prepared statements.
    return psycopg_rows(psycopg.ClientCursor, raw, loads)


def psycopg_rows(cursor_class: type, raw: Any, loads: Optional[Loads]) -> Any:
    """A psycopg 3 cursor (sync or async class) with tuple rows and the
    decoding new_cursor describes, whatever the caller's connection set up."""
    from psycopg.rows import tuple_row
    from psycopg.types.json import set_json_loads
    from psycopg.types.string import TextLoader

    cur = cursor_class(raw, row_factory=tuple_row)
    if loads is not None:
        set_json_loads(loads, cur)
        cur.adapters.register_loader("uuid", TextLoader)
        cur.adapters.register_loader("timestamptz", _psycopg_timestamptz_loader())
    return cur
