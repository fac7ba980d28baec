"""The supervisor's loop wakes for events and deadlines, not on a timer: a
child running a long job costs its supervisor no periodic wake-ups. (That
the deadlines still fire is covered where they are: timeouts in
test_reliability_children, take-back in test_dispatch, cancel grace in
test_cancel.)"""
from __future__ import annotations

import time

from awa_pool import Job
from helpers import count_lines, enqueue_jobs, job_row, wait_for


def _main_thread_switches(pid: int) -> int:
    """Voluntary context switches of the supervisor's main thread: one per
    wait in its select loop (plus the odd wait for the GIL)."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for {pid}")


def test_a_long_job_without_deadlines_does_not_wake_its_supervisor(pools, dsn) -> None:
    supervisor = pools.start(workers=1)
    job_id, = enqueue_jobs(dsn, [Job("sleep", {"seconds": 6})])
    wait_for(lambda: count_lines(pools.log_dir, "sleep_start") == 1, timeout=30,
             message="the sleep job to start")
    before = _main_thread_switches(supervisor.pid)
    window = 2.0
    time.sleep(window)  # the measured window, not a synchronization
    woken = _main_thread_switches(supervisor.pid) - before
    # A 20 Hz check would wake it 40 times; what is left are the 1 s poll,
    # the 2 s heartbeat and the settings refresh (and their GIL hand-offs).
    assert woken < 20, f"the supervisor's main thread woke {woken} times in {window:g} s"
    assert job_row(dsn, job_id)["state"] == "running"

