"""Every public function that takes `conn`, called with a psycopg 3
Connection or Cursor (SPEC §9): the work joins the caller's transaction,
nothing commits for the caller, NOTIFY reaches listeners only at commit,
`wait` sleeps on the psycopg 3 socket, and a closed, failed, async or
foreign connection is refused with one line before any SQL runs."""
from __future__ import annotations

import asyncio
import itertools
import os
import select
import sqlite3
import threading
import time
from datetime import datetime, timedelta, timezone

import psycopg
import psycopg2
import pytest
from psycopg.rows import dict_row

import apps.basic  # noqa: F401  (registers "add" and "fail" for drain)
import apps.features  # noqa: F401  (registers "cb_wait")
import awa_pool
from awa_pool import Job, JobState, UnknownCallback, testing
from awa_pool.api import grants
from awa_pool.ops import stats
from awa_pool.api import periodic_admin
from awa_pool.core.periodic import make_schedule
from helpers import connection, query, scalar, wait_for


ROLES = itertools.count()


@pytest.fixture(params=["connection", "cursor"])
def pg3(request, dsn):
    """(psycopg 3 connection, what the test passes as conn). The cursor comes
    from a connection with dict rows: awa_pool's own rows must not change."""
    if request.param == "connection":
        conn = psycopg.connect(dsn)
        handle = conn
    else:
        conn = psycopg.connect(dsn, row_factory=dict_row)
        handle = conn.cursor()
    try:
        yield conn, handle
    finally:
        conn.close()


def _kinds(dsn):
    return sorted(row[0] for row in query(dsn, "SELECT kind FROM awa.jobs"))


def _producer_calls(handle):
    """Each producer function once; returns the ids it created."""
    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    ids = [awa_pool.enqueue(handle, Job("now", {"n": 1})),
           awa_pool.enqueue(handle, Job("full", {"a": [1, 2], "s": "it's 100%"}, queue="q1",
                                         priority=4, run_at=soon, max_attempts=3, timeout=12.5,
                                         tags=["x", "y"], metadata={"m": True},
                                         ordering_key="key", unique=awa_pool.Unique()))]
    ids += awa_pool.enqueue_many(handle, [Job("many", {"n": n}) for n in range(3)])
    ids += awa_pool.enqueue_many(handle, [Job("mixed", {"n": 0}, delay=60),
                                          Job("mixed", {"n": 1}, priority=1)])
    batch = awa_pool.enqueue_batch(handle, [Job("member", {"i": i}) for i in range(2)],
                                   then=Job("reduce"))
    ids += list(batch.ids) + [batch.then_id]
    ids.append(apps.basic.add.enqueue(handle, a=1, b=2))
    return ids


def test_producers_join_the_callers_transaction(pg3, dsn) -> None:
    conn, handle = pg3
    _producer_calls(handle)
    conn.rollback()
    assert _kinds(dsn) == []

    ids = _producer_calls(handle)
    assert _kinds(dsn) == []  # nothing committed for the caller
    conn.commit()
    assert len(set(ids)) == 11 and len(_kinds(dsn)) == 11
    with connection(dsn) as check:
        full = awa_pool.get_job(check, ids[1])
        # every record reads the same through psycopg 3 as through psycopg2,
        # the held batch follow-up's 'infinity' run_at included
        assert awa_pool.list_jobs(handle) == awa_pool.list_jobs(check)
        assert [awa_pool.get_job(handle, i) for i in ids] == [awa_pool.get_job(check, i) for i in ids]
        assert awa_pool.get_job(handle, ids[-2]).run_at.year == 9999
    assert (full.queue, full.priority, full.max_attempts, full.timeout) == ("q1", 4, 3, 12.5)
    assert full.args == {"a": [1, 2], "s": "it's 100%"} and full.tags == ("x", "y")
    assert full.metadata == {"m": True} and full.ordering_key == "key" and full.state == "scheduled"
    # a unique duplicate through psycopg 3 finds the psycopg2-visible original
    again = awa_pool.enqueue(handle, Job("full", {"a": [1, 2], "s": "it's 100%"}, queue="q1",
                                         unique=awa_pool.Unique()))
    assert again == ids[1]


