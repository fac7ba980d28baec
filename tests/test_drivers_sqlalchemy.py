"""SQLAlchemy 2 Sessions and Connections on the psycopg2 and psycopg (3)
dialects (SPEC §9): jobs commit or roll back with the ORM's own writes,
awa_pool starts the transaction the way SQLAlchemy's autobegin would and
never ends it, and what cannot work is refused with one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, insert, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, scoped_session, sessionmaker

import awa_pool
import awa_pool.testing
from awa_pool import Job
from conftest import ROOT
from helpers import query, scalar

DIALECTS = ("psycopg2", "psycopg")


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str]


def sqlalchemy_url(dsn: str, dialect: str) -> str:
    scheme, rest = dsn.split("://", 1)
    assert scheme in ("postgres", "postgresql"), dsn
    return f"postgresql+{dialect}://{rest}"


@pytest.fixture(params=DIALECTS)
def engine(request, dsn):
    engine = create_engine(sqlalchemy_url(dsn, request.param))
    Base.metadata.create_all(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def _jobs(dsn):
    return query(dsn, "SELECT kind, args->>'order_id' FROM awa.jobs ORDER BY id")


def _orders(dsn):
    return scalar(dsn, "SELECT count(*) FROM orders")


def _enqueue_everything(conn, order_id):
    awa_pool.enqueue(conn, Job("receipt", {"order_id": order_id}))
    awa_pool.enqueue_many(conn, [Job("line", {"order_id": order_id, "n": n}) for n in range(3)])
    batch = awa_pool.enqueue_batch(conn, [Job("part", {"order_id": order_id})],
                                   then=Job("merge", {"order_id": order_id}))
    return batch


def test_session_rollback_drops_the_jobs_and_commit_keeps_them(engine, dsn) -> None:
    with Session(engine) as session:
        order = Order(item="book")
        session.add(order)
        session.flush()
        _enqueue_everything(session, order.id)
        session.rollback()
    assert _orders(dsn) == 0 and _jobs(dsn) == []

    with Session(engine) as session:
        order = Order(item="book")
        session.add(order)
        session.flush()
        batch = _enqueue_everything(session, order.id)
        assert _jobs(dsn) == []          # not committed for the caller
        session.commit()
        order_id = order.id
    assert _orders(dsn) == 1
    assert [kind for kind, _ in _jobs(dsn)] == ["receipt", "line", "line", "line", "merge", "part"]
    assert {ref for _, ref in _jobs(dsn)} == {str(order_id)}
    assert batch.then_id is not None and len(batch.ids) == 1


def test_session_begin_block_and_scoped_session(engine, dsn) -> None:
    with Session(engine) as session, session.begin():
        session.add(Order(item="pen"))
        awa_pool.enqueue(session, Job("inside_begin"))
    factory = scoped_session(sessionmaker(engine))
    try:
        awa_pool.enqueue(factory, Job("scoped"))
        factory.commit()
    finally:
        factory.remove()
    assert [kind for kind, _ in _jobs(dsn)] == ["inside_begin", "scoped"]


def test_connection_autobegins_and_commits_only_when_the_caller_does(engine, dsn) -> None:
    with engine.connect() as conn:
        # the enqueue is the first statement: it must open the transaction
        # that conn.commit() ends, as SQLAlchemy's own autobegin would
        awa_pool.enqueue_many(conn, [Job("first"), Job("second")])
        assert conn.in_transaction()
        conn.rollback()
        assert _jobs(dsn) == []

        awa_pool.enqueue(conn, Job("kept"))
        conn.execute(insert(Order).values(item="lamp"))
        batch = awa_pool.enqueue_batch(conn, [Job("m1"), Job("m2")], then=Job("after"))
        conn.commit()
    assert [kind for kind, _ in _jobs(dsn)] == ["kept", "after", "m1", "m2"] and _orders(dsn) == 1

    with engine.begin() as conn:
        conn.execute(insert(Order).values(item="desk"))
        awa_pool.enqueue(conn, Job("in_engine_begin"))
    assert _orders(dsn) == 2 and _jobs(dsn)[-1][0] == "in_engine_begin"

    # the raw DBAPI connection the README used to suggest still works
    with Session(engine) as session:
        awa_pool.enqueue(session.connection().connection, Job("pool_proxied"))
        session.commit()
    assert _jobs(dsn)[-1][0] == "pool_proxied"
    assert len({batch.id, batch.then_id, *batch.ids}) == 4


def test_admin_wait_and_queue_depth_over_sqlalchemy(engine, dsn) -> None:
    with engine.connect() as conn:
        job_id = awa_pool.enqueue(conn, Job("to_cancel", {"x": 1}))
        assert awa_pool.get_job(conn, job_id).args == {"x": 1}
        assert awa_pool.queue_depth(conn)["default"].available == 1
        assert awa_pool.cancel_job(conn, job_id) == "cancelled"
        with pytest.raises(ValueError, match="outside a transaction"):
            awa_pool.wait(conn, [job_id], timeout=1)
        conn.commit()
        record, = awa_pool.wait(conn, [job_id], timeout=10)
        assert record.state == "cancelled" and not conn.in_transaction()
        assert [s.queue for s in awa_pool.queue_stats(conn)] == ["default"]
        conn.rollback()
    with Session(engine) as session:
        assert [r.id for r in awa_pool.list_jobs(session, state="cancelled")] == [job_id]


def test_migrate_joins_the_sqlalchemy_transaction(empty_dsn) -> None:
    for dialect in DIALECTS:
        engine = create_engine(sqlalchemy_url(empty_dsn, dialect))
        try:
            with engine.connect() as conn:
                applied = awa_pool.migrate(conn)
                conn.rollback()          # the framework owns the transaction: nothing stays
            assert applied and scalar(empty_dsn, "SELECT to_regclass('awa.jobs_hot')") is None
            with Session(engine) as session:
                awa_pool.migrate(session)
                session.commit()
            assert scalar(empty_dsn, "SELECT count(*) FROM awa.schema_migrations") == len(applied)
            with engine.begin() as conn:
                assert awa_pool.migrate(conn) == []
        finally:
            engine.dispose()
        if dialect == DIALECTS[0]:
            query(empty_dsn, "DROP SCHEMA awa CASCADE")


def test_unusable_sqlalchemy_handles_are_refused(engine, dsn) -> None:
    with pytest.raises(TypeError, match="Engine has no transaction"):
        awa_pool.enqueue(engine, Job("x"))
    closed = engine.connect()
    closed.close()
    with pytest.raises(ValueError, match="Connection passed is closed"):
        awa_pool.enqueue(closed, Job("x"))

    with engine.connect() as conn:
        with pytest.raises(Exception):
            conn.execute(text("SELECT * FROM no_such_table"))
        with pytest.raises(ValueError, match="already failed"):
            awa_pool.enqueue(conn, Job("x"))
        conn.rollback()

    with Session(engine) as session:
        session.add(Order(id=1, item="a"))
        session.commit()
        session.add(Order(id=1, item="duplicate"))
        with pytest.raises(IntegrityError):
            session.flush()
        with pytest.raises(ValueError, match=r"Session's transaction has already failed: call "
                                             r"session.rollback\(\) first"):
            awa_pool.enqueue(session, Job("x"))
        session.rollback()
        assert session.scalar(select(Order.item).where(Order.id == 1)) == "a"

    lite = create_engine("sqlite://")
    try:
        with lite.connect() as conn, pytest.raises(ValueError, match="uses sqlite"):
            awa_pool.enqueue(conn, Job("x"))
        with Session(lite) as session, pytest.raises(ValueError, match="needs postgresql"):
            awa_pool.enqueue(session, Job("x"))
    finally:
        lite.dispose()
    assert _jobs(dsn) == []


def test_the_sqlalchemy_example(empty_dsn) -> None:
    """examples/sqlalchemy_app.py on both dialects: a taken address rolls
    back its user and its job; the committed jobs run inline."""
    example = ROOT / "examples" / "sqlalchemy_app.py"
    env = dict(os.environ, DATABASE_URL=empty_dsn)
    signed = []
    for driver in DIALECTS:
        done = subprocess.run([sys.executable, str(example), "--driver", driver, f"a@{driver}",
                               f"b@{driver}", f"a@{driver}"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert [email for email, _ in result] == [f"a@{driver}", f"b@{driver}", f"a@{driver}"]
        assert result[0][1] and result[1][1] and result[2][1] is None
        signed += [job_id for _, job_id in result[:2]]
    assert scalar(empty_dsn, "SELECT count(*) FROM example_users") == 4

    sys.path.insert(0, str(example.parent))
    try:
        import sqlalchemy_app
    finally:
        sys.path.remove(str(example.parent))
    engine = create_engine(sqlalchemy_url(empty_dsn, "psycopg"))
    try:
        with Session(engine) as session:
            assert sorted(awa_pool.testing.drain(session)) == [(i, "completed") for i in sorted(signed)]
            session.commit()
        with Session(engine) as session:
            results = [awa_pool.get_job(session, i).result for i in signed]
    finally:
        engine.dispose()
    assert [r["sent_to"] for r in results] == ["a@psycopg2", "b@psycopg2", "a@psycopg", "b@psycopg"]
    assert sqlalchemy_app.send_welcome.kind == "send_welcome"
