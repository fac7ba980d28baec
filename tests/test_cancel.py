"""Cancellation (SPEC §1 admin functions, §5): queued jobs never run, a
running handler is told at once, a handler that ignores it loses its child
after the grace period, and a cancel racing a completion ends consistently."""
from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

import awa_pool
from awa_pool import Job, JobState, UnknownCallback
from feature_helpers import APP, connection, enqueue_jobs, get, job_rows, wait_all, wait_state
from helpers import count_lines, exec_records, scalar, wait_for


def _cancel(dsn, job_id, reason="cancelled by an operator"):
    with connection(dsn) as conn:
        state = awa_pool.cancel_job(conn, job_id, reason)
        conn.commit()
    return state


def _started(log_dir, kind, job_id):
    return next((r for r in exec_records(log_dir) if r[0] == kind and r[1] == job_id), None)


def _alive(pid):
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_cancelling_queued_jobs_means_they_never_run(dsn, pools):
    available, scheduled, kept = enqueue_jobs(
        dsn, Job("tick", {"n": 1}), Job("tick", {"n": 2}, delay=3600), Job("tick", {"n": 3}))

    # runs in the caller's transaction: a rollback undoes it
    with connection(dsn) as conn:
        assert awa_pool.cancel_job(conn, available) == JobState.CANCELLED
        conn.rollback()
    assert get(dsn, available).state == "available"

    assert _cancel(dsn, available, "no longer wanted") == "cancelled"
    assert _cancel(dsn, scheduled) == "cancelled"
    record = get(dsn, available)
    assert record.state == "cancelled" and record.finalized_at is not None
    assert record.errors[-1]["error"] == "no longer wanted" and record.errors[-1]["kind"] == "cancel"

    failing = enqueue_jobs(dsn, Job("fail", {"message": "once"}, max_attempts=3))[0]
    pools.start(app=APP, workers=1)
    wait_state(dsn, failing, "retryable")  # waiting for its backoff
    assert _cancel(dsn, failing) == "cancelled"
    marker = enqueue_jobs(dsn, Job("tick", {"n": 4}))[0]  # enqueued last: runs after the others
    wait_all(dsn, [kept, marker], "completed")
    assert {r[1] for r in exec_records(pools.log_dir) if r[0] == "tick"} == {kept, marker}
    assert count_lines(pools.log_dir, "fail") == 1
    for job_id in (available, scheduled, failing):
        assert get(dsn, job_id).state == "cancelled"

    # cancelling what is already terminal changes nothing; unknown ids give None
    assert _cancel(dsn, kept) == "completed"
    assert _cancel(dsn, 10**12) is None
    with connection(dsn) as conn, pytest.raises(TypeError):
        awa_pool.cancel_job(conn, "1")


def test_a_running_handler_sees_cancel_requested_at_once(dsn, pools):
    job_id = enqueue_jobs(dsn, Job("cooperative"))[0]
    pools.start(app=APP, workers=1)
    start = wait_for(lambda: _started(pools.log_dir, "cooperative_start", job_id), message="the handler")

    asked_at = time.time()
    assert _cancel(dsn, job_id, "stop please") == "cancelled"  # in the database at once
    saw = wait_for(lambda: _started(pools.log_dir, "cooperative_saw_cancel", job_id), timeout=10,
                   message="the handler to see ctx.cancel_requested")
    assert saw[3] - asked_at < 1.0, "the supervisor was not told at once (NOTIFY)"

    # the handler returned normally, but the job stays cancelled
    after = enqueue_jobs(dsn, Job("tick", {"n": 1}))[0]
    wait_state(dsn, after, "completed")
    record = get(dsn, job_id)
    assert record.state == "cancelled" and record.result is None
    assert record.errors[-1]["error"] == "stop please" and job_rows(dsn, job_id) == 1
    # it stopped by itself: its child was not killed and ran the next job
    tick = _started(pools.log_dir, "tick", after)
    assert tick[2] == start[2] and _alive(start[2])


def test_a_cancel_whose_notify_nobody_heard_still_reaches_the_handler(dsn, pools):
    """The cancel commits while the supervisor's LISTEN session is gone (as
    behind a transaction-mode pooler, or mid-reconnect): its NOTIFY reaches
    nobody, and the supervisor's sweep of its running jobs must relay it."""
    job_id = enqueue_jobs(dsn, Job("cooperative", {"limit_s": 60}))[0]
    proc = pools.start(app=APP, workers=1)
    wait_for(lambda: _started(pools.log_dir, "cooperative_start", job_id), message="the handler")
    listener = scalar(dsn, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                           "AND query LIKE 'LISTEN awa_jobs%%'")
    assert listener is not None

    os.kill(proc.pid, signal.SIGSTOP)  # so it cannot LISTEN again before the commit
    try:
        with connection(dsn) as conn:
            assert awa_pool.cancel_job(conn, job_id, "nobody heard") == "cancelled"
            assert scalar(dsn, "SELECT pg_terminate_backend(%s)", (listener,))
            wait_for(lambda: not scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                        (listener,)), message="the LISTEN session to end")
            conn.commit()  # the NOTIFY goes out now, to no listener
    finally:
        os.kill(proc.pid, signal.SIGCONT)

    wait_for(lambda: _started(pools.log_dir, "cooperative_saw_cancel", job_id), timeout=20,
             message="the handler to see ctx.cancel_requested without a NOTIFY")
    record = get(dsn, job_id)
    assert record.state == "cancelled" and record.errors[-1]["error"] == "nobody heard"
    assert count_lines(pools.log_dir, "cooperative_start") == 1


