"""The supervisor's loop wakes for events and deadlines, not on a timer: a
child running a long job costs its supervisor no periodic wake-ups. (That
the deadlines still fire is covered where they are: timeouts in
test_reliability_children, take-back in test_dispatch, cancel grace in
test_cancel.)"""
from __future__ import annotations

import time

import psycopg2

from awa_pool import Job, pause_queue, resume_queue
from helpers import count_lines, enqueue_jobs, job_row, query, wait_for


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
    time.sleep(window)  # the window measured, not a wait for anything
    woken = _main_thread_switches(supervisor.pid) - before
    # A 20 Hz check would wake it 40 times; what is left are the 1 s poll,
    # the 2 s heartbeat and the settings refresh (and their GIL hand-offs).
    assert woken < 20, f"the supervisor's main thread woke {woken} times in {window:g} s"
    assert job_row(dsn, job_id)["state"] == "running"



def test_a_supervisor_of_many_empty_queues_claims_nothing_until_one_has_a_job(pools, dsn) -> None:
    """Its poll asks the database which queues have jobs, where it used to
    claim from every queue once a second (300 empty queues: 300 empty
    claims a second); a job no notification announced (its queue resumed)
    is still found by the poll."""
    names = [f"e{i:03d}" for i in range(300)]
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        pause_queue(conn, "e150")
        job_id, = enqueue_jobs(dsn, [Job("noop", queue="e150")])
        pools.start(*[arg for name in names for arg in ("--queue", name)], workers=1)

        def stats_after(seconds: float):
            rows = query(dsn, "SELECT stats FROM awa.supervisors WHERE stopped_at IS NULL "
                              "AND heartbeat_at > started_at + make_interval(secs => %s)", (seconds,))
            return rows[0][0] if rows else None

        # heartbeats come every 2 s: this one follows at least three polls
        stats = wait_for(lambda: stats_after(3.5), timeout=30, message="a heartbeat after three polls")
        assert stats["counters"]["claims"] == 0, stats["counters"]
        resume_queue(conn, "e150")   # no notification
        wait_for(lambda: job_row(dsn, job_id)["state"] == "completed", timeout=15,
                 message="the poll to find the resumed queue's job")
    finally:
        conn.close()


# -- the bound itself, on the children's table (no processes) ------------------------------

def _children_with(*children):
    from awa_pool.worker.children import Children

    table = Children(len(children), result_max_bytes=1 << 20, max_tasks_per_child=None)
    for child in children:
        table.by_slot[child.slot] = child
    return table


def _child(slot: int, jobs, shortest_timeout=None):
    """A child holding jobs [(id, timeout_s)] in stream positions 0, 1, ..."""
    from awa_pool.worker.children import ChildHandle, InFlight
    from awa_pool.worker.protocol import StatusBlock

    child = ChildHandle(slot=slot, process=None, pid=0, down_fd=-1, up_fd=-1, reader=None, outbox=None,
                        status=StatusBlock(), recycle_after=None, ready=True)
    child.inflight = [InFlight(job_id, 1, "k", "q", timeout, position, 1)
                      for position, (job_id, timeout) in enumerate(jobs)]
    child.shortest_timeout = shortest_timeout  # what Children.assign records
    return child


def test_jobs_queued_behind_one_are_taken_back_after_a_multiple_of_its_queues_usual_time() -> None:
    """A queue of 0.2 s jobs also gets a next job queued behind the running
    one: that one is taken back for another child only once the running
    job has run twice the usual time (JobTimes.patience), not after the
    0.1 s floor."""
    from awa_pool.worker.placement import JobTimes

    times = JobTimes()
    times.record("q", 0.2)
    now = time.monotonic()
    child = _child(0, [(1, None), (2, None)])
    child.patience = times.patience("q")   # what the hand-out gives Children.assign
    assert child.patience == 0.4
    child.next_position = 2
    child.status.start(1, 0, now - 0.2)
    table = _children_with(child)
    assert table.next_check(now) == now - 0.2 + 0.4
    assert table.check(now).released.outcomes == []
    assert [o.job_id for o in table.check(now + 0.21).released.outcomes] == [2]


def test_the_next_check_is_the_earliest_deadline_of_any_busy_child() -> None:
    from awa_pool.worker.children import OVERDUE_RETRY_S
    from awa_pool.worker.placement import TAKE_BACK_AFTER_S

    now = time.monotonic()
    idle = _child(0, [])
    no_deadline = _child(1, [(1, None)])
    no_deadline.status.start(1, 0, now - 100)
    assert _children_with(idle, no_deadline).next_check(now) == float("inf")

    timed = _child(2, [(2, 5.0)], shortest_timeout=5.0)
    timed.status.start(2, 0, now - 1)
    assert _children_with(no_deadline, timed).next_check(now) == now - 1 + 5.0

    queued = _child(3, [(3, None), (4, None)])
    queued.status.start(3, 0, now - 0.05)
    assert _children_with(timed, queued).next_check(now) == now - 0.05 + TAKE_BACK_AFTER_S

    # The last job of a batch runs while its earlier outcomes are still unreported:
    # nothing is queued behind it, so no take-back to wake for.
    last = _child(4, [(5, None), (6, None)])
    last.status.start(6, 1, now - 30)
    assert _children_with(last).next_check(now) == float("inf")

    # A job queued behind one without a timeout: it starts no earlier than now.
    behind = _child(5, [(7, None), (8, 2.0)], shortest_timeout=2.0)
    behind.status.start(7, 0, now - 0.01)
    assert _children_with(behind).next_check(now) == now - 0.01 + TAKE_BACK_AFTER_S
    behind.status.start(8, 1, now - 0.5)  # (as if 7 were done and reported)
    behind.inflight = behind.inflight[1:]
    assert _children_with(behind).next_check(now) == now - 0.5 + 2.0

    cancelled = _child(6, [(9, None)])
    cancelled.status.start(9, 0, now - 1)
    table = _children_with(cancelled)
    assert table.request_cancel(9, now + 3) == [cancelled]
    assert table.request_cancel(9, now + 5) == []  # told once; its grace does not move
    assert table.next_check(now) == now + 3

    # Overdue (a take-back that could not happen): retried shortly, never a busy loop.
    stuck = _child(7, [(10, None), (11, None)])
    stuck.status.start(10, 0, now - 10)
    assert _children_with(stuck).next_check(now) == now + OVERDUE_RETRY_S