def test_notify_reaches_listeners_only_at_commit(dsn) -> None:
    with connection(dsn, autocommit=True) as listener, psycopg.connect(dsn) as conn:
        listener.cursor().execute("LISTEN awa_jobs")

        def notified(within: float) -> bool:
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                if select.select([listener], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    listener.poll()
                    if listener.notifies:
                        listener.notifies.clear()
                        return True
            return False

        awa_pool.enqueue(conn, Job("n1"))
        assert not notified(0.3), "NOTIFY before commit"
        conn.rollback()
        assert not notified(0.3), "NOTIFY after a rollback"
        awa_pool.enqueue_many(conn, [Job("n2"), Job("n3")])
        conn.commit()
        assert notified(10.0), "no NOTIFY within 10 s of the commit"


def _dead_letter(handle, dsn):
    """A job that failed in a queue with the dead-letter option, run inline."""
    with connection(dsn, autocommit=True) as setup:
        setup.cursor().execute("INSERT INTO awa.queues (name, dlq) VALUES ('mail', true)")
    job_id = awa_pool.enqueue(handle, Job("fail", {"message": "smtp down"}, queue="mail",
                                          max_attempts=1))
    assert testing.drain(handle, queue="mail") == [(job_id, "failed")]
    return job_id


def test_admin_functions(pg3, dsn) -> None:
    conn, handle = pg3
    first = awa_pool.enqueue(handle, Job("a", {"x": 1}, tags=["t"]))
    second = awa_pool.enqueue(handle, Job("b", queue="other", delay=3600))
    record = awa_pool.get_job(handle, first)
    assert record.state == JobState.AVAILABLE and record.args == {"x": 1} and record.tags == ("t",)
    assert isinstance(record.created_at, datetime) and record.created_at.tzinfo is not None
    assert awa_pool.get_job(handle, 10**12) is None
    assert [r.id for r in awa_pool.list_jobs(handle)] == [second, first]
    assert [r.id for r in awa_pool.list_jobs(handle, state="scheduled", queue="other", kind="b",
                                             newer_than="1h")] == [second]
    assert awa_pool.list_jobs(handle, older_than=3600) == []

    assert awa_pool.cancel_job(handle, first) == JobState.CANCELLED
    assert awa_pool.retry_job(handle, first) == JobState.AVAILABLE
    awa_pool.pause_queue(handle, "other")
    by_name = {s.queue: s for s in awa_pool.queue_stats(handle)}
    assert by_name["other"].paused and by_name["other"].scheduled == 1
    assert by_name["default"].available == 1
    awa_pool.resume_queue(handle, "other")
    assert not {s.queue: s for s in awa_pool.queue_stats(handle)}["other"].paused
    assert awa_pool.set_queue_shards(handle, "default", 2) == 1

    lettered = _dead_letter(handle, dsn)
    assert [r.id for r in awa_pool.dlq_list(handle)] == [lettered]
    assert [r.id for r in awa_pool.dlq_list(handle, queue="mail", kind="fail", limit=5)] == [lettered]
    assert awa_pool.dlq_retry(handle, ids=[lettered]) == 1
    assert testing.drain(handle, queue="mail") == [(lettered, "failed")]
    assert awa_pool.dlq_purge(handle, queue="nope") == 0
    assert awa_pool.dlq_purge(handle, ids=[lettered]) == 1
    conn.rollback()
    assert _kinds(dsn) == []  # every change above was in the caller's transaction


def test_callbacks_and_inline_drain(pg3, dsn) -> None:
    conn, handle = pg3
    ids = [awa_pool.enqueue(handle, Job("cb_wait", {"label": str(n)})) for n in range(4)]
    assert sorted(testing.drain(handle)) == sorted((i, "waiting_external") for i in ids)
    callbacks = [awa_pool.get_job(handle, i).callback_id for i in ids]
    assert all(isinstance(cb, str) for cb in callbacks)

    assert awa_pool.complete_external(handle, callbacks[0], {"answer": 42}) == JobState.COMPLETED
    assert awa_pool.get_job(handle, ids[0]).result == {"answer": 42}
    assert awa_pool.fail_external(handle, callbacks[1], "card declined") == JobState.RETRYABLE
    assert awa_pool.retry_external(handle, callbacks[2]) == JobState.AVAILABLE
    assert awa_pool.resume_external(handle, callbacks[3], {"go": 1}) == JobState.AVAILABLE
    ran = dict(testing.drain(handle))
    assert ran[ids[3]] == "completed" and ran[ids[2]] == "waiting_external"
    assert awa_pool.get_job(handle, ids[3]).result == {"resumed_with": {"go": 1}, "attempt": 1}

    # a refused callback leaves the caller's transaction usable (savepoint)
    with pytest.raises(UnknownCallback, match="already used"):
        awa_pool.complete_external(handle, callbacks[0])
    with pytest.raises(UnknownCallback):
        awa_pool.complete_external(handle, "00000000-0000-0000-0000-000000000000")
    assert awa_pool.get_job(handle, ids[0]).state == "completed"
    conn.commit()
    assert scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (ids[0],)) == "completed"


