"""Children really die here (SIGKILL, os._exit, segfault, timeouts, leaks):
the supervisor survives, the job is retried with the cause, others flow."""
from __future__ import annotations

import os
import signal
import time

import pytest

from awa_pool import Job
from helpers import enqueue_jobs, record, count_lines, exec_records, query, states, wait_for


def _enqueue(dsn, *jobs):
    return enqueue_jobs(dsn, jobs)


_record = record

def _wait(dsn, job_id, predicate, message, timeout=30.0):
    return wait_for(lambda: (r := _record(dsn, job_id)) is not None and predicate(r) and r,
                    timeout=timeout, message=f"{message} (job {job_id}: {_record(dsn, job_id)})")


@pytest.mark.xdist_group("cpu")
def test_cpu_jobs_run_in_parallel_processes(dsn, pools):
    """4 CPU-burning jobs of 1 s on -w 2: two at a time, in two processes."""
    ids = _enqueue(dsn, *[Job("spin", {"seconds": 1.0}) for _ in range(4)])
    pools.start(workers=2)
    wait_for(lambda: states(dsn) == {"completed": 4}, timeout=30, message="4 CPU jobs completed")
    records = exec_records(pools.log_dir)
    spans = {}
    for kind, job_id, pid, at, _ in records:
        if kind in ("spin_start", "spin"):
            spans.setdefault(job_id, {})[kind] = (at, pid)
    starts = [span["spin_start"][0] for span in spans.values()]
    ends = [span["spin"][0] for span in spans.values()]
    window = max(ends) - min(starts)
    assert window < 2.6, f"4 x 1 s jobs on -w 2 took {window:.2f}s"
    results = [_record(dsn, job_id).result for job_id in ids]
    pids = {result["pid"] for result in results}
    assert len(pids) == 2, f"expected the 4 jobs on 2 child processes, got pids {pids}"
    assert os.getpid() not in pids
    # the first two ran at the same time, in different processes, each burning CPU
    first, second = sorted(spans.values(), key=lambda s: s["spin_start"][0])[:2]
    assert first["spin_start"][1] != second["spin_start"][1]
    assert second["spin_start"][0] < first["spin"][0], "the first two jobs did not overlap"
    # they burned CPU (a sleeping job would show ~0), however loaded the machine is
    assert all(result["cpu"] > 0.05 for result in results), results


@pytest.mark.parametrize("kind,cause", [
    ("self_kill", "killed by SIGKILL"),
    ("exit_hard", "exited with code 3"),
    ("segfault", "SIGSEGV"),
])
def test_dead_child_fails_only_its_job(dsn, pools, kind, cause):
    victim = _enqueue(dsn, Job(kind, max_attempts=2))[0]
    others = _enqueue(dsn, *[Job("noop") for _ in range(20)])
    supervisor = pools.start(workers=2)
    record = _wait(dsn, victim, lambda r: r.state == "failed", "the victim to fail twice", timeout=40)
    assert record.attempt == 2 and record.crashes == 2
    assert all(e["kind"] == "crash" and cause in e["error"] for e in record.errors), record.errors
    wait_for(lambda: all(_record(dsn, i).state == "completed" for i in others), timeout=30,
             message="the other jobs to complete")
    assert supervisor.poll() is None, "the supervisor must survive its children's deaths"
    assert count_lines(pools.log_dir, "noop") == 20
    # the pool replaced the dead children and still works
    late = _enqueue(dsn, Job("whoami"))[0]
    _wait(dsn, late, lambda r: r.state == "completed", "a job after the crashes")


def test_timeout_kills_and_replaces_the_child(dsn, pools):
    slow = _enqueue(dsn, Job("slow", {"seconds": 30}, max_attempts=2))[0]  # task timeout: 1 s
    others = _enqueue(dsn, *[Job("noop") for _ in range(10)])
    supervisor = pools.start(workers=2)
    record = _wait(dsn, slow, lambda r: r.state == "failed", "the slow job to time out twice", timeout=40)
    assert [e["kind"] for e in record.errors] == ["timeout", "timeout"]
    assert "timed out after 1s" in record.errors[0]["error"]
    for attempt in record.attempts:
        assert attempt["wall_seconds"] is None or attempt["wall_seconds"] < 5
    wait_for(lambda: all(_record(dsn, i).state == "completed" for i in others), timeout=20,
             message="the other jobs to complete")
    assert supervisor.poll() is None


def test_per_job_timeout_overrides_task(dsn, pools):
    job_id = _enqueue(dsn, Job("sleep", {"seconds": 20}, timeout=0.5, max_attempts=1))[0]
    pools.start(workers=1)
    record = _wait(dsn, job_id, lambda r: r.state == "failed", "the job to time out")
    assert "timed out after 0.5s" in record.errors[0]["error"]


