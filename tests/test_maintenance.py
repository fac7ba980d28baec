"""Each leader maintenance service's tick() on its own against a real
database, and the Maintenance runner (intervals, a failing service)."""
from __future__ import annotations

import json
import select
from typing import List, Optional

import psycopg2
import psycopg2.extensions
import pytest

import awa_pool
from awa_pool import Job
from awa_pool.worker.maintenance import (ExpireCallbacks, FireCron, ForgetSupervisors, Maintenance, PromoteDue,
                                  RescueDeadlines, RescueLost, Retention, Service, VacuumQueueTables,
                                  default_services)
from helpers import job_row, query, scalar, wait_for


def _supervisor(dsn: str, *, heartbeat_age_s: float = 0.0, stopped_age_s: Optional[float] = None) -> int:
    return scalar(dsn, "INSERT INTO awa.supervisors (hostname, pid, version, workers, heartbeat_at, stopped_at) "
                       "VALUES ('test', 1, 'test', 1, now() - make_interval(secs => %s), "
                       "now() - make_interval(secs => %s)) RETURNING id", (heartbeat_age_s, stopped_age_s))


def _claim(dsn: str, queue: str, supervisor_id: int, limit: int = 1) -> List[tuple]:
    """Claim like a supervisor: [(id, lease)]."""
    return [(row[0], row[7]) for row in query(dsn, "SELECT * FROM awa.claim(%s, %s, %s)",
                                              (queue, limit, supervisor_id))]


def _tick(auto, service: Service) -> int:
    with auto.cursor() as cur:
        return service.tick(cur)


def test_promote_moves_due_jobs_and_wakes_their_queue(auto, dsn) -> None:
    due, later = awa_pool.enqueue_many(auto, [Job("a", queue="q1", delay=3600), Job("b", queue="q1", delay=3600)])
    retry = awa_pool.enqueue(auto, Job("c", queue="q2"))
    sup = _supervisor(dsn)
    (_, lease), = _claim(dsn, "q2", sup)
    query(dsn, "SELECT * FROM awa.settle_jobs(%s::jsonb)",
          (json.dumps([{"id": retry, "lease": lease, "outcome": "retry", "delay_s": 3600}]),))
    assert job_row(dsn, retry)["state"] == "retryable"
    query(dsn, "UPDATE awa.jobs_deferred SET run_at = now() - interval '1 second' WHERE id IN (%s, %s)",
          (due, retry))
    listener = psycopg2.connect(dsn)
    listener.autocommit = True
    try:
        with listener.cursor() as cur:
            cur.execute("LISTEN awa_jobs")
        assert _tick(auto, PromoteDue()) == 2
        assert job_row(dsn, due)["state"] == "available" and job_row(dsn, retry)["state"] == "available"
        assert job_row(dsn, later)["state"] == "scheduled"

        def woken() -> set:
            select.select([listener], [], [], 0.1)
            listener.poll()
            return {n.payload for n in listener.notifies}

        wait_for(lambda: woken() >= {"q1", "q2"}, timeout=5, message="NOTIFY for both queues")
    finally:
        listener.close()
    assert _tick(auto, PromoteDue()) == 0


def test_promotion_keeps_going_while_full_batches_come_back(auto, dsn) -> None:
    """A tick promotes batch after batch until one comes back short or its
    time budget is spent; with work left it asks the runner to run it again
    at once instead of after its interval."""
    awa_pool.enqueue_many(auto, [Job("a", queue="due", delay=3600) for _ in range(7)])
    query(dsn, "UPDATE awa.jobs_deferred SET run_at = now() - interval '1 second'")
    assert _tick(auto, PromoteDue(batch=2)) == 7   # 2 + 2 + 2 + 1: all in one tick
    awa_pool.enqueue_many(auto, [Job("a", queue="due", delay=3600) for _ in range(5)])
    query(dsn, "UPDATE awa.jobs_deferred SET run_at = now() - interval '1 second'")
    budgeted = PromoteDue(batch=2, budget_s=0.0)   # one batch per tick
    runner = Maintenance([budgeted])
    with auto.cursor() as cur:
        assert runner.run_due(cur) == 0.0 and budgeted.more   # more to do: due again now
        runner.run_due(cur)
        runner.run_due(cur)
        assert not budgeted.more and runner.run_due(cur) > 0.0
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_hot WHERE queue = 'due'") == 12


