"""Every handler outcome lands in the right state, through real supervisors."""
from __future__ import annotations

import psycopg2
import pytest

import awa_pool
from awa_pool import Job
from helpers import enqueue_jobs, record, count_lines, exec_records, states, wait_for

pytestmark = pytest.mark.embedded_smoke


def _enqueue(dsn, *jobs):
    return enqueue_jobs(dsn, jobs)


_record = record

def _wait_state(dsn, job_id, state, timeout=30.0):
    return wait_for(lambda: (r := _record(dsn, job_id)) is not None and r.state == state and r,
                    timeout=timeout, message=f"job {job_id} to be {state} (now {_record(dsn, job_id)})")


def test_every_outcome_lands_in_its_state(dsn, pools):
    ids = _enqueue(
        dsn,
        Job("add", {"a": 2, "b": 3}),
        Job("fail", {"message": "kaput"}, max_attempts=2),
        Job("retry_then_ok", {"times": 1, "delay": 0}),
        Job("snooze_once", {"delay": 0.3}),
        Job("cancel_me"),
        Job("bad_result"),
        Job("add", {"a": 1}),                 # args the handler cannot take
        Job("no_such_kind", max_attempts=1),  # nobody registered it
        Job("noop", tags=["t1"], metadata={"m": 1}),
    )
    pools.start()
    added, failed, retried, snoozed, cancelled, bad_result, bad_args, unknown, noop = ids

    record = _wait_state(dsn, added, "completed")
    assert record.result == {"sum": 5}
    assert record.attempt == 1 and record.errors == []
    assert [a["outcome"] for a in record.attempts] == ["completed"]
    assert record.attempts[0]["wall_seconds"] is not None
    assert record.attempts[0]["cpu_seconds"] is not None
    assert record.attempts[0]["peak_rss_bytes"] > 1_000_000

    record = _wait_state(dsn, retried, "completed")
    assert record.result == "ok" and record.attempt == 2
    assert record.errors[0]["kind"] == "retry" and "attempt 1" in record.errors[0]["error"]
    assert [a["outcome"] for a in record.attempts] == ["retry", "completed"]

    record = _wait_state(dsn, snoozed, "completed")
    assert record.attempt == 1  # the snoozed attempt was given back
    assert record.progress["metadata"] == {"snoozed": True}  # progress survived the snooze
    assert [a["outcome"] for a in record.attempts] == ["snooze", "completed"]

    record = _wait_state(dsn, cancelled, "cancelled")
    assert record.errors[-1]["error"] == "not needed any more"
    assert count_lines(pools.log_dir, "cancel_me") == 1  # never retried

    record = _wait_state(dsn, bad_result, "failed")
    assert record.attempt == 1 and "not JSON-serializable" in record.errors[0]["error"]

    record = _wait_state(dsn, bad_args, "failed")
    assert record.attempt == 1 and "cannot take args" in record.errors[0]["error"]
    assert "'b'" in record.errors[0]["error"]

    record = _wait_state(dsn, unknown, "failed")
    assert "no handler is registered for kind 'no_such_kind'" in record.errors[0]["error"]

    record = _wait_state(dsn, noop, "completed")
    assert record.tags == ("t1",) and record.metadata == {"m": 1} and record.result is None

    record = _wait_state(dsn, failed, "failed", timeout=40)
    assert record.attempt == 2
    assert [e["error"] for e in record.errors] == ["ValueError: kaput", "ValueError: kaput"]
    assert "Traceback" in record.errors[0]["traceback"] and "raise ValueError" in record.errors[0]["traceback"]
    assert [a["outcome"] for a in record.attempts] == ["failed", "failed"]
    assert count_lines(pools.log_dir, "fail") == 2


def test_job_context_is_complete(dsn, pools, tmp_path):
    conn = psycopg2.connect(dsn)
    job_id = awa_pool.enqueue(conn, Job("progress", {"steps": 2}, priority=3, tags=["x"]))
    conn.commit()
    conn.close()
    pools.start()
    record = _wait_state(dsn, job_id, "completed")
    assert record.result == {"resumed_from": 0}
    assert record.progress == {"percent": 100.0, "message": "step 2", "metadata": {"step": 2}}


def test_progress_survives_retry_and_handler_resumes(dsn, pools):
    job_id = _enqueue(dsn, Job("progress", {"steps": 4, "fail_at": 2}))[0]
    pools.start()
    record = _wait_state(dsn, job_id, "completed", timeout=30)
    assert record.attempt == 2
    assert record.result == {"resumed_from": 2}  # restarted from its checkpoint
    starts = [r[4] for r in exec_records(pools.log_dir) if r[0] == "progress"]
    assert starts == ["start=0", "start=2"]


def test_result_size_limit(dsn, pools):
    @awa_pool.task("never_registered_in_children")
    def unused() -> None:  # pragma: no cover - only checks the decorator in this process
        pass

    big = _enqueue(dsn, Job("add", {"a": "x" * 600_000, "b": "y" * 600_000}))[0]
    pools.start()
    record = _wait_state(dsn, big, "failed")
    assert "over the 1048576-byte limit" in record.errors[0]["error"]


def test_states_are_consistent_after_run(dsn, pools):
    _enqueue(dsn, *[Job("noop") for _ in range(50)])
    pools.start()
    wait_for(lambda: states(dsn) == {"completed": 50}, timeout=30, message="50 completed")
    assert count_lines(pools.log_dir, "noop") == 50


def test_peak_memory_is_each_jobs_own(dsn, pools):
    """A job that briefly used 60 MB reports that peak; the job after it in
    the same child reports its own, not the high-water mark of the process."""
    spike, after = _enqueue(dsn, Job("spike", {"megabytes": 60}), Job("whoami"))
    pools.start(workers=1)
    spiked = _wait_state(dsn, spike, "completed")
    later = _wait_state(dsn, after, "completed")
    assert spiked.result["pid"] == later.result["pid"]
    spike_peak = spiked.attempts[0]["peak_rss_bytes"]
    later_peak = later.attempts[0]["peak_rss_bytes"]
    assert spike_peak > 60 * 1024 * 1024
    assert 1_000_000 < later_peak < spike_peak - 40 * 1024 * 1024, (spike_peak, later_peak)