def test_poison_job_is_failed_after_max_crashes(dsn, pools):
    victim = _enqueue(dsn, Job("exit_hard", max_attempts=25))[0]
    pools.start("--max-crashes", "2", workers=1)
    record = _wait(dsn, victim, lambda r: r.state == "failed", "the poison job to fail", timeout=40)
    assert record.crashes == 2 and record.attempt == 2
    assert "poison" in record.errors[-1]["error"] and "2 times" in record.errors[-1]["error"]
    assert count_lines(pools.log_dir, "exit_hard") == 2


def test_recycle_after_max_tasks_happens_between_jobs(dsn, pools):
    ids = _enqueue(dsn, *[Job("whoami") for _ in range(30)])
    pools.start("--max-tasks-per-child", "5", workers=1)
    wait_for(lambda: states(dsn) == {"completed": 30}, timeout=40, message="30 jobs completed")
    pids = [_record(dsn, i).result["pid"] for i in ids]
    runs = {}
    for pid in pids:
        runs[pid] = runs.get(pid, 0) + 1
    assert len(runs) >= 4, f"expected several recycled children, got {runs}"
    # max 5 tasks plus up to 10% jitter (0 for 5): no child ran more than 5
    assert max(runs.values()) <= 5, runs
    assert all(_record(dsn, i).attempt == 1 for i in ids), "recycling must not interrupt a job"


def test_recycle_when_memory_grows(dsn, pools):
    ids = _enqueue(dsn, *[Job("leak", {"megabytes": 40}) for _ in range(6)])
    pools.start("--max-memory-per-child", "100MB", workers=1)
    wait_for(lambda: states(dsn) == {"completed": 6}, timeout=40, message="6 leaky jobs completed")
    pids = [_record(dsn, i).result["pid"] for i in ids]
    assert len(set(pids)) >= 2, f"a child above 100 MB should have been replaced: {pids}"
    peaks = [_record(dsn, i).attempts[-1]["peak_rss_bytes"] for i in ids]
    assert max(peaks) > 40 * 1024 * 1024
    assert all(_record(dsn, i).attempt == 1 for i in ids)


def test_child_start_hook_runs_once_per_child(dsn, pools):
    ids = _enqueue(dsn, *[Job("hooked") for _ in range(12)])
    pools.start("--max-tasks-per-child", "4", app="apps.hooks", workers=2)
    wait_for(lambda: states(dsn) == {"completed": 12}, timeout=30, message="12 jobs completed")
    results = [_record(dsn, i).result for i in ids]
    for result in results:
        assert result["hook_pid"] == result["pid"], "the hook ran in the child that ran the job"
        assert result["hook_runs"] == 1
    hook_lines = count_lines(pools.log_dir, "hook")
    assert hook_lines == len({r["pid"] for r in results}) or hook_lines >= len({r["pid"] for r in results})


def test_failing_child_start_hook_stops_the_supervisor(dsn, pools):
    _enqueue(dsn, Job("hooked"))
    supervisor = pools.start(app="apps.bad_hook", workers=2)
    assert supervisor.wait(timeout=30) != 0
    log = supervisor.log_path.read_text()
    assert "on_child_start hook failed" in log
    assert query(dsn, "SELECT count(*) FROM awa.jobs WHERE state = 'running'") == [(0,)]


def test_supervisor_kill_leaves_no_child(dsn, pools):
    _enqueue(dsn, *[Job("sleep", {"seconds": 60}) for _ in range(3)])
    supervisor = pools.start(workers=3)
    wait_for(lambda: count_lines(pools.log_dir, "sleep_start") == 3, timeout=30,
             message="3 children running jobs")
    children = {r[2] for r in exec_records(pools.log_dir) if r[0] == "sleep_start"}
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait(timeout=10)

    def all_gone():
        alive = []
        for pid in children:
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ", 1)[1].startswith("Z"):
                        continue  # a zombie has exited
                alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        return not alive

    started = time.monotonic()
    wait_for(all_gone, timeout=5, message="every child to exit after the supervisor's SIGKILL")
    assert time.monotonic() - started < 5


def test_big_args_and_results_never_wedge_the_supervisor(dsn, pools):
    """Short jobs with ~0.7 MB args that return ~0.7 MB results, on one
    child: next batches are queued behind running ones while the child
    sends big outcomes back. A supervisor that blocked writing to a busy
    child's pipe while that child blocked writing to it would hang here."""
    blob = "é" * 350_000  # 700 kB of UTF-8
    ids = _enqueue(dsn, *[Job("echo_value", {"value": {"i": i, "blob": blob}}, queue="echo")
                          for i in range(40)])
    supervisor = pools.start(app="apps.echo", workers=1)
    wait_for(lambda: states(dsn) == {"completed": 40}, timeout=90,
             message=f"40 big jobs completed (states now {states(dsn)})")
    assert supervisor.poll() is None
    for i, job_id in enumerate(ids):
        result = _record(dsn, job_id).result
        assert result["i"] == i and result["blob"] == blob
