"""Chaos: a short scripts/chaos.py run (several supervisors under mixed load
while children, supervisors, connections and the PostgreSQL server itself
are killed; nothing may be lost or stuck), and the regressions it found:
writes of the supervisor's main connection must survive a server crash."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psycopg2
import pytest

import awa_pool
from awa_pool import Job
from conftest import Pools, Processes
from feature_helpers import open_gate
from helpers import count_lines, exec_records, query, scalar, wait_for

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "chaos.py"


def _embedded_server_class():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import chaos
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return chaos.EmbeddedServer


@pytest.mark.slow
@pytest.mark.xdist_group("chaos")
@pytest.mark.timeout(280)
def test_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    """About a minute: 3 supervisors, 1,500 jobs, every fault kind, one server restart."""
    summary_path = tmp_path / "summary.json"
    argv = [sys.executable, str(SCRIPT), "--duration", "35", "--jobs", "1500", "--supervisors", "3",
            "--workers", "2", "--child-kills", "8", "--supervisor-kills", "3", "--backend-kills", "8",
            "--restarts", "1", "--pauses", "2", "--settle-timeout", "150",
            "--work-dir", str(tmp_path / "work"), "--summary-json", str(summary_path)]
    env = {key: value for key, value in os.environ.items() if key not in ("AWA_CHAOS_LOG_DIR", "AWA_CHAOS_RUN")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=260, env=env)
    report = done.stdout + "\n" + "\n".join(done.stderr.splitlines()[-30:])
    assert done.returncode == 0, report
    summary = json.loads(summary_path.read_text())
    assert summary["violations"] == [], report
    assert summary["lost"] == 0 and summary["stuck"] == 0
    assert summary["jobs"] == 1500 and sum(summary["states"].values()) == 1500
    assert summary["faults"] == {"child_kill": 8, "supervisor_kill": 3, "backend_kill": 8,
                                 "server_restart": 1, "pause": 2}
    assert summary["unexplained_duplicates"] == 0
    assert summary["executions"] >= 1500


# -- regressions: a server crash must not undo what the supervisor told its children ------

@pytest.fixture
def crashable() -> Iterator:
    """A private PostgreSQL this test may crash. Its WAL writer flushes only
    every 10 s and writes no full pages, so a commit made with
    synchronous_commit = off is lost in a crash unless something else flushed it."""
    server = _embedded_server_class()(settings=["wal_writer_delay=10000", "full_page_writes=off"], database="awa")
    conn = psycopg2.connect(server.url)
    try:
        awa_pool.migrate(conn)
    finally:
        conn.close()
    try:
        yield server
    finally:
        server.close()


def _enqueue(url: str, job: Job) -> int:
    conn = psycopg2.connect(url)
    try:
        job_id = awa_pool.enqueue(conn, job)
        conn.commit()
        return job_id
    finally:
        conn.close()


def _state(url: str, job_id: int):
    try:
        return scalar(url, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,))
    except psycopg2.OperationalError:
        return None


@pytest.mark.xdist_group("chaos")
def test_a_lease_is_never_handed_out_twice_across_a_server_crash(crashable, processes: Processes,
                                                                 tmp_path: Path) -> None:
    """A job handed to a child keeps its lease to itself through a crash: if
    the job runs again, it is under another lease, and the outcome that
    counts is the current attempt's."""
    log_dir = tmp_path / "exec"
    log_dir.mkdir()
    job_id = _enqueue(crashable.url, Job("sleep_lease", {"seconds": 4}, queue="echo"))
    supervisor = Pools(processes, crashable.url, log_dir).start(app="apps.echo", workers=2)
    wait_for(lambda: count_lines(log_dir, "sleep_lease") == 1, timeout=30, message="the job to start")
    crashable.restart("immediate", 0.0)
    wait_for(lambda: _state(crashable.url, job_id) == "completed", timeout=60, message="the job to complete")
    leases = [int(r[4]) for r in exec_records(log_dir) if r[0] == "sleep_lease"]
    assert len(leases) == len(set(leases)), f"a lease ran twice: {leases}"
    lease, result = query(crashable.url, "SELECT lease, result FROM awa.jobs WHERE id = %s", (job_id,))[0]
    assert result == {"lease": lease} and lease in leases
    assert supervisor.poll() is None
    assert "reconnected" in supervisor.log_path.read_text()


@pytest.mark.xdist_group("chaos")
def test_a_registered_callback_survives_a_server_crash(crashable, processes: Processes, tmp_path: Path) -> None:
    """A callback id the handler received still exists after a crash, so the
    job can park on it and be resolved (instead of waiting forever on an id
    the database forgot)."""
    log_dir = tmp_path / "exec"
    log_dir.mkdir()
    job_id = _enqueue(crashable.url, Job("cb_plan", {"plan": ["early", "wait"]}))
    supervisor = Pools(processes, crashable.url, log_dir).start(app="apps.features", workers=1)
    callback = wait_for(lambda: scalar(crashable.url, "SELECT callback_id::text FROM awa.jobs WHERE id = %s",
                                       (job_id,)), timeout=30, message="the callback to be registered")
    crashable.restart("immediate", 0.0)
    wait_for(lambda: "reconnected" in supervisor.log_path.read_text(), timeout=30, message="a reconnection")
    open_gate(log_dir, f"{job_id}-1")
    wait_for(lambda: _state(crashable.url, job_id) == "waiting_external", timeout=30,
             message="the job to park on its callback")
    assert scalar(crashable.url, "SELECT callback_id::text FROM awa.jobs WHERE id = %s", (job_id,)) == callback
    conn = psycopg2.connect(crashable.url)
    try:
        assert awa_pool.complete_external(conn, callback, {"done": True}) == "completed"
        conn.commit()
    finally:
        conn.close()
    assert count_lines(log_dir, "cb_plan") == 1