def test_rescue_lost_requeues_jobs_of_dead_supervisors_only(auto, dsn) -> None:
    ids = awa_pool.enqueue_many(auto, [Job("k", queue=q, max_attempts=m) for q, m in
                                       (("dead", 5), ("stopped", 5), ("alive", 5), ("last", 1))])
    dead = _supervisor(dsn, heartbeat_age_s=60)
    stopped = _supervisor(dsn, stopped_age_s=1)
    alive = _supervisor(dsn)
    (dead_job, old_lease), = _claim(dsn, "dead", dead)
    _claim(dsn, "stopped", stopped)
    (alive_job, _), = _claim(dsn, "alive", alive)
    (last_job, _), = _claim(dsn, "last", dead)

    assert _tick(auto, RescueLost(stale_s=10)) == 3
    rescued = awa_pool.get_job(auto, dead_job)
    assert rescued.state == "available" and rescued.attempt == 1
    assert len(rescued.errors) == 1 and "supervisor lost" in rescued.errors[0]["error"]
    assert rescued.errors[0]["attempt"] == 1
    assert rescued.attempts[0]["outcome"] == "lost"
    assert "stopped without settling" in awa_pool.get_job(auto, ids[1]).errors[0]["error"]
    assert awa_pool.get_job(auto, alive_job).state == "running"
    assert awa_pool.get_job(auto, last_job).state == "failed", "no attempts left"

    # the job runs again elsewhere; the old owner's late completion matches nothing
    (again, new_lease), = _claim(dsn, "dead", alive)
    assert again == dead_job and new_lease == old_lease + 1
    assert awa_pool.get_job(auto, dead_job).attempt == 2
    before = job_row(dsn, dead_job)
    assert query(dsn, "SELECT * FROM awa.complete_jobs(%s, %s, '{1}', '{1}', '{1}')",
                 ([dead_job], [old_lease])) == []
    assert query(dsn, "SELECT * FROM awa.settle_jobs(%s::jsonb)", (json.dumps(
        [{"id": dead_job, "lease": old_lease, "outcome": "failed", "error": "late"}]),)) == []
    assert job_row(dsn, dead_job) == before
    assert _tick(auto, RescueLost(stale_s=10)) == 0


def test_rescue_deadlines_is_a_backstop_past_the_grace(auto, dsn) -> None:
    late, recent, no_timeout = awa_pool.enqueue_many(auto, [Job("k", queue="t", timeout=1)] * 2 +
                                                     [Job("k", queue="t")])
    sup = _supervisor(dsn)
    _claim(dsn, "t", sup, limit=3)
    query(dsn, "UPDATE awa.jobs_hot SET deadline = now() - interval '60 seconds' WHERE id = %s", (late,))
    query(dsn, "UPDATE awa.jobs_hot SET deadline = now() - interval '10 seconds' WHERE id = %s", (recent,))
    assert _tick(auto, RescueDeadlines(grace_s=30)) == 1
    record = awa_pool.get_job(auto, late)
    assert record.state == "retryable" and "deadline exceeded" in record.errors[0]["error"]
    assert awa_pool.get_job(auto, recent).state == "running"
    assert awa_pool.get_job(auto, no_timeout).state == "running"


def test_expire_callbacks_fails_the_attempt(auto, dsn) -> None:
    job_id = awa_pool.enqueue(auto, Job("k", queue="cb"))
    other = awa_pool.enqueue(auto, Job("k", queue="cb"))
    sup = _supervisor(dsn)
    for jid, lease in _claim(dsn, "cb", sup, limit=2):
        query(dsn, "UPDATE awa.jobs_hot SET callback_id = gen_random_uuid(), "
                   "callback_timeout_at = now() + interval '1 hour' WHERE id = %s", (jid,))
        query(dsn, "SELECT * FROM awa.settle_jobs(%s::jsonb)",
              (json.dumps([{"id": jid, "lease": lease, "outcome": "wait"}]),))
    assert job_row(dsn, job_id)["state"] == "waiting_external"
    callback = str(job_row(dsn, job_id)["callback_id"])
    query(dsn, "UPDATE awa.jobs_deferred SET callback_timeout_at = now() - interval '1 second' WHERE id = %s",
          (job_id,))
    assert _tick(auto, ExpireCallbacks()) == 1
    record = awa_pool.get_job(auto, job_id)
    assert record.state == "retryable" and record.errors[-1]["error"] == "callback timed out"
    assert job_row(dsn, other)["state"] == "waiting_external"
    with pytest.raises(awa_pool.UnknownCallback):
        awa_pool.complete_external(auto, callback, {"late": True})
    assert _tick(auto, ExpireCallbacks()) == 0


def test_forget_supervisors_keeps_owners_of_running_jobs(auto, dsn) -> None:
    gone = _supervisor(dsn, heartbeat_age_s=7200, stopped_age_s=7200)
    silent_owner = _supervisor(dsn, heartbeat_age_s=7200)
    fresh = _supervisor(dsn)
    awa_pool.enqueue(auto, Job("k", queue="f"))
    _claim(dsn, "f", silent_owner)
    assert _tick(auto, ForgetSupervisors(after_s=3600)) == 1
    assert sorted(r[0] for r in query(dsn, "SELECT id FROM awa.supervisors")) == sorted([silent_owner, fresh])
    assert gone not in [r[0] for r in query(dsn, "SELECT id FROM awa.supervisors")]


