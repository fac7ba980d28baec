"""One owner of scheduling state (SPEC §7): the loop's thread alone writes
the children's table, the claimer, the job times and the weighted turns,
whatever the completer, leader and watchdog threads do meanwhile; and a
Pool changes no interpreter-wide setting of the program that embeds it.
(tests/test_code_rules.py checks that the other threads' modules cannot
even reach that state.)"""
from __future__ import annotations

import sys
import threading

import psycopg2
import pytest

import awa_pool
from awa_pool import Job
from awa_pool.core.config import PoolConfig
from awa_pool.supervisor import Supervisor
from awa_pool.worker import ownership
from helpers import enqueue_jobs, states, wait_for


def test_only_the_loops_thread_writes_the_scheduling_state(dsn, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AWA_TEST_LOG_DIR", str(tmp_path))
    assert ownership.checking(), "the suite runs every supervisor with the owner check on (conftest.py)"
    violations_before = len(ownership.violations)
    interval = sys.getswitchinterval()
    sup = Supervisor(PoolConfig(dsn=dsn, workers=2, app="apps.basic", heartbeat_interval=0.2))
    loop = threading.Thread(target=sup.run, name="loop")
    loop.start()
    try:
        wait_for(lambda: sup.state == "running", timeout=30, message="the supervisor to start")
        assert ownership.owner_of(sup.children) == loop.ident
        assert ownership.owner_of(sup.claimer) == loop.ident
        # batched no-op jobs (refills, overtakes), jobs of 20 ms (one per free
        # child), priority-1 jobs (rushes), progress, a retry and a cancel:
        # every path that writes scheduling state, with the other threads busy
        enqueue_jobs(dsn, [Job("noop", {"i": i}) for i in range(300)])
        enqueue_jobs(dsn, [Job("sleep", {"seconds": 0.02}) for _ in range(20)]
                       + [Job("noop", {"urgent": i}, priority=1) for i in range(20)]
                       + [Job("progress", {"steps": 3}), Job("retry_then_ok", {"times": 1})])
        (cancelled,) = enqueue_jobs(dsn, [Job("cancel_me")])
        wait_for(lambda: states(dsn).get("running", 0) or states(dsn).get("completed", 0) > 300, timeout=30,
                 message="jobs to run")
        conn = psycopg2.connect(dsn)
        try:
            awa_pool.cancel_job(conn, cancelled)
            conn.commit()
        finally:
            conn.close()
        wait_for(lambda: states(dsn).get("completed", 0) >= 342 and not states(dsn).get("running"),
                 timeout=60, message="every job to end")
        # the check is armed: the same write from this thread is refused
        with pytest.raises(ownership.WrongThread):
            sup.claimer.rushes = 0
        with pytest.raises(ownership.WrongThread):
            sup.children.all()[0].refill_wanted = True
    finally:
        sup.request_shutdown()
        loop.join(60)
    assert not loop.is_alive(), "the supervisor did not stop"
    assert ownership.violations[violations_before:] == [
        "Claimer.rushes written from thread 'MainThread', not the loop's",
        "ChildHandle.refill_wanted written from thread 'MainThread', not the loop's"]
    assert sys.getswitchinterval() == interval, "the pool changed the program's switch interval"
