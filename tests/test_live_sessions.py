"""Terminating one session of a live supervisor (pg_terminate_backend of its
LISTEN, leader, main or completer session; a pooler restart) makes none of
its running jobs run twice: the fast rescue takes only supervisors whose
process is gone, and the liveness lock is held on two of its sessions
(SPEC §5, awa_pool/worker/liveness.py). On 709e562, where the lock lived
on the LISTEN session alone, the leader rescued the running jobs of a
supervisor whose LISTEN session was down for two of its looks."""
from __future__ import annotations

import time
from collections import Counter

from awa_pool import Job
from helpers import enqueue_jobs, exec_records, query, scalar, states, wait_for

ROLES = ("listen", "leader", "main", "completer")
KILL_FOR_S = 1.5   # each kind of session is ended again and again this long: longer than two looks


def _leader_id(dsn: str):
    return scalar(dsn, "SELECT id FROM awa.supervisors WHERE is_leader AND stopped_at IS NULL")


def _terminate(dsn: str, supervisor_id: int, role: str) -> int:
    return scalar(dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND application_name = %s",
                  (f"awa-pool/{supervisor_id} {role}",))


def test_ending_each_session_of_a_live_supervisor_in_turn_runs_no_job_twice(pools, dsn) -> None:
    pools.start(workers=1, name="leader")
    leader_id = wait_for(lambda: _leader_id(dsn), timeout=30, message="the first supervisor to lead")
    pools.start(workers=2, name="worker")
    worker_id = wait_for(lambda: scalar(dsn, "SELECT id FROM awa.supervisors WHERE id <> %s AND stopped_at IS NULL "
                                             "AND (stats->>'idle')::int = 2", (leader_id,)),
                         timeout=30, message="the second supervisor to register with idle children")
    ids = enqueue_jobs(dsn, [Job("sleep", {"seconds": 0.7}) for _ in range(40)])

    ended = Counter()
    for role in ROLES:
        wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE state = 'running' "
                                     "AND supervisor_id = %s", (worker_id,)),
                 timeout=30, message=f"the second supervisor to run jobs before its {role} session ends")
        deadline = time.monotonic() + KILL_FOR_S
        while time.monotonic() < deadline:   # each new session of that kind is ended too
            ended[role] += _terminate(dsn, worker_id, role)
            time.sleep(0.02)                  # the pace of the kills, not a wait for anything
    assert all(ended[role] for role in ROLES), f"every kind of session was ended at least once: {ended}"

    wait_for(lambda: states(dsn) == {"completed": 40}, timeout=90, message="all 40 jobs to complete")
    runs = Counter(job_id for kind, job_id, *_ in exec_records(pools.log_dir) if kind == "sleep")
    assert sorted(runs) == sorted(ids) and set(runs.values()) == {1}, \
        f"jobs that ran more than once: {[job_id for job_id, n in runs.items() if n > 1]}"
    assert query(dsn, "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND attempt = 1", (ids,)) == [(40,)], \
        "a job was rescued from a live supervisor"
    assert scalar(dsn, "SELECT count(*) FROM awa.supervisors WHERE id = %s AND stopped_at IS NULL",
                  (worker_id,)) == 1
