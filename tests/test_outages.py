"""The database goes away or stops answering while supervisors hold jobs
(SPEC §5): the loop keeps reaping children and keeps their outcomes, a
loop turn that waits too long is logged with the statement and what its
backend waited for, and no job whose outcome could not be written runs
twice — not by a rescue after a server restart, not by the leader's own
supervisor's rescue. Supervisors run in this process, in threads (no
signal handlers there; they stop through request_shutdown)."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator, List

import psycopg2
import pytest

import awa_pool
from awa_pool import Job
from awa_pool.core.config import PoolConfig
from awa_pool.supervisor import Supervisor
from helpers import exec_records, query, scalar, wait_for

pytestmark = pytest.mark.xdist_group("outages")

OUTAGE_S = 12.0   # longer than the heartbeat staleness (10 s): a rescue by age would fire


@contextmanager
def running(configs: List[PoolConfig]) -> Iterator[List[Supervisor]]:
    """Supervisors started one after the other (the first leads), each
    looping in a thread of its own; stopped and joined on the way out."""
    sups, threads = [], []
    try:
        for config in configs:
            sup = Supervisor(config)
            thread = threading.Thread(target=sup.run, name=f"loop-{len(sups)}", daemon=True)
            thread.start()
            sups.append(sup)
            threads.append(thread)
            wait_for(lambda: sup.state == "running", timeout=30, message="a supervisor to start")
            if len(sups) == 1:
                wait_for(lambda: sup.leader is not None and sup.leader.is_leader, timeout=30,
                         message="the first supervisor to lead")
        yield sups
    finally:
        for sup in sups:
            sup.request_shutdown()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads), "a supervisor did not stop"


def _gated_jobs(dsn: str, tmp_path, count: int) -> "tuple[list, object]":
    gate = tmp_path / "gate"
    conn = psycopg2.connect(dsn)
    try:
        ids = awa_pool.enqueue_many(conn, [Job("gate", {"gate": str(gate), "log": str(tmp_path / "starts.log")}, queue="gates")
                                           for _ in range(count)])
        conn.commit()
    finally:
        conn.close()
    return ids, gate


def _starts(tmp_path) -> Counter:
    path = tmp_path / "starts.log"
    return Counter(int(line.split()[1]) for line in path.read_text().splitlines()) if path.exists() else Counter()


def test_a_server_restart_while_outcomes_wait_runs_each_job_once(private_server, tmp_path) -> None:
    """Three children (two supervisors) finish their jobs while the server
    is down, for longer than the heartbeat staleness; when it is back, each
    job is completed once: the leader takes no job from a supervisor that
    is still alive (the first session back found every heartbeat
    `OUTAGE_S` old), its own least of all."""
    dsn = private_server.url("outage")
    configs = [PoolConfig(dsn=dsn, workers=workers, app="apps.gates", connect_timeout=60) for workers in (1, 2)]
    ids, gate = _gated_jobs(dsn, tmp_path, 3)
    with running(configs) as sups:
        wait_for(lambda: len(_starts(tmp_path)) == 3, timeout=30, message="every child to start its job")
        private_server.stop("fast")
        gate.touch()   # the jobs end while no outcome can be written
        wait_for(lambda: [sup.completer.pending for sup in sups] if sum(
            sup.completer.pending for sup in sups) == 3 else None, timeout=30,
            message="the supervisors to hold the three outcomes")
        time.sleep(OUTAGE_S)   # the outage itself
        private_server.start()
        wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE state = 'completed'") == 3,
                 timeout=60, message="the three jobs to be completed after the restart")
    starts = _starts(tmp_path)
    assert sorted(starts) == sorted(ids) and set(starts.values()) == {1}, f"a job ran twice: {starts}"
    assert query(dsn, "SELECT count(*) FROM awa.jobs WHERE attempt = 1 AND id = ANY(%s)", (ids,)) == [(3,)]


def _each_job_ran_once_but_the_killed_one(dsn: str, log_dir, ids) -> None:
    """Every job completed once; the job of the child the test killed (if
    it ran one) started twice, its first attempt counted as a crash."""
    starts = Counter(job_id for kind, job_id, *_ in exec_records(log_dir) if kind == "sleep_start")
    ends = Counter(job_id for kind, job_id, *_ in exec_records(log_dir) if kind == "sleep")
    attempts = dict(query(dsn, "SELECT id, attempt FROM awa.jobs WHERE id = ANY(%s)", (ids,)))
    crashed = [job_id for job_id in ids if attempts[job_id] > 1]
    assert len(crashed) <= 1, f"only the killed child's job may need a second attempt: {attempts}"
    assert all(ends[job_id] == 1 for job_id in ids), f"a job completed twice: {ends}"
    assert all(starts[job_id] == attempts[job_id] for job_id in ids), f"a job started twice: {starts}"


def test_a_pooler_that_stops_answering_bounds_the_loop_and_children_are_still_reaped(
        private_server, tmp_path, monkeypatch, caplog) -> None:
    """The main and completer sessions go through a PgBouncer that is
    SIGSTOPped: the loop's statement gets no answer. The watchdog logs the
    stalled turn with the statement and its backend, then cuts the
    connection; the loop reconnects in bounded attempts, and between them
    it reaps a child killed meanwhile, keeping every outcome. When the
    pooler answers again, every job ends, none ran twice."""
    from pgbouncer import PgBouncer, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("AWA_TEST_LOG_DIR", str(tmp_path))
    dsn = private_server.url("outage")   # on TCP, which the pooler (run as the server's user) can reach
    bouncer = PgBouncer("127.0.0.1", "127.0.0.1", private_server.port, "session")
    config = PoolConfig(dsn=bouncer.url("outage"), session_dsn=dsn, workers=2, app="apps.basic",
                        heartbeat_interval=0.5, heartbeat_staleness=60.0)
    conn = psycopg2.connect(dsn)
    ids = awa_pool.enqueue_many(conn, [Job("sleep", {"seconds": 0.4}) for _ in range(12)])
    conn.commit()
    conn.close()
    caplog.set_level(logging.WARNING, logger="awa_pool")
    try:
        with running([config]) as (sup,):
            wait_for(lambda: sup.children.summary()["busy"] == 2, timeout=30, message="both children busy")
            victim = sup.children.all()[0].pid
            os.kill(bouncer.process.pid, signal.SIGSTOP)
            try:
                stopped_at = time.monotonic()
                os.kill(victim, signal.SIGKILL)
                wait_for(lambda: sup.counters.get("child_died", 0) == 1, timeout=20,
                         message="the loop to reap the killed child while the pooler does not answer")
                wait_for(lambda: sup.watchdog.stalls and sup.watchdog.cuts, timeout=20,
                         message="the watchdog to log the stalled turn and cut its connection")
                assert time.monotonic() - stopped_at < 25
            finally:
                os.kill(bouncer.process.pid, signal.SIGCONT)
            wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE state = 'completed'") == 12,
                     timeout=60, message="every job to end once the pooler answers again")
    finally:
        bouncer.stop()
    stall = [r.getMessage() for r in caplog.records if "loop turn has taken" in r.getMessage()]
    assert stall and "waits on" in stall[0] and "backend" in stall[0], stall
    _each_job_ran_once_but_the_killed_one(dsn, tmp_path, ids)


def test_a_lock_the_loop_waits_on_bounds_its_turn_and_children_are_still_reaped(dsn, tmp_path, monkeypatch) -> None:
    """The test holds the supervisor's row, so its heartbeat waits on a row
    lock: the statement is cancelled by the loop session's lock timeout, the
    loop goes on reaping (a child killed meanwhile is replaced and its job
    retried), and no other job runs twice."""
    monkeypatch.setenv("AWA_TEST_LOG_DIR", str(tmp_path))
    config = PoolConfig(dsn=dsn, workers=2, app="apps.basic", heartbeat_interval=0.2)
    conn = psycopg2.connect(dsn)
    ids = awa_pool.enqueue_many(conn, [Job("sleep", {"seconds": 0.3}) for _ in range(12)])
    conn.commit()
    try:
        with running([config]) as (sup,):
            wait_for(lambda: sup.children.summary()["busy"] == 2, timeout=30, message="both children busy")
            with conn.cursor() as cur:   # held until the commit below
                cur.execute("SELECT id FROM awa.supervisors WHERE id = %s FOR UPDATE", (sup.supervisor_id,))
            wait_for(lambda: scalar(dsn, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                                         "WHERE NOT l.granted AND a.application_name = %s",
                                    (f"awa-pool/{sup.supervisor_id} main",)),
                     timeout=10, message="the heartbeat to wait on the row the test holds")
            os.kill(sup.children.all()[0].pid, signal.SIGKILL)
            wait_for(lambda: sup.counters.get("child_died", 0) == 1 and len(sup.children.all()) == 2, timeout=15,
                     message="the loop to reap and replace the killed child while the lock is held")
            conn.commit()
            wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE state = 'completed'") == 12,
                     timeout=60, message="every job to end")
    finally:
        conn.close()
    _each_job_ran_once_but_the_killed_one(dsn, tmp_path, ids)
