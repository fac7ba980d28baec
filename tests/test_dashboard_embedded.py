"""The newcomer's path: after the quickstart, `awa-pool dashboard` with no
database URL serves the embedded server's jobs (data under tmp_path here)."""
from __future__ import annotations

import os
import signal
import urllib.request

import pytest

from awa_pool.core import embedded
from cli_run import cli
from dashboard_helpers import start_dashboard
from helpers import wait_for


@pytest.mark.embedded_smoke
def test_the_dashboard_serves_the_embedded_database_with_no_url(tmp_path, processes) -> None:
    data = tmp_path / "pgdata"
    env = {"AWA_EMBEDDED_DIR": str(data)}
    try:
        migrated = cli("migrate", env=env, timeout=300)
        assert migrated.returncode == 0, migrated.stderr
        cli("enqueue", "send_digest", "--args", '{"to": "newcomer@example.com"}', env=env)
        base = start_dashboard(processes, None, env=env, timeout=120)
        log = processes.started[-1].log_path.read_text()
        assert log.startswith(f"using the embedded Postgres (data in {data})")
        with urllib.request.urlopen(base + "/jobs", timeout=10) as response:
            page = response.read().decode()
        assert response.status == 200 and "newcomer@example.com" in page and "send_digest" in page
    finally:
        processes.stop_all()
        embedded.stop(data)
        _stop_postmaster(data)


def _stop_postmaster(data) -> None:
    """embedded.stop() leaves the server running when other (exited)
    processes had opened it, as the CLI commands here did: stop the
    postmaster this test started by the pid in its data directory."""
    pid_file = data / "postmaster.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().splitlines()[0])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_for(lambda: not pid_file.exists(), timeout=30, message="the embedded server stopping")