def test_stats_periodic_admin_and_grants(pg3, dsn) -> None:
    conn, handle = pg3
    awa_pool.enqueue_many(handle, [Job("s", queue="q1"), Job("s", queue="q1", delay=60)])
    depth = awa_pool.queue_depth(handle)
    assert depth["q1"].available == 1 and depth["q1"].scheduled == 1 and depth["q1"].total == 2
    assert awa_pool.queue_depth(handle, ["q1", "empty"])["empty"].total == 0
    assert [s.queue for s in stats.queue_stats(handle)] == ["q1"]
    assert stats.live_supervisors(handle) == [] and stats.kind_stats(handle) == []
    assert stats.queue_known(handle, "q1") and not stats.queue_known(handle, "zz")

    schedule = make_schedule("nightly", "0 2 * * *", "s", {"fmt": "pdf"}, timezone="Europe/Paris")
    assert periodic_admin.register_schedules(handle, [schedule]) == 1
    info, = periodic_admin.list_schedules(handle)
    assert info.args == {"fmt": "pdf"} and info.next_fire_at is not None and not info.paused
    periodic_admin.pause_schedule(handle, "nightly")
    assert periodic_admin.list_schedules(handle, "nightly")[0].paused
    periodic_admin.resume_schedule(handle, "nightly")
    fired = periodic_admin.trigger_schedule(handle, "nightly")
    assert awa_pool.get_job(handle, fired).metadata["awa:trigger"] == "manual"
    with pytest.raises(periodic_admin.UnknownSchedule):
        periodic_admin.pause_schedule(handle, "nope")

    role = f"awa_drv_{os.getpid()}_{next(ROLES)}"   # roles are server-wide: one per test
    conn.execute(f'CREATE ROLE "{role}"')
    grants.grant_producer(handle, role)
    assert any(p.name.startswith("awa.insert_job") for p in grants.privileges(handle, role))
    conn.rollback()  # the role and its grants go with the transaction
    assert awa_pool.queue_depth(handle) == {}


def test_migrate_commits_on_a_bare_psycopg3_connection(empty_dsn) -> None:
    with psycopg.connect(empty_dsn) as conn:
        applied = awa_pool.migrate(conn)
        assert applied and applied == sorted(applied)
        # committed: another session sees the schema
        assert scalar(empty_dsn, "SELECT count(*) FROM awa.schema_migrations") == len(applied)
        assert awa_pool.migrate(conn.cursor()) == []
    with psycopg.connect(empty_dsn, autocommit=True) as auto:
        with pytest.raises(ValueError, match="autocommit"):
            awa_pool.migrate(auto)


