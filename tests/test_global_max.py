"""global_max (SPEC §11): at most N of a queue's jobs running across the
fleet, decided in the claim. Checked by replaying the handlers' recorded
start and end times: a handler runs inside its job's running state, so
their overlap bounds nothing the database let through from below."""
from __future__ import annotations

import os
import signal
import time

import pytest

import awa_pool
from awa_pool import Job
from cli_run import cli, ok
from helpers import connection, enqueue_jobs, exec_records, query, scalar, wait_for

APP = "apps.limits"


def _set(dsn: str, **settings) -> None:
    with connection(dsn) as conn:
        awa_pool.set_queue(conn, "gpu", **settings)
        conn.commit()


def _intervals(log_dir, killed_at: float = float("inf")) -> dict:
    """{job id: [(start, end)]}: an attempt with no end ran until killed_at."""
    runs: dict = {}
    for kind, job_id, pid, at, _ in exec_records(log_dir):
        if kind == "hold_start":
            runs.setdefault((job_id, pid), []).append([at, killed_at])
        elif kind == "hold_end":
            runs[(job_id, pid)][-1][1] = at
    return runs


def _most_at_once(runs: dict) -> int:
    edges = sorted([(start, 1) for spans in runs.values() for start, _ in spans]
                   + [(end, -1) for spans in runs.values() for _, end in spans], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _completed(dsn: str) -> int:
    return scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE queue = 'gpu' AND state = 'completed'")


def test_global_max_holds_across_three_supervisors_and_is_reached(dsn, pools):
    _set(dsn, global_max=3)
    # two children each: reaching 3 takes jobs running under two supervisors at once
    for n in range(3):
        pools.start("--queue", "gpu", app=APP, workers=2, name=f"supervisor{n}")
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.supervisors WHERE stopped_at IS NULL") == 3,
             timeout=30, message="3 supervisors registered")
    enqueue_jobs(dsn, [Job("hold", {"seconds": 0.3}, queue="gpu") for _ in range(24)])
    seen = []
    def done() -> bool:
        seen.append(scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE queue = 'gpu' AND state = 'running'"))
        return _completed(dsn) == 24
    wait_for(done, timeout=60, interval=0.05, message="24 jobs completed")
    assert max(seen) <= 3, f"the database showed {max(seen)} running"
    most = _most_at_once(_intervals(pools.log_dir))
    assert most == 3, f"{most} jobs ran at once under global_max=3 with 6 children"
    assert scalar(dsn, "SELECT count(DISTINCT supervisor_id) FROM awa.jobs WHERE queue = 'gpu'") >= 2


def test_a_killed_supervisors_slots_are_freed_by_the_rescue_and_the_limit_holds(dsn, pools):
    _set(dsn, global_max=2)
    doomed = pools.start("--queue", "gpu", app=APP, workers=2, name="doomed")
    held = enqueue_jobs(dsn, [Job("hold", {"seconds": 0.2, "first_attempt_s": 120}, queue="gpu")
                              for _ in range(2)])
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE state = 'running'") == 2, timeout=30,
             message="the doomed supervisor runs 2 long jobs")
    pools.start("--queue", "gpu", app=APP, workers=3, name="survivor")
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.supervisors WHERE stopped_at IS NULL") == 2,
             timeout=30, message="the second supervisor registered")
    quick = enqueue_jobs(dsn, [Job("hold", {"seconds": 0.2}, queue="gpu") for _ in range(6)])
    # both slots are taken: the survivor's idle children start none of them
    wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.supervisors WHERE stopped_at IS NULL"
                                 " AND (stats->>'idle')::int = 3") == 1, timeout=30, message="idle survivor")
    with connection(dsn) as conn:
        assert [row.running for row in awa_pool.queue_stats(conn) if row.queue == "gpu"] == [2]
    killed_at = time.time()
    os.killpg(doomed.pid, signal.SIGKILL)
    wait_for(lambda: _completed(dsn) == 8, timeout=60, message="the rescued and the quick jobs completed")
    runs = _intervals(pools.log_dir, killed_at=killed_at)
    assert _most_at_once(runs) <= 2
    starts = {job_id: min(s for s, _ in spans) for (job_id, _), spans in runs.items() if job_id in quick}
    assert min(starts.values()) >= killed_at, "a quick job started while the limit was taken"
    rescued = query(dsn, "SELECT attempt FROM awa.jobs WHERE id = ANY(%s)", (held,))
    assert sorted(a for a, in rescued) == [2, 2], "the killed supervisor's jobs ran again after the rescue"


@pytest.mark.parametrize("bad", [0, -1, "3", True, 2.5])
def test_set_queue_refuses_a_bad_global_max(dsn, bad):
    _set(dsn, global_max=4)
    with connection(dsn) as conn:
        with pytest.raises(ValueError, match="global_max must be a positive int or None"):
            awa_pool.set_queue(conn, "gpu", global_max=bad)
    assert scalar(dsn, "SELECT global_max FROM awa.queues WHERE name = 'gpu'") == 4


def test_cli_sets_shows_and_clears_global_max(dsn):
    enqueue_jobs(dsn, [Job("hold", queue="gpu")])
    assert "global max 5" in ok("queues", "set", "gpu", "--global-max", "5", "--database-url", dsn)
    text = ok("queues", "show", "gpu", "--database-url", dsn)
    assert "0 running (of 5 fleet-wide)" in text
    with connection(dsn) as conn:
        assert [row.global_max for row in awa_pool.queue_stats(conn) if row.queue == "gpu"] == [5]
    bad = cli("queues", "set", "gpu", "--global-max", "0", "--database-url", dsn)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert "global_max must be a positive int" in bad.stderr
    ok("queues", "set", "gpu", "--global-max", "none", "--database-url", dsn)
    assert scalar(dsn, "SELECT global_max FROM awa.queues WHERE name = 'gpu'") is None
