"""/metrics of a running supervisor: every documented metric is served and
the figures move as jobs run. Scraped over real HTTP."""
from __future__ import annotations

import re
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Dict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli_run import ROOT, cli_env, ok, url_with_password
from helpers import wait_for

PORT_LINE = re.compile(rb"serving Prometheus metrics on http://[^\s/]+:(\d+)/metrics")
DOC = ROOT / "docs" / "metrics.md"


def documented_names() -> set:
    """The metric names in the tables of docs/metrics.md."""
    return set(re.findall(r"^\| `(awa_[a-z_]+)` \|", DOC.read_text(), re.M))


def port_of(log_path: Path) -> int:
    match = wait_for(lambda: PORT_LINE.search(log_path.read_bytes()), message="the metrics line in the log")
    return int(match.group(1))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def samples(text: str) -> Dict[tuple, float]:
    """{(sample name, sorted labels...): value}"""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name,) + tuple(sorted(sample.labels.items()))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name,) + tuple(sorted(labels.items())), 0.0)


def enqueue(dsn: str, *args: str) -> int:
    return int(ok("enqueue", *args, "--database-url", dsn).strip())


def test_documented_metrics_move_as_jobs_run(processes, dsn: str, tmp_path) -> None:
    url, secret = url_with_password(dsn)
    argv = [sys.executable, "-m", "awa_pool", "start", "--app", "apps.basic", "-w", "2",
            "--queue", "default", "--queue", "parked", "--max-tasks-per-child", "3",
            "--metrics-port", "0", "--database-url", url]
    proc = processes.start(argv, name="metrics", env={"AWA_TEST_LOG_DIR": str(tmp_path)})
    port = port_of(proc.log_path)

    first = wait_for(lambda: (lambda t: t if value(t, "awa_leader") == 1 else None)(scrape(port)),
                     message="the supervisor to become leader")
    assert value(first, "awa_children", state="idle") + value(first, "awa_children", state="other") == 2
    assert value(first, "awa_children_configured") == 2
    assert value(first, "awa_database_connected") == 1
    assert value(first, "awa_jobs_started_total", queue="default", kind="add") == 0

    for i in range(3):
        enqueue(dsn, "add", "--args", f'{{"a": {i}, "b": 1}}')
    enqueue(dsn, "fail", "--max-attempts", "1")
    enqueue(dsn, "retry_then_ok", "--args", '{"times": 1, "delay": 0}')
    enqueue(dsn, "self_kill", "--max-attempts", "1")
    enqueue(dsn, "slow", "--max-attempts", "1")
    ok("queues", "pause", "parked", "--force", "--database-url", dsn)
    for _ in range(4):
        enqueue(dsn, "noop", "--queue", "parked")

    def settled() -> str:
        text = scrape(port)
        done = (value(text, "awa_jobs_completed_total", queue="default", kind="add") == 3
                and value(text, "awa_jobs_completed_total", queue="default", kind="retry_then_ok") == 1
                and value(text, "awa_jobs_timed_out_total", queue="default", kind="slow") == 1
                and value(text, "awa_jobs_crashed_total", queue="default", kind="self_kill") == 1
                and value(text, "awa_queue_jobs", queue="parked", state="available") == 4)
        return text if done else ""

    text = wait_for(settled, timeout=60, interval=0.25, message="the job metrics to settle")
    assert value(text, "awa_jobs_started_total", queue="default", kind="add") == 3
    assert value(text, "awa_jobs_started_total", queue="default", kind="retry_then_ok") == 2
    assert value(text, "awa_jobs_failed_total", queue="default", kind="fail") == 1
    assert value(text, "awa_jobs_retried_total", queue="default", kind="retry_then_ok") == 1
    assert value(text, "awa_job_outcomes_total", queue="default", kind="retry_then_ok", outcome="retry") == 1
    assert value(text, "awa_job_outcomes_total", queue="default", kind="self_kill", outcome="crash") == 1
    assert value(text, "awa_job_pickup_latency_seconds_count", queue="default") == 8
    assert value(text, "awa_job_run_seconds_count", queue="default", kind="add") == 3
    assert value(text, "awa_job_run_seconds_count", queue="default", kind="slow") == 0  # killed: not timed
    assert value(text, "awa_child_deaths_total") >= 2  # the crash and the timeout
    assert value(text, "awa_child_recycles_total") >= 1  # --max-tasks-per-child 3
    # every started job came out of a claim; every outcome went through a flush
    assert 1 <= value(text, "awa_claims_total") - value(text, "awa_empty_claims_total") <= 8
    outcomes = sum(v for k, v in samples(text).items() if k[0] == "awa_job_outcomes_total")
    assert 1 <= value(text, "awa_completion_flushes_total") <= outcomes
    assert value(text, "awa_queue_lag_seconds", queue="parked") > 0
    assert value(text, "awa_queue_paused", queue="parked") == 1
    assert value(text, "awa_queue_stats_up") == 1
    assert value(text, "awa_queue_counts_age_seconds") == 0   # a small backlog is counted for each read
    assert value(text, "awa_supervisor_info", supervisor_id="1", version=_version(), state="running") == 1

    # exactly the documented names are served (counters' families drop "_total")
    served = {family.name for family in text_string_to_metric_families(text)
              if family.name.startswith("awa_") and not family.name.endswith("_created")}
    documented = {name[:-len("_total")] if name.endswith("_total") else name for name in documented_names()}
    assert served == documented, (f"documented, not served: {documented - served}; "
                                  f"served, not documented: {served - documented}")
    assert secret not in text and "postgresql://" not in text

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def _version() -> str:
    from awa_pool import __version__

    return __version__


def test_pool_serves_metrics_when_metrics_port_is_set(processes, dsn: str, tmp_path) -> None:
    script = (
        "import logging, sys, awa_pool\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "sys.exit(awa_pool.Pool(sys.argv[1], app='apps.basic', workers=1, queues=['default'],\n"
        "                       metrics_port=0).run())\n")
    proc = processes.start([sys.executable, "-c", script, dsn], name="pool", env=cli_env(
        {"AWA_TEST_LOG_DIR": str(tmp_path)}))
    port = port_of(proc.log_path)
    enqueue(dsn, "add", "--args", '{"a": 1, "b": 2}')
    wait_for(lambda: value(scrape(port), "awa_jobs_completed_total", queue="default", kind="add") == 1,
             message="the Pool's metrics to count the job")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    with pytest.raises(OSError):  # the server stopped with the pool
        scrape(port)
