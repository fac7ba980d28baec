"""The supervisor under fire: SIGTERM drains, a second signal stops at once,
its database connections are terminated mid-run, several supervisors share
one queue. No job may be lost or left running."""
from __future__ import annotations

import signal
import time

import psycopg2
import pytest

from awa_pool import Job, enqueue_many, get_job
from helpers import (enqueue_jobs, count_lines, exec_records, query, scalar, start_idle_supervisors,
                     states, wait_for)


def test_sigterm_drains_running_jobs_and_exits_zero(dsn, pools):
    ids = enqueue_jobs(dsn, [Job("sleep", {"seconds": 1.5}) for _ in range(2)] +
                   [Job("noop", delay=3600)])
    supervisor = pools.start("--shutdown-timeout", "20", workers=2)
    wait_for(lambda: count_lines(pools.log_dir, "sleep_start") == 2, timeout=20, message="2 jobs running")
    started = time.monotonic()
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=25) == 0
    assert time.monotonic() - started < 20
    conn = psycopg2.connect(dsn)
    try:
        assert [get_job(conn, i).state for i in ids[:2]] == ["completed", "completed"]
        assert get_job(conn, ids[2]).state == "scheduled"
    finally:
        conn.close()
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE state = 'running'") == 0
    assert scalar(dsn, "SELECT stopped_at IS NOT NULL FROM awa.supervisors") is True
    log = supervisor.log_path.read_text()
    assert "SIGTERM: draining" in log and "Traceback" not in log


def test_shutdown_timeout_puts_unfinished_jobs_back(dsn, pools):
    ids = enqueue_jobs(dsn, [Job("sleep", {"seconds": 60}) for _ in range(2)])
    supervisor = pools.start("--shutdown-timeout", "1", workers=2)
    wait_for(lambda: count_lines(pools.log_dir, "sleep_start") == 2, timeout=20, message="2 jobs running")
    started = time.monotonic()
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=20) == 0
    assert time.monotonic() - started < 10
    conn = psycopg2.connect(dsn)
    try:
        for job_id in ids:
            record = get_job(conn, job_id)
            assert record.state == "available", record
            assert record.attempt == 0  # the interrupted attempt does not count
            assert record.attempts[-1]["outcome"] == "interrupted"
    finally:
        conn.close()


def test_second_signal_stops_at_once_without_losing_jobs(dsn, pools):
    ids = enqueue_jobs(dsn, [Job("sleep", {"seconds": 60}) for _ in range(2)])
    supervisor = pools.start("--shutdown-timeout", "60", workers=2)
    wait_for(lambda: count_lines(pools.log_dir, "sleep_start") == 2, timeout=20, message="2 jobs running")
    supervisor.send_signal(signal.SIGTERM)
    wait_for(lambda: "draining" in supervisor.log_path.read_text(), timeout=10,
             message="the first signal to start the drain (the second one must escalate it)")
    started = time.monotonic()
    supervisor.send_signal(signal.SIGINT)
    assert supervisor.wait(timeout=20) == 0
    assert time.monotonic() - started < 10
    assert states(dsn) == {"available": 2}
    assert "stopping now" in supervisor.log_path.read_text()
    del ids


