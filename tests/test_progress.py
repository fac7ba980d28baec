"""Progress (SPEC §1): set_progress goes up the pipe, is written in
coalesced batches, is visible while the job runs and survives retries."""
from __future__ import annotations

import time

from awa_pool import Job
from feature_helpers import APP, connection, enqueue_jobs, get, open_gate, wait_state
from helpers import exec_records, wait_for

COUNT_PROGRESS_WRITES = """
CREATE TABLE public.progress_writes (job_id bigint, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION public.count_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.progress_writes (job_id) VALUES (NEW.id);
    RETURN NULL;
END $$;
CREATE TRIGGER count_progress_writes AFTER UPDATE ON awa.jobs_hot
    FOR EACH ROW WHEN (OLD.progress IS DISTINCT FROM NEW.progress)
    EXECUTE FUNCTION public.count_progress_write();
"""


def _progress_writes(dsn, job_id):
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM public.progress_writes WHERE job_id = %s", (job_id,))
        return cur.fetchone()[0]


def test_ten_thousand_set_progress_calls_cost_a_handful_of_writes(dsn, pools):
    # Every UPDATE of the hot table that changes a job's progress is counted
    # by a trigger: the real number of writes, not an estimate.
    with connection(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(COUNT_PROGRESS_WRITES)
    job_id = enqueue_jobs(dsn, Job("progress_spam", {"calls": 10_000, "seconds": 3.0}))[0]
    pools.start(app=APP, workers=1)

    # written while running, not only at the end
    wait_for(lambda: _progress_writes(dsn, job_id) >= 1, timeout=20, message="a progress write")
    running = get(dsn, job_id)
    assert running.state == "running"
    assert 0 < running.progress["percent"] < 100 and running.progress["message"] == "spamming"

    record = wait_state(dsn, job_id, "completed", timeout=30)
    assert record.result == {"calls": 10_000}
    # the last checkpoint rides on the completion itself
    assert record.progress == {"percent": 100.0, "message": "spamming", "metadata": {"i": 10_000}}
    writes = _progress_writes(dsn, job_id)
    # ~1 write per second of the 3 s run (the completer flushes progress at
    # most once a second), nowhere near one per call
    assert 1 <= writes <= 8, f"{writes} progress writes for 10,000 set_progress calls"


def test_progress_is_visible_through_get_job_while_running(dsn, pools):
    job_id = enqueue_jobs(dsn, Job("progress_hold"))[0]
    pools.start(app=APP, workers=1)
    wait_for(lambda: any(r[1] == job_id for r in exec_records(pools.log_dir) if r[0] == "progress_hold"),
             message="the handler to report progress")
    reported_at = time.monotonic()
    record = wait_for(lambda: (r := get(dsn, job_id)).progress is not None and r, timeout=10,
                      message="progress to be visible")
    assert time.monotonic() - reported_at < 3.0  # coalesced for at most ~1 s
    assert record.state == "running"
    assert record.progress == {"percent": 40, "message": "downloading", "metadata": {"row": 400}}

    open_gate(pools.log_dir, f"progress-{job_id}")
    record = wait_state(dsn, job_id, "completed")
    assert record.progress == {"percent": 100, "message": "done", "metadata": {"row": 1000}}


def test_the_last_checkpoint_survives_a_crash_and_the_handler_resumes_from_it(dsn, pools):
    # The first attempt checkpoints rows 1..7 (100 ms of work each, so every
    # checkpoint leaves the child) and then its child dies with no outcome:
    # the checkpoints reached the supervisor less than a second before, so
    # only the crash's own write can save them.
    job_id = enqueue_jobs(dsn, Job("progress_crash", {"rows": 10, "crash_at": 7, "pause_s": 0.1}))[0]
    pools.start(app=APP, workers=1)
    record = wait_state(dsn, job_id, "completed", timeout=40)
    assert record.attempt == 2 and record.crashes == 1
    assert "exited with code 9" in record.errors[0]["error"]
    assert record.result == {"resumed_from": 7, "attempt": 2}
    starts = [r[4] for r in exec_records(pools.log_dir) if r[0] == "progress_crash"]
    assert starts == ["attempt=1 start=0", "attempt=2 start=7"]
    assert record.progress["metadata"] == {"row": 10}

