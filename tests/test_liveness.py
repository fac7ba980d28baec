"""The liveness lock and the leader's fast rescue (awa_pool/liveness.py),
driven step by step on a real database: a supervisor's lock is held on a
session of its own; closing that session frees it, and the leader rescues
that supervisor's running jobs once it has seen the lock held and then
free twice in a row. A lock never seen held (after a server restart or a
failover: the leader's view is per connection) does not count."""
from __future__ import annotations

from typing import List

import psycopg2

import awa_pool
from awa_pool import Job
from awa_pool.core.db import LOCK_CLASS_LIVENESS
from awa_pool.worker.liveness import DeadSupervisors, LivenessLock
from awa_pool.worker.maintenance import RescueDead, default_services
from helpers import query, scalar, wait_for


def _supervisor(dsn: str) -> int:
    return scalar(dsn, "INSERT INTO awa.supervisors (hostname, pid, version, workers) "
                       "VALUES ('test', 1, 'test', 1) RETURNING id")


def _claim(dsn: str, queue: str, supervisor_id: int) -> List[int]:
    return [row[0] for row in query(dsn, "SELECT * FROM awa.claim(%s, 1, %s)", (queue, supervisor_id))]


def _held(dsn: str, supervisor_id: int) -> bool:
    return bool(scalar(dsn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                            " AND classid = %s::oid AND objid = %s::oid AND objsubid = 2"
                            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                       (LOCK_CLASS_LIVENESS, supervisor_id)))


def _session(dsn: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def _hold(dsn: str, supervisor_id: int) -> List[psycopg2.extensions.connection]:
    """A live supervisor's two sessions holding its lock (LISTEN and leader)."""
    sessions = [_session(dsn), _session(dsn)]
    assert all(LivenessLock().take(session, supervisor_id) for session in sessions)
    return sessions


def test_a_supervisor_whose_sessions_end_has_its_jobs_rescued_at_once(auto, dsn) -> None:
    awa_pool.enqueue_many(auto, [Job("k", queue="dies"), Job("k", queue="lives")])
    dying, living = _supervisor(dsn), _supervisor(dsn)
    dying_job, = _claim(dsn, "dies", dying)
    living_job, = _claim(dsn, "lives", living)
    dying_sessions, living_sessions = _hold(dsn, dying), _hold(dsn, living)
    try:
        service = RescueDead()
        with auto.cursor() as cur:
            assert service.tick(cur) == 0                       # both held by two sessions: seen
            for session in dying_sessions:                      # the process died
                session.close()
            wait_for(lambda: not _held(dsn, dying), timeout=10, message="the server to end the sessions")
            assert service.tick(cur) == 0                       # free once: not yet
            assert service.tick(cur) == 1                       # free twice: rescued
            assert service.tick(cur) == 0
        rescued = awa_pool.get_job(auto, dying_job)
        assert rescued.state == "available" and rescued.attempt == 1
        assert "its database session ended" in rescued.errors[0]["error"]
        assert awa_pool.get_job(auto, living_job).state == "running"
    finally:
        for session in living_sessions:
            session.close()


def test_a_lock_never_seen_held_does_not_count(auto, dsn) -> None:
    """After a restart or failover every lock is free until its owner is
    back: only a lock seen held on the leader's current connection counts."""
    awa_pool.enqueue(auto, Job("k", queue="q"))
    supervisor = _supervisor(dsn)
    job, = _claim(dsn, "q", supervisor)
    view = DeadSupervisors()
    with auto.cursor() as cur:
        for _ in range(3):
            assert view.observe(cur) == {}
        session = _session(dsn)
        LivenessLock().take(session, supervisor)
        view.observe(cur)
        view.forget()                                            # the leader reconnected
        session.close()
        wait_for(lambda: not _held(dsn, supervisor), timeout=10, message="the server to end the session")
        assert view.observe(cur) == {} and view.observe(cur) == {}
    assert awa_pool.get_job(auto, job).state == "running"


def test_the_lock_is_free_only_once_every_session_holding_it_ended(auto, dsn) -> None:
    """A supervisor holds its lock on two sessions (its LISTEN and leader
    sessions): one of them ending (pg_terminate_backend, a pooler restart)
    leaves it held, and the leader rescues nothing; only when both ended
    (the process is gone) are its jobs rescued. The leader never rescues
    its own supervisor."""
    awa_pool.enqueue_many(auto, [Job("k", queue="two"), Job("k", queue="own")])
    supervisor, own = _supervisor(dsn), _supervisor(dsn)
    job, = _claim(dsn, "two", supervisor)
    own_job, = _claim(dsn, "own", own)
    (first, second), own_sessions = _hold(dsn, supervisor), _hold(dsn, own)
    try:
        service = RescueDead(spare=own)
        with auto.cursor() as cur:
            assert service.tick(cur) == 0                         # held: seen
            cur.execute("SELECT pg_terminate_backend(%s)", (first.info.backend_pid,))
            wait_for(lambda: _is_broken(first), timeout=10, message="the first session to end")
            assert _held(dsn, supervisor), "the second session still holds the lock"
            assert [service.tick(cur) for _ in range(3)] == [0, 0, 0]
            assert awa_pool.get_job(auto, job).state == "running"
            for session in own_sessions + [second]:               # both processes are gone
                session.close()
            wait_for(lambda: not _held(dsn, supervisor) and not _held(dsn, own), timeout=10,
                     message="the server to end the sessions")
            assert [service.tick(cur) for _ in range(3)] == [0, 1, 0]
        assert awa_pool.get_job(auto, job).state == "available"
        assert awa_pool.get_job(auto, own_job).state == "running", "the leader's own supervisor is spared"
    finally:
        for conn in (first, second, *own_sessions):
            conn.close()


def test_a_lock_seen_on_one_session_only_is_left_to_the_heartbeat(auto, dsn) -> None:
    """A supervisor still reconnecting its other session (after a server
    restart, or just starting) holds its lock on one: that one ending may
    be a session ended, not a process gone, so the fast path leaves it to
    the heartbeat staleness (a server restart once cost a live supervisor
    its jobs this way: its leader session was ended while its loop was
    still reconnecting)."""
    awa_pool.enqueue(auto, Job("k", queue="q"))
    supervisor = _supervisor(dsn)
    job, = _claim(dsn, "q", supervisor)
    session = _session(dsn)
    assert LivenessLock().take(session, supervisor)
    service = RescueDead()
    with auto.cursor() as cur:
        assert service.tick(cur) == 0
        session.close()
        wait_for(lambda: not _held(dsn, supervisor), timeout=10, message="the server to end the session")
        assert [service.tick(cur) for _ in range(3)] == [0, 0, 0]
    assert awa_pool.get_job(auto, job).state == "running"


def _is_broken(conn: psycopg2.extensions.connection) -> bool:
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
        return False
    except psycopg2.Error:
        return True


def test_the_fast_rescue_runs_first_and_every_quarter_second() -> None:
    services = default_services(heartbeat_staleness=10)
    assert [s.name for s in services][:3] == ["promote", "rescue_dead", "rescue_lost"]
    assert next(s for s in services if s.name == "rescue_dead").interval == 0.25