class _Counting(Service):
    def __init__(self, name: str, interval: float) -> None:
        self.name = name
        self.interval = interval
        self.calls = 0

    def tick(self, cur) -> int:
        self.calls += 1
        return 0


class _Broken(Service):
    name = "broken"
    interval = 0.0

    def tick(self, cur) -> int:
        cur.execute("SELECT 1 / 0")
        return 0


def test_maintenance_runs_due_services_and_survives_a_failing_one(auto) -> None:
    fast, slow = _Counting("fast", 0.25), _Counting("slow", 3600.0)
    runner = Maintenance([_Broken(), fast, slow])
    with auto.cursor() as cur:
        for step in range(3):
            runner.run_due(cur, now=1000.0 + step * 0.25)
    assert (fast.calls, slow.calls) == (3, 1), "each service on its own interval"
    assert runner.last_error is not None and "division by zero" in runner.last_error
    runner.reset()
    with auto.cursor() as cur:
        runner.run_due(cur)
    assert slow.calls == 2, "a new leader runs everything at once"
    assert runner.get("fast") is fast


def test_services_due_together_run_in_one_pass_and_an_overrun_skips_missed_steps(auto) -> None:
    quarter, second, odd = _Counting("quarter", 0.25), _Counting("second", 1.0), _Counting("odd", 0.6)
    runner = Maintenance([quarter, second, odd])
    passes = []
    with auto.cursor() as cur:
        now = 1000.0
        while now < 1002.0:
            before = (quarter.calls, second.calls, odd.calls)
            wait = runner.run_due(cur, now=now)
            passes.append((round(now - 1000.0, 3), tuple(a - b for a, b in zip(
                (quarter.calls, second.calls, odd.calls), before))))
            now = min(runner.next_run.values())
            assert wait == pytest.approx(0.25, abs=0.01)
    # one pass per grid step, each running every service due at it (the
    # 0.6 s one rounded up to the grid: 0.75, 1.5)
    assert [at for at, _ in passes] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75], passes
    assert dict(passes)[0.0] == (1, 1, 1) and dict(passes)[1.0] == (1, 1, 0) and dict(passes)[0.75] == (1, 0, 1)
    with auto.cursor() as cur:
        runner.run_due(cur, now=1003.1)   # 1.1 s late: the next pass is the next step, not a burst
        assert runner.run_due(cur, now=1003.1) == pytest.approx(0.15, abs=0.01)


def test_maintenance_lets_a_lost_session_through(dsn) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        query(dsn, "SELECT pg_terminate_backend(%s)", (conn.get_backend_pid(),))
        runner = Maintenance([PromoteDue()])
        with pytest.raises(psycopg2.Error):
            with conn.cursor() as cur:
                runner.run_due(cur)
    finally:
        conn.close()


def test_default_services_cover_every_duty() -> None:
    services = default_services(heartbeat_staleness=10, retention_completed=60, retention_failed=120)
    names = [s.name for s in services]
    assert names == ["promote", "rescue_dead", "rescue_lost", "rescue_deadlines", "expire_callbacks",
                     "expire_jobs", "forget_supervisors", "fire_cron", "retention", "vacuum_queue_tables",
                     "live_census"]
    retention = services[-3]
    assert isinstance(retention, Retention)
    assert (retention.completed_s, retention.failed_s) == (60, 120)
    assert isinstance(services[-4], FireCron) and services[-4].interval <= 0.5
    assert next(s for s in services if s.name == "rescue_lost").stale_s == 10


def test_vacuum_service_vacuums_the_claim_table_once_dead_tuples_pile_up(dsn) -> None:
    import time as _time

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT awa.insert_jobs((SELECT jsonb_agg(jsonb_build_object('kind', 'v')) "
                        "FROM generate_series(1, 3000)))")
            cur.execute("DELETE FROM awa.jobs_hot")
            service = VacuumQueueTables(dead_threshold=1000)

            def dead():
                cur.execute("SELECT n_dead_tup FROM pg_stat_user_tables "
                            "WHERE schemaname = 'awa' AND relname = 'jobs_hot'")
                return cur.fetchone()[0]

            deadline = _time.monotonic() + 20
            while dead() < 3000 and _time.monotonic() < deadline:
                _time.sleep(0.1)  # cumulative statistics reach pg_stat within a second or so
            assert dead() >= 3000
            cur.execute("SELECT pg_relation_size('awa.jobs_hot')")
            size_before = cur.fetchone()[0]
            assert service.tick(cur) == 1
            assert dead() == 0
            # every page is empty now, yet vacuum keeps them: giving them back
            # would take an ACCESS EXCLUSIVE lock that stalls every claim
            cur.execute("SELECT pg_relation_size('awa.jobs_hot')")
            assert cur.fetchone()[0] == size_before > 0
            assert service.tick(cur) == 0  # nothing to do below the threshold
    finally:
        conn.close()
