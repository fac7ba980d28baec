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


def test_a_supervisor_whose_session_ends_has_its_jobs_rescued_at_once(auto, dsn) -> None:
    awa_pool.enqueue_many(auto, [Job("k", queue="dies"), Job("k", queue="lives")])
    dying, living = _supervisor(dsn), _supervisor(dsn)
    dying_job, = _claim(dsn, "dies", dying)
    living_job, = _claim(dsn, "lives", living)
    dying_session, living_session = _session(dsn), _session(dsn)
    try:
        assert LivenessLock().take(dying_session, dying) and LivenessLock().take(living_session, living)
        service = RescueDead()
        with auto.cursor() as cur:
            assert service.tick(cur) == 0                       # both held: seen
            dying_session.close()                                # the process died
            wait_for(lambda: not _held(dsn, dying), timeout=10, message="the server to end the session")
            assert service.tick(cur) == 0                       # free once: not yet
            assert service.tick(cur) == 1                       # free twice: rescued
            assert service.tick(cur) == 0
        rescued = awa_pool.get_job(auto, dying_job)
        assert rescued.state == "available" and rescued.attempt == 1
        assert "its database session ended" in rescued.errors[0]["error"]
        assert awa_pool.get_job(auto, living_job).state == "running"
    finally:
        living_session.close()


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


def test_a_stale_session_of_the_same_supervisor_is_ended_to_take_its_lock_back(dsn) -> None:
    """A partition killed the old connection on the client side only: the
    server still holds the old session and its lock."""
    supervisor = _supervisor(dsn)
    old, new = _session(dsn), _session(dsn)
    try:
        assert LivenessLock().take(old, supervisor)
        lock = LivenessLock()
        assert lock.take(new, supervisor) and lock.held_on(new)
        assert _is_broken(old), "the old session was ended"
    finally:
        old.close()
        new.close()


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