def _backend_waiting(dsn, pid):
    """True once backend `pid` is idle after reading the waited-for jobs."""
    rows = query(dsn, "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,))
    return bool(rows) and rows[0][0] == "idle" and "awa.jobs WHERE id = ANY" in rows[0][1]


def test_wait_wakes_on_notify_over_a_psycopg3_connection(dsn) -> None:
    with psycopg.connect(dsn) as conn:
        job_id = awa_pool.enqueue(conn, Job("slow"))
        conn.commit()
        pid = conn.info.backend_pid

        def cancel_once_waiting():
            wait_for(lambda: _backend_waiting(dsn, pid), timeout=20, message="wait() to block")
            with connection(dsn) as other:
                awa_pool.cancel_job(other, job_id)
                other.commit()

        canceller = threading.Thread(target=cancel_once_waiting, daemon=True)
        canceller.start()
        started = time.monotonic()
        record, = awa_pool.wait(conn, [job_id], timeout=30)
        elapsed = time.monotonic() - started
        canceller.join(timeout=30)
        assert record.state == "cancelled"
        # the NOTIFY woke it: the recheck cap (5 s) would take longer
        assert elapsed < awa_pool.api.admin.WAIT_RECHECK_S, f"wait() took {elapsed:.2f}s"
        assert not conn.autocommit  # restored

        other_id = awa_pool.enqueue(conn, Job("never_runs"))
        with pytest.raises(ValueError, match="outside a transaction"):
            awa_pool.wait(conn, [other_id], timeout=1)
        conn.commit()
        with pytest.raises(TimeoutError, match="not finished"):
            awa_pool.wait(conn.cursor(), [other_id], timeout=0.3)


def test_a_real_pool_runs_jobs_enqueued_and_waited_for_over_psycopg3(dsn, pools) -> None:
    pools.start(workers=2)
    with psycopg.connect(dsn) as conn:
        ids = awa_pool.enqueue_many(conn, [apps.basic.add.job(a=n, b=1) for n in range(5)])
        conn.commit()
        records = awa_pool.wait(conn, ids, timeout=60)
    assert [r.result for r in records] == [{"sum": n + 1} for n in range(5)]


def test_unusable_connections_are_refused_before_any_sql(dsn) -> None:
    closed = psycopg.connect(dsn)
    closed.close()
    with pytest.raises(ValueError, match="is closed"):
        awa_pool.enqueue(closed, Job("x"))

    with psycopg.connect(dsn) as failed:
        with pytest.raises(psycopg.errors.UndefinedTable):
            failed.execute("SELECT * FROM no_such_table")
        for call in (lambda c: awa_pool.enqueue(c, Job("x")), lambda c: awa_pool.get_job(c, 1),
                     lambda c: awa_pool.queue_depth(c), awa_pool.migrate):
            with pytest.raises(ValueError, match="already failed.*roll it back first"):
                call(failed)
            with pytest.raises(ValueError, match="already failed"):
                call(failed.cursor())
        failed.rollback()
        assert awa_pool.enqueue(failed, Job("after_rollback"))

    async def async_connections():
        aconn = await psycopg.AsyncConnection.connect(dsn)
        try:
            with pytest.raises(TypeError, match="synchronous"):
                awa_pool.enqueue(aconn, Job("x"))
        finally:
            await aconn.close()
        import asyncpg

        apg = await asyncpg.connect(dsn)
        try:
            with pytest.raises(TypeError, match=r"got asyncpg\.connection\.Connection"):
                awa_pool.enqueue(apg, Job("x"))
        finally:
            await apg.close()

    asyncio.run(async_connections())
    lite = sqlite3.connect(":memory:")
    for bad in (lite, object(), dsn):
        with pytest.raises(TypeError) as caught:
            awa_pool.get_job(bad, 1)
        message = str(caught.value)
        assert "\n" not in message and "psycopg2 or psycopg 3 connection or cursor" in message
        assert "SQLAlchemy Connection or Session" in message
    assert _kinds(dsn) == ["after_rollback"]
