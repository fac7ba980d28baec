"""Embedding a Pool in a host program (SPEC §9): lifecycle hooks, and the
host's own signal handlers chained, then put back. Each test runs a real
host program (tests/apps/embedding_host.py) in a subprocess."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import List

import pytest

import awa_pool
from awa_pool import Job
from helpers import count_lines, enqueue_jobs, record, wait_for


def _events(path: Path) -> List[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _host(processes, dsn: str, tmp_path: Path, mode: str):
    events = tmp_path / f"{mode}-events.jsonl"
    proc = processes.start([sys.executable, "-m", "apps.embedding_host", mode, dsn, str(events)],
                           name=f"host-{mode}", env={"AWA_TEST_LOG_DIR": str(tmp_path)})
    return proc, events


def _named(events: List[dict], name: str) -> List[dict]:
    return [e for e in events if e["event"] == name]


def _wait_exit(proc, timeout: float = 60) -> int:
    try:
        return proc.wait(timeout=timeout)
    except Exception:
        raise AssertionError(f"the host did not exit within {timeout:g}s; its log:\n"
                             + proc.log_path.read_text(errors="replace")) from None


def _started(proc, events: Path) -> dict:
    return wait_for(lambda: (_named(_events(events), "started") or [None])[0], timeout=60,
                    message=f"on_started (host log: {proc.log_path})")


def test_hooks_see_start_every_attempt_and_stop(processes, dsn: str, tmp_path: Path) -> None:
    added, retried, failed, crashed = enqueue_jobs(dsn, [
        Job("add", {"a": 1, "b": 2}), Job("retry_then_ok", {"times": 1, "delay": 0}),
        Job("fail", {"message": "kaput"}, max_attempts=1), Job("self_kill", max_attempts=1)])
    proc, events = _host(processes, dsn, tmp_path, "hooks")
    started = _started(proc, events)
    assert started["workers"] == 1 and started["queues"] == ["default"] and started["reason"] is None
    assert started["supervisor_id"] >= 1 and started["pid"] == proc.pid

    outcomes = wait_for(lambda: (lambda got: got if len(got) >= 5 else None)(_named(_events(events), "outcome")),
                        timeout=60, message="five on_outcome calls")
    by_job = {}
    for outcome in outcomes:
        by_job.setdefault(outcome["job_id"], []).append(outcome)
    assert [(o["attempt"], o["outcome"]) for o in by_job[retried]] == [(1, "retry"), (2, "completed")]
    add, = by_job[added]
    assert (add["kind"], add["queue"], add["outcome"]) == ("add", "default", "completed")
    assert add["wall_seconds"] > 0 and add["cpu_seconds"] >= 0 and add["error"] is None
    fail, = by_job[failed]
    assert (fail["kind"], fail["outcome"], fail["error"]) == ("fail", "failed", "ValueError: kaput")
    crash, = by_job[crashed]
    assert (crash["kind"], crash["outcome"]) == ("self_kill", "crash")
    assert crash["wall_seconds"] is None and crash["cpu_seconds"] is None  # the child died unmeasured

    proc.send_signal(signal.SIGTERM)
    assert _wait_exit(proc) == 0
    stops = _named(_events(events), "stopping")
    assert len(stops) == 1 and stops[0]["reason"] == "SIGTERM"
    assert stops[0]["supervisor_id"] == started["supervisor_id"]
    assert _events(events)[-1]["event"] == "stopping"
    # The hook that raised on every outcome was logged with its traceback
    # once (the rest are counted at most once a minute), and broke nothing.
    log = proc.log_path.read_text()
    assert log.count("the on_outcome hook main.<locals>.broken raised") == 1
    assert log.count("RuntimeError: broken hook saw job") == 1
    assert record(dsn, added).state == "completed" and record(dsn, retried).state == "completed"


def _sigterm_during_a_job(processes, dsn: str, tmp_path: Path, mode: str):
    """Start the host, let a 2-second job start, SIGTERM the host, wait
    for it to exit: (its exit code, its events, the job's id, its log)."""
    proc, events = _host(processes, dsn, tmp_path, mode)
    _started(proc, events)
    job_id, = enqueue_jobs(dsn, [Job("sleep", {"seconds": 2.0})])
    wait_for(lambda: count_lines(tmp_path, "sleep_start") == 1, message="the sleep job to start")
    proc.send_signal(signal.SIGTERM)
    code = _wait_exit(proc)
    return code, _events(events), job_id, proc.log_path.read_text()


def test_the_host_sigterm_handler_runs_and_is_back_after_run(processes, dsn: str, tmp_path: Path) -> None:
    code, got, job_id, _ = _sigterm_during_a_job(processes, dsn, tmp_path, "chain")
    assert code == 0
    host, = _named(got, "host_sigterm")
    assert host["signum"] == signal.SIGTERM and host["frame_is_none"]  # called from the loop, not the handler
    # The drain was not cut short by the host's pool.stop(): the job finished.
    assert record(dsn, job_id).state == "completed"
    assert [o["outcome"] for o in _named(got, "outcome")] == ["completed"]
    assert _named(got, "stopping")[0]["reason"] == "SIGTERM"
    after, = _named(got, "after_run")
    assert after == {"event": "after_run", "code": 0, "sigterm_restored": True, "sigint_restored": True,
                     "wakeup_restored": True}


def test_a_host_handler_that_exits_waits_for_the_drain(processes, dsn: str, tmp_path: Path) -> None:
    code, got, job_id, log = _sigterm_during_a_job(processes, dsn, tmp_path, "exit")
    assert code == 7  # the host's sys.exit(7), raised by run() once the pool drained
    assert record(dsn, job_id).state == "completed"
    assert len(_named(got, "host_sigterm")) == 1 and not _named(got, "after_run")
    assert "raised again once the pool has stopped" in log


def test_a_pool_in_another_thread_leaves_signals_alone(processes, dsn: str, tmp_path: Path) -> None:
    proc, events = _host(processes, dsn, tmp_path, "thread")
    assert _wait_exit(proc) == 0
    got = _events(events)
    assert _named(got, "running") == [{"event": "running", "sigterm_untouched": True}]
    assert [(o["kind"], o["outcome"]) for o in _named(got, "outcome")] == [("add", "completed")]
    assert _named(got, "stopping")[0]["reason"] == "stop requested"
    assert _named(got, "after_run") == [{"event": "after_run", "code": 0, "job_ran": True,
                                         "thread_alive": False}]


def test_on_stopping_names_a_fatal_stop(processes, dsn: str, tmp_path: Path) -> None:
    proc, events = _host(processes, dsn, tmp_path, "fatal")
    assert _wait_exit(proc) == 3
    stop, = _named(_events(events), "stopping")
    assert "on_child_start hook failed" in stop["reason"]


def test_a_hook_that_is_not_callable_is_refused(dsn: str) -> None:
    with pytest.raises(TypeError, match="the on_outcome hook must be callable, got int"):
        awa_pool.Pool(dsn, workers=1, on_outcome=42)
    pool = awa_pool.Pool(dsn, workers=1)
    with pytest.raises(TypeError, match="the on_started hook must be callable, got str"):
        pool.on_started("not a function")