def test_a_handler_that_ignores_cancel_loses_its_child_after_the_grace_period(dsn, pools):
    # The CLI has no option for the grace period: this runs with the default (10 s).
    job_id = enqueue_jobs(dsn, Job("stubborn", {"seconds": 60}))[0]
    proc = pools.start(app=APP, workers=1)
    start = wait_for(lambda: _started(pools.log_dir, "stubborn_start", job_id), message="the handler")
    pid = start[2]

    asked = time.monotonic()
    assert _cancel(dsn, job_id) == "cancelled"
    assert get(dsn, job_id).state == "cancelled"  # at once, not after the grace
    wait_for(lambda: not _alive(pid), timeout=20, interval=0.05, message=f"child {pid} to be killed")
    elapsed = time.monotonic() - asked
    assert 9.0 <= elapsed <= 14.0, f"killed {elapsed:.1f}s after the cancel (grace is 10 s)"

    # the child was replaced: the next job runs in a new process
    after = enqueue_jobs(dsn, Job("tick", {"n": 1}))[0]
    wait_state(dsn, after, "completed")
    assert _started(pools.log_dir, "tick", after)[2] != pid
    assert count_lines(pools.log_dir, "stubborn_finished") == 0
    record = get(dsn, job_id)
    assert record.state == "cancelled" and record.attempt == 1 and len(record.errors) == 1
    assert "did not stop within the grace period" in proc.log_path.read_text()


def test_cancelling_a_waiting_job_ends_its_callback(dsn, pools):
    job_id = enqueue_jobs(dsn, Job("cb_wait"))[0]
    pools.start(app=APP, workers=1)
    callback = wait_state(dsn, job_id, "waiting_external").callback_id
    assert _cancel(dsn, job_id) == "cancelled"
    with connection(dsn, autocommit=True) as conn, pytest.raises(UnknownCallback, match="already used"):
        awa_pool.complete_external(conn, callback, "too late")
    assert get(dsn, job_id).state == "cancelled"


RACE_JOBS = 150


def test_cancel_arriving_as_the_job_completes(dsn, pools):
    """Each handler has its own thread cancel its job on another connection
    from just before it returns to ~25 ms after (while the outcome is in the
    completer's buffer, being written, or already written). Every job must
    end completed or cancelled, exactly as cancel_job answered, once."""
    # 10 cancel before the handler returns, 10 long after its outcome is
    # written (those must stay completed, however loaded the machine), the
    # rest inside the race window
    offsets = [-1.0] * 10 + [3000.0] * 10 + [25.0 * n / (RACE_JOBS - 20) for n in range(RACE_JOBS - 20)]
    ids = enqueue_jobs(dsn, *[Job("finish_and_cancel", {"dsn": dsn, "offset_ms": o}) for o in offsets])
    pools.start(app=APP, workers=2)
    wait_for(lambda: count_lines(pools.log_dir, "cancel_answer") == RACE_JOBS, timeout=50,
             message="every handler's cancel to be answered")

    def settled():
        with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state IN ('completed', 'cancelled')",
                        (ids,))
            return cur.fetchone()[0] == RACE_JOBS

    wait_for(settled, timeout=20, message="every job to be terminal")
    answers = {r[1]: r[4] for r in exec_records(pools.log_dir) if r[0] == "cancel_answer"}
    finals = Counter()
    with connection(dsn, autocommit=True) as conn:
        for job_id, offset in zip(ids, offsets):
            record = awa_pool.get_job(conn, job_id)
            finals[record.state.value] += 1
            assert record.state == answers[job_id], (job_id, offset, record.state, answers[job_id])
            if record.state == "completed":
                assert record.result == {"job": job_id} and record.errors == []
            else:
                assert record.result is None and [e["error"] for e in record.errors] == ["race"]
            if offset < 0:  # cancelled before the handler returned: the cancel wins
                assert record.state == "cancelled"
            if offset >= 3000:  # a cancel long after completion changes nothing
                assert record.state == "completed"
            assert record.attempt == 1
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s)", (ids,)) == RACE_JOBS  # never both
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_hot") == 0  # never stuck
    assert count_lines(pools.log_dir, "finish_and_cancel") == RACE_JOBS  # none ran twice
    assert finals["completed"] >= 10 and finals["cancelled"] >= 10, finals
