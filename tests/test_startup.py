"""A supervisor survives the database going away at any step of its
start-up: the backend running the step is terminated while the step waits
on a table lock, and the supervisor starts over on a new connection (within
--connect-timeout) instead of exiting."""
from __future__ import annotations

import psycopg2
import pytest

from awa_pool import Job
from helpers import enqueue_jobs, job_row, query, scalar, wait_for

WAITING_STEP = """
SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE NOT l.granted AND l.relation = %s::regclass AND a.application_name LIKE 'awa-pool%%'
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


@pytest.mark.parametrize("table, step", [
    ("awa.schema_migrations", "checking the schema version"),
    ("awa.supervisors", "registering the supervisor"),
    ("awa.queues", "recording the served queues' settings"),
    ("awa.task_defaults", "recording the tasks' declared timeouts"),
    ("awa.cron_jobs", "registering the periodic jobs"),
])
def test_a_backend_killed_during_start_up_is_survived(pools, dsn, table, step) -> None:
    blocker = psycopg2.connect(dsn)
    try:
        with blocker.cursor() as cur:
            cur.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # the step waits here
        supervisor = pools.start(app="apps.cron", workers=1)
        backend = wait_for(lambda: scalar(dsn, WAITING_STEP, (table,)), timeout=30,
                           message=f"the supervisor to wait while {step}")
        assert scalar(dsn, "SELECT pg_terminate_backend(%s)", (backend,))
    finally:
        blocker.rollback()
        blocker.close()
    job_id, = enqueue_jobs(dsn, [Job("noop")])
    wait_for(lambda: job_row(dsn, job_id)["state"] == "completed", timeout=30,
             message=f"a job to run after the loss while {step}")
    assert supervisor.poll() is None, f"the supervisor exited with {supervisor.returncode}"
    log = supervisor.log_path.read_text()
    assert log.count("lost the database during start-up") == 1, log
    assert "Traceback" not in log, log


def test_a_registration_skips_ids_that_revived_rows_hold(pools, dsn) -> None:
    """A supervisor still running when its database was dropped and made
    again puts its old row back, under its old id, with its next heartbeat;
    the fresh sequence may not have reached that id yet. A new supervisor
    registers under the next free id instead of failing to start."""
    last, called = query(dsn, "SELECT last_value, is_called FROM awa.supervisors_id_seq")[0]
    taken = [last + called + i for i in range(3)]
    for revived in taken:   # what the heartbeat's upsert writes
        scalar(dsn, "INSERT INTO awa.supervisors (id, hostname, pid, version, workers) "
                    "VALUES (%s, 'old', 1, 'old', 1) RETURNING id", (revived,))
    supervisor = pools.start(workers=1)
    job_id, = enqueue_jobs(dsn, [Job("noop")])
    wait_for(lambda: job_row(dsn, job_id)["state"] == "completed", timeout=30, message="the job to run")
    registered = scalar(dsn, "SELECT id FROM awa.supervisors WHERE hostname <> 'old'")
    assert registered > max(taken) and supervisor.poll() is None
