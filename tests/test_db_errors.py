"""Which database errors end a session. psycopg2 raises OperationalError
for a lost server and also for a deadlock or a lock or statement timeout;
only the first may cost a supervisor its sessions (and with them its
liveness lock, whose loss lets the leader rescue its running jobs). The
others are retried as they are, and never fail a job."""
from __future__ import annotations

import threading
from typing import List

import psycopg2
import pytest

from awa_pool import Job
from awa_pool.core.db import LOCK_CLASS_LIVENESS, is_connection_error, is_transient
from helpers import enqueue_jobs, job_row, scalar, wait_for


def _open(dsn: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def _error_of(conn, sql: str) -> psycopg2.Error:
    with pytest.raises(psycopg2.Error) as caught:
        with conn.cursor() as cur:
            cur.execute(sql)
    return caught.value


def test_timeouts_and_deadlocks_leave_the_session_alive(dsn: str) -> None:
    holder, waiter, other = _open(dsn), _open(dsn), _open(dsn)
    try:
        with holder.cursor() as cur:
            cur.execute("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)")
        holder.autocommit = False
        with holder.cursor() as cur:
            cur.execute("SELECT * FROM t WHERE id = 1 FOR UPDATE")

        lock_timeout = _error_of(waiter, "SET lock_timeout = '50ms'; SELECT * FROM t WHERE id = 1 FOR UPDATE")
        statement_timeout = _error_of(waiter, "SET lock_timeout = 0; SET statement_timeout = '50ms'; "
                                              "SELECT pg_sleep(5)")
        for exc, code in ((lock_timeout, "55P03"), (statement_timeout, "57014")):
            assert isinstance(exc, psycopg2.OperationalError) and exc.pgcode == code
            assert not is_connection_error(exc) and is_transient(exc)
        assert scalar(dsn, "SELECT 1") == 1
        with waiter.cursor() as cur:
            cur.execute("SET statement_timeout = 0; SELECT 1")   # the session lives on
            assert cur.fetchone() == (1,)

        # a deadlock: holder has row 1 and waits for row 2, which other holds
        other.autocommit = False
        with other.cursor() as cur:
            cur.execute("SET deadlock_timeout = '50ms'; SELECT * FROM t WHERE id = 2 FOR UPDATE")
        errors: List[psycopg2.Error] = []

        def take(conn, row: int) -> None:
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT * FROM t WHERE id = %s FOR UPDATE", (row,))
            except psycopg2.Error as exc:
                errors.append(exc)
            finally:
                conn.rollback()

        first = threading.Thread(target=take, args=(holder, 2))
        first.start()
        wait_for(lambda: scalar(dsn, "SELECT count(*) FROM pg_locks WHERE NOT granted") > 0, timeout=10,
                 message="the first transaction to wait for row 2")
        take(other, 1)
        first.join(timeout=30)
        assert not first.is_alive()
        deadlock, = errors
        assert deadlock.pgcode == "40P01" and isinstance(deadlock, psycopg2.OperationalError)
        assert not is_connection_error(deadlock) and is_transient(deadlock)
    finally:
        for conn in (holder, waiter, other):
            conn.close()


def test_a_terminated_session_is_a_lost_connection(dsn: str) -> None:
    victim = _open(dsn)
    try:
        pid = victim.get_backend_pid()
        assert scalar(dsn, "SELECT pg_terminate_backend(%s)", (pid,))
        exc = _error_of(victim, "SELECT 1")
        assert is_connection_error(exc) and is_transient(exc)
    finally:
        victim.close()
    assert not is_transient(psycopg2.errors.UniqueViolation())


LIVENESS_HOLDER = """
SELECT array_agg(pid ORDER BY pid) FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND classid = %s::oid AND objsubid = 2
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


def test_a_statement_timeout_does_not_cost_a_supervisor_its_sessions(pools, dsn: str) -> None:
    """Operators often set statement_timeout per role or database. A
    supervisor whose heartbeat and claims time out behind a table lock keeps
    its sessions, so its liveness lock stays held and the leader does not
    rescue its running job (which would then run twice)."""
    database = scalar(dsn, "SELECT current_database()")
    scalar(dsn, f'ALTER DATABASE "{database}" SET statement_timeout = \'300ms\'')
    supervisor = pools.start("--queue", "default", workers=1)
    job_id, = enqueue_jobs(dsn, [Job("sleep", {"seconds": 6.0})])
    wait_for(lambda: job_row(dsn, job_id)["state"] == "running", timeout=30, message="the job to start")
    holder = wait_for(lambda: (lambda held: held if held and len(held) == 2 else None)(
        scalar(dsn, LIVENESS_HOLDER, (LOCK_CLASS_LIVENESS,))), timeout=10,
        message="the supervisor's liveness lock on its two sessions")
    blocker = psycopg2.connect(dsn)
    try:
        with blocker.cursor() as cur:
            cur.execute("SET statement_timeout = 0; LOCK TABLE awa.supervisors IN ACCESS EXCLUSIVE MODE")
        wait_for(lambda: "canceling statement due to statement timeout" in supervisor.log_path.read_text(),
                 timeout=30, message="a statement of the supervisor to time out behind the lock")
    finally:
        blocker.rollback()
        blocker.close()
    wait_for(lambda: job_row(dsn, job_id)["state"] == "completed", timeout=30, message="the job to complete")
    log = supervisor.log_path.read_text()
    assert "lost the database connection" not in log, log
    assert "leader connection failed" not in log, log
    assert scalar(dsn, LIVENESS_HOLDER, (LOCK_CLASS_LIVENESS,)) == holder
    row = job_row(dsn, job_id)
    assert row["attempt"] == 1 and not row["errors"], row
    assert supervisor.poll() is None