def test_killed_database_connections_lose_no_job(dsn, pools):
    ids = enqueue_jobs(dsn, [Job("sleep", {"seconds": 0.05}) for _ in range(300)])
    supervisor = pools.start(workers=2)
    wait_for(lambda: count_lines(pools.log_dir, "sleep") >= 30, timeout=30, message="the pool to get going")
    killed = 0
    for round_ in range(1, 4):
        killed += scalar(dsn, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND application_name LIKE 'awa-pool%%'")
        wait_for(lambda: supervisor.log_path.read_text().count("reconnected to the database") >= round_,
                 timeout=30, message=f"the supervisor to reconnect after kill {round_}")
    assert killed >= 3
    wait_for(lambda: states(dsn) == {"completed": 300}, timeout=60,
             message="every job completed after the connections were killed")
    assert supervisor.poll() is None, "the supervisor must survive losing its connections"
    log = supervisor.log_path.read_text()
    assert "lost the database connection" in log and "reconnected" in log
    # at-least-once: a job may repeat only if its outcome was lost with a connection
    executions = count_lines(pools.log_dir, "sleep")
    assert executions >= 300
    assert len(ids) == 300


def test_three_supervisors_run_each_job_exactly_once(dsn, pools):
    total = 5000
    start_idle_supervisors(pools, 3)
    enqueue_jobs(dsn, [Job("noop", {"i": i}) for i in range(total)])
    wait_for(lambda: states(dsn) == {"completed": total}, timeout=120,
             message=f"{total} jobs completed by 3 supervisors")
    records = exec_records(pools.log_dir)
    job_ids = [r[1] for r in records if r[0] == "noop"]
    assert len(job_ids) == total, f"{len(job_ids) - len(set(job_ids))} duplicate executions"
    assert len(set(job_ids)) == total
    owners = query(dsn, "SELECT count(DISTINCT supervisor_id) FROM awa.jobs")
    assert owners[0][0] == 3, "all three supervisors should have taken part"


def test_unmigrated_database_is_refused_with_one_line(empty_dsn, processes, tmp_path):
    import sys

    proc = processes.start([sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic",
                            "--database-url", empty_dsn], name="unmigrated")
    assert proc.wait(timeout=30) == 1
    output = proc.log_path.read_text().strip().splitlines()
    assert output[-1].startswith("error: ") and "awa-pool migrate" in output[-1]
    assert "Traceback" not in "\n".join(output)


def test_migrate_flag_migrates_then_runs(empty_dsn, processes, tmp_path):
    import sys

    proc = processes.start([sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic",
                            "--migrate", "-w", "1", "--database-url", empty_dsn], name="migrating")
    wait_for(lambda: scalar(empty_dsn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'awa'") or 0,
             timeout=30, message="the schema to appear")
    conn = psycopg2.connect(empty_dsn)
    try:
        job_id = enqueue_many(conn, [Job("add", {"a": 1, "b": 2})])[0]
        conn.commit()
        wait_for(lambda: get_job(conn, job_id).state == "completed" or conn.rollback(), timeout=30,
                 message="the job to run")
    finally:
        conn.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


def test_unreachable_database_gives_up_after_connect_timeout(processes):
    import sys

    proc = processes.start([sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic",
                            "--connect-timeout", "2s",
                            "--database-url", "postgresql://postgres:s3cret@127.0.0.1:1/nowhere"],
                           name="unreachable")
    started = time.monotonic()
    assert proc.wait(timeout=30) == 1
    assert time.monotonic() - started < 15
    text = proc.log_path.read_text()
    lines = [line for line in text.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "cannot connect" in lines[0]
    assert "s3cret" not in text and "Traceback" not in text


def test_app_import_error_is_one_line(processes, dsn):
    import sys

    proc = processes.start([sys.executable, "-m", "awa_pool", "start", "--app", "apps.does_not_exist",
                            "--database-url", dsn], name="noapp")
    assert proc.wait(timeout=30) == 1
    text = proc.log_path.read_text().strip()
    assert text.splitlines()[-1] == "error: app module 'apps.does_not_exist' not found (is it on PYTHONPATH?)"
    assert "Traceback" not in text


@pytest.mark.parametrize("spec", ["images=abc", "images,min=x", "images,bogus=1", "=3", "images,max=0"])
def test_bad_queue_spec_is_one_line(processes, dsn, spec):
    import sys

    proc = processes.start([sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic",
                            "--queue", spec, "--database-url", dsn], name="badspec")
    assert proc.wait(timeout=30) != 0
    text = proc.log_path.read_text().strip()
    assert len(text.splitlines()) == 1 and text.startswith("error: ") and "--queue" in text
    assert "Traceback" not in text



def test_a_notify_event_after_the_connection_was_lost_in_the_same_wakeup_is_ignored(dsn) -> None:
    """One select() can report the LISTEN socket readable together with a
    child whose request then finds the database gone. Losing the main
    connection leaves the LISTEN session (and its liveness lock) alone, so
    the notify event that follows is read as usual; once the LISTEN session
    itself is lost, its stale event must not crash the supervisor (the chaos
    run saw it exit on an assertion)."""
    import psycopg2

    from awa_pool.core.config import PoolConfig
    from awa_pool.supervisor import Supervisor

    supervisor = Supervisor(PoolConfig(dsn=dsn, workers=1))
    session = supervisor.session
    session.notifier.open()
    supervisor._watch_notifier()
    notify_fd = supervisor.events.notify_fd
    try:
        with psycopg2.connect(dsn) as producer, producer.cursor() as cur:
            cur.execute("NOTIFY awa_jobs, 'default'")
        producer.close()
        ready = [kind for kind, _ in supervisor.events.select(5.0)]
        assert "notify" in ready, "the NOTIFY never reached the LISTEN session"
        session.lost(psycopg2.OperationalError("server closed the connection"))
        assert session.conn is None and session.lost_at is not None
        assert session.notifier.connected, "losing the main connection keeps the LISTEN session"
        session.listen_lost(psycopg2.OperationalError("server closed the connection"))
        supervisor._on_notify()  # the stale event of the same select()
        assert not session.notifier.connected
        assert notify_fd not in [key.fd for key in supervisor.events.selector.get_map().values()]
    finally:
        session.notifier.close()
        supervisor.events.close()


def test_a_supervisor_without_its_connection_waits_for_the_reconnect_not_the_missed_heartbeat(dsn) -> None:
    """A heartbeat due during an outage cannot go (no connection); its past
    due time used to set every select() timeout to zero, so the main loop
    spun at a full core until the database came back."""
    import time

    import psycopg2

    from awa_pool.core.config import PoolConfig
    from awa_pool.supervisor import Supervisor

    supervisor = Supervisor(PoolConfig(dsn=dsn, workers=1))
    try:
        supervisor.session.lost(psycopg2.OperationalError("server closed the connection"))
        now = time.monotonic()
        supervisor.next_heartbeat = now - 1.0
        supervisor.next_poll = now + 10.0
        supervisor.session.reconnect_at = now + 5.0
        assert supervisor._next_timeout() > 4.0
        supervisor.session.reconnect_at = now - 1.0   # a reconnect attempt is due: go at once
        assert supervisor._next_timeout() == 0.0
    finally:
        supervisor.events.close()
