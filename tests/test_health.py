"""HTTP health probes (SPEC §13): `/livez` 200 while the supervisor's loop
turns, `/readyz` 200 when connected, registered and not draining, through
a real start, a drain, a database outage and a loop stuck in a hook; a
port that cannot be served is one line at start, with nothing started."""
from __future__ import annotations

import json
import re
import signal
import socket
import threading
import urllib.error
import urllib.request
from typing import Tuple

import pytest

import awa_pool
from awa_pool import Job
from awa_pool.core.config import PoolConfig
from awa_pool.core.errors import ConfigError
from awa_pool.ops.health import HealthServer
from awa_pool.supervisor import Supervisor
from cli_run import cli
from helpers import enqueue_jobs, scalar, wait_for

SERVING = re.compile(r"serving health probes on http://127\.0\.0\.1:(\d+)/livez")


def probe(port: int, path: str) -> Tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _health_port(proc) -> int:
    def port():
        match = SERVING.search(proc.log_path.read_text(errors="replace"))
        return int(match.group(1)) if match else None
    return wait_for(port, timeout=30, message=f"the health server's port in {proc.log_path}")


def _start(pools, *args, **kwargs):
    proc = pools.start("--health-port", "0", "--health-host", "127.0.0.1", *args, **kwargs)
    return proc, _health_port(proc)


def _until(port: int, path: str, status: int, message: str, timeout: float = 30) -> dict:
    return wait_for(lambda: (lambda got: got[1] if got[0] == status else None)(probe(port, path)),
                    timeout=timeout, message=message)


def test_probes_through_start_and_drain(dsn, pools, tmp_path):
    gate, starts = tmp_path / "gate", tmp_path / "starts.log"
    [job_id] = enqueue_jobs(dsn, [Job("gate", {"gate": str(gate), "log": str(starts)}, queue="gates")])
    proc, port = _start(pools, "--shutdown-timeout", "60s", app="apps.gates", workers=1)
    ready = _until(port, "/readyz", 200, "/readyz to say ready")
    assert ready["ok"] is True and ready["state"] == "running" and ready["supervisor_id"] >= 1
    assert probe(port, "/livez")[0] == 200
    assert probe(port, "/nowhere")[0] == 404

    wait_for(starts.exists, timeout=30, message="the job to start")
    proc.send_signal(signal.SIGTERM)
    draining = _until(port, "/readyz", 503, "/readyz to say not ready once draining")
    assert draining["state"] == "draining" and "not taking jobs" in draining["reason"], draining
    status, alive = probe(port, "/livez")
    assert status == 200 and alive["state"] == "draining", alive   # the loop still turns

    gate.touch()   # the job ends; the drain is over
    assert proc.wait(timeout=60) == 0
    assert scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)) == "completed"
    with pytest.raises(OSError):
        probe(port, "/livez")   # the server went with the supervisor


@pytest.mark.xdist_group("outages")
def test_readyz_through_a_database_outage(private_server, processes, tmp_path):
    """The server stops: /readyz says not connected while /livez stays 200
    (the loop turns, retrying); back when the server is."""
    from conftest import Pools

    pools = Pools(processes, private_server.url("outage"), tmp_path)
    proc, port = _start(pools, "--connect-timeout", "60s")
    _until(port, "/readyz", 200, "/readyz to say ready")
    private_server.stop("fast")
    down = _until(port, "/readyz", 503, "/readyz to notice the outage")
    assert down["reason"] == "not connected to the database", down
    assert probe(port, "/livez")[0] == 200
    assert probe(port, "/livez")[0] == 200 and proc.poll() is None
    private_server.start()
    back = _until(port, "/readyz", 200, "/readyz to say ready once the server is back", timeout=60)
    assert back["state"] == "running"


def test_livez_fails_while_a_loop_turn_is_stuck(dsn):
    """A supervisor whose loop is stuck in a hook (its on_outcome waits on
    an event): /livez turns 503 past the bound, and 200 once it goes on."""
    sup = Supervisor(PoolConfig(dsn=dsn, workers=1, app="apps.basic"))
    release, entered = threading.Event(), threading.Event()

    def stuck(_finished) -> None:
        entered.set()
        release.wait(60)
    sup.on_outcome = stuck
    health = HealthServer(sup, bound=0.5)
    port = health.serve(0, "127.0.0.1")
    assert probe(port, "/livez") == (503, {"ok": False, "reason": "starting: the loop has not turned yet",
                                           "state": "starting", "supervisor_id": None})
    assert probe(port, "/readyz")[0] == 503
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    try:
        _until(port, "/livez", 200, "/livez once the loop turns")
        enqueue_jobs(dsn, [Job("noop")])
        assert entered.wait(30), "the job's outcome never reached the hook"
        stalled = _until(port, "/livez", 503, "/livez to fail while the turn is stuck", timeout=10)
        assert re.match(r"the loop's turn has not completed for \d+s", stalled["reason"]), stalled
        assert probe(port, "/readyz")[0] == 503
        release.set()
        _until(port, "/livez", 200, "/livez once the loop goes on")
    finally:
        release.set()
        sup.request_shutdown()
        thread.join(60)
        health.close()
    assert not thread.is_alive()


def test_a_port_in_use_stops_start_with_one_line(dsn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("start", "--app", "apps.basic", "--health-port", str(port), "--health-host", "127.0.0.1",
                     "--log-level", "warning", "--database-url", dsn)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot serve health probes on 127.0.0.1:{port}: "), lines
    assert "in use" in lines[0]
    assert scalar(dsn, "SELECT count(*) FROM awa.supervisors") == 0   # nothing registered


@pytest.mark.parametrize("port", ["65536", "-1", "http"])
def test_a_port_out_of_range_is_one_line(dsn, port):
    result = cli("start", "--app", "apps.basic", "--health-port", port, "--database-url", dsn)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "health" in lines[0], lines


@pytest.mark.parametrize("value", [65536, -1, True, "8080"])
def test_pool_refuses_a_bad_health_port(dsn, value):
    with pytest.raises(ConfigError, match="health port must be an int 0-65535"):
        awa_pool.Pool(dsn, workers=1, health_port=value)
