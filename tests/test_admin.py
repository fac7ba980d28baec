"""Admin functions of SPEC §1 against real supervisors: get_job, list_jobs,
retry_job, cancel_job, pause_queue/resume_queue, queue_stats (the dlq_*
functions are in test_dlq.py)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import awa_pool
from awa_pool import Job, JobRecord, JobState
from feature_helpers import APP, connection, enqueue_jobs, get, open_gate, wait_all, wait_state
from helpers import count_lines, exec_records


def _stats(dsn):
    with connection(dsn, autocommit=True) as conn:
        return {s.queue: s for s in awa_pool.queue_stats(conn)}


def _admin(dsn, fn, *args):
    with connection(dsn) as conn:
        value = fn(conn, *args)
        conn.commit()
    return value


def test_get_job_returns_the_full_record(dsn, pools):
    done, failed = enqueue_jobs(
        dsn, Job("add", {"a": 1, "b": 2}, priority=1, tags=["x", "y"], metadata={"who": "me"}),
        Job("fail", {"message": "bad"}, max_attempts=1))
    pools.start(app=APP, workers=1)
    record = wait_state(dsn, done, "completed")
    assert isinstance(record, JobRecord) and record.state == JobState.COMPLETED == "completed"
    assert (record.id, record.kind, record.queue, record.args) == (done, "add", "default", {"a": 1, "b": 2})
    assert (record.priority, record.attempt, record.max_attempts) == (1, 1, 25)
    assert record.tags == ("x", "y") and record.metadata == {"who": "me"}
    assert record.result == {"sum": 3} and record.progress is None and record.errors == []
    assert record.created_at <= record.run_at <= record.finalized_at
    [attempt] = record.attempts
    assert attempt["attempt"] == 1 and attempt["outcome"] == "completed"
    assert attempt["started_at"] <= attempt["finished_at"]
    assert attempt["wall_seconds"] >= 0 and attempt["cpu_seconds"] >= 0 and attempt["peak_rss_bytes"] > 0

    record = wait_state(dsn, failed, "failed")
    [error] = record.errors
    assert error["attempt"] == 1 and error["error"] == "ValueError: bad" and "Traceback" in error["traceback"]
    assert error["at"]

    with connection(dsn) as conn:
        assert awa_pool.get_job(conn, 10**12) is None
        with pytest.raises(TypeError):
            awa_pool.get_job(conn, "1")


def test_list_jobs_filters_and_orders_newest_first(dsn):
    ids = enqueue_jobs(dsn, Job("tick", {"n": 1}), Job("tick", {"n": 2}, queue="other"),
                       Job("add", {"a": 1, "b": 1}), Job("tick", {"n": 3}, delay=3600))
    with connection(dsn) as conn:
        awa_pool.cancel_job(conn, ids[0])
        conn.commit()
        listed = awa_pool.list_jobs(conn)
        assert [r.id for r in listed] == sorted(ids, reverse=True)
        assert [r.id for r in awa_pool.list_jobs(conn, kind="tick")] == [ids[3], ids[1], ids[0]]
        assert [r.id for r in awa_pool.list_jobs(conn, queue="other")] == [ids[1]]
        assert [r.id for r in awa_pool.list_jobs(conn, state="cancelled")] == [ids[0]]
        assert [r.id for r in awa_pool.list_jobs(conn, state=JobState.SCHEDULED)] == [ids[3]]
        assert [r.id for r in awa_pool.list_jobs(conn, kind="tick", queue="default", state="available")] == []
        assert [r.id for r in awa_pool.list_jobs(conn, limit=2)] == [ids[3], ids[2]]
        assert len(awa_pool.list_jobs(conn, newer_than=3600)) == 4
        assert awa_pool.list_jobs(conn, older_than=timedelta(hours=1)) == []
        with pytest.raises(ValueError, match="unknown state"):
            awa_pool.list_jobs(conn, state="done")
        with pytest.raises(ValueError):
            awa_pool.list_jobs(conn, limit=0)


def test_retry_job_runs_failed_cancelled_and_scheduled_jobs_again(dsn, pools):
    failed, cancelled, scheduled, done = enqueue_jobs(
        dsn, Job("flaky", {"gate": "open"}, max_attempts=1), Job("tick", {"n": 1}, queue="parked"),
        Job("tick", {"n": 2}, delay=3600), Job("tick", {"n": 3}))
    pools.start(app=APP, workers=1)
    wait_state(dsn, failed, "failed")
    wait_state(dsn, done, "completed")
    assert _admin(dsn, awa_pool.cancel_job, cancelled) == "cancelled"
    with connection(dsn) as conn:  # a rollback undoes a retry
        assert awa_pool.retry_job(conn, failed) == JobState.AVAILABLE
        conn.rollback()
    assert get(dsn, failed).state == "failed"

    open_gate(pools.log_dir, "open")
    assert _admin(dsn, awa_pool.retry_job, failed) == "available"
    record = wait_state(dsn, failed, "completed")
    assert record.attempt == 1 and record.result == {"ok_on_attempt": 1}  # fresh attempts
    assert len(record.errors) == 1  # the earlier failure stays in the history

    assert _admin(dsn, awa_pool.retry_job, scheduled) == "available"  # stops waiting
    wait_state(dsn, scheduled, "completed")

    assert _admin(dsn, awa_pool.retry_job, cancelled) == "available"
    record = get(dsn, cancelled)
    assert record.state == "available" and record.finalized_at is None  # the queue is not served

    assert _admin(dsn, awa_pool.retry_job, done) == "completed"  # nothing to retry
    assert _admin(dsn, awa_pool.retry_job, 10**12) is None
    assert count_lines(pools.log_dir, "tick") == 2


def test_pause_stops_claiming_and_resume_restarts_it(dsn, pools):
    running = enqueue_jobs(dsn, Job("member", {"i": 1, "gate": "g"}, queue="mail"))[0]
    pools.start("--queue", "mail", "--queue", "default", app=APP, workers=2)
    wait_state(dsn, running, "running")

    _admin(dsn, awa_pool.pause_queue, "mail")
    assert _stats(dsn)["mail"].paused
    held = enqueue_jobs(dsn, Job("tick", {"n": 1}, queue="mail"))[0]
    marker = enqueue_jobs(dsn, Job("tick", {"n": 2}))[0]  # enqueued after, on a live queue
    wait_state(dsn, marker, "completed")
    open_gate(pools.log_dir, "g")
    wait_state(dsn, running, "completed")  # a paused queue's running jobs finish
    tick = enqueue_jobs(dsn, Job("tick", {"n": 3}))[0]
    wait_state(dsn, tick, "completed")
    assert get(dsn, held).state == "available"  # two claim rounds later: still not claimed

    _admin(dsn, awa_pool.resume_queue, "mail")
    assert not _stats(dsn)["mail"].paused
    wait_state(dsn, held, "completed", timeout=10)
    assert [r[1] for r in exec_records(pools.log_dir) if r[0] == "tick"] == [marker, tick, held]

    with connection(dsn) as conn, pytest.raises(ValueError):
        awa_pool.pause_queue(conn, "")


def test_queue_stats_counts_every_state_and_measures_lag(dsn, pools):
    jobs = [
        Job("tick", {"n": 1}),                                          # completed
        Job("fail", max_attempts=1),                                    # failed
        Job("retry_then_ok", {"times": 1, "delay": 3600}),              # retryable
        Job("cb_wait"),                                                 # waiting_external
        Job("member", {"i": 1, "gate": "stats"}, queue="slow"),         # running (alone in its queue,
                                                                        # so no child batch waits on it)
        Job("tick", {"n": 2}, delay=3600),                              # scheduled
        Job("tick", {"n": 3}, queue="idle",                             # available, 30 s late
            run_at=datetime.now(timezone.utc) - timedelta(seconds=30)),
        Job("tick", {"n": 4}, queue="idle"),                            # available
    ]
    completed, failed, retryable, waiting, running, scheduled, late, _ = enqueue_jobs(dsn, *jobs)
    cancelled = enqueue_jobs(dsn, Job("tick", {"n": 5}, queue="idle"))[0]
    _admin(dsn, awa_pool.cancel_job, cancelled)
    _admin(dsn, awa_pool.pause_queue, "quiet")  # known, with no jobs at all
    pools.start("--queue", "default", "--queue", "slow", app=APP, workers=2)
    wait_all(dsn, [completed], "completed")
    wait_state(dsn, failed, "failed")
    wait_state(dsn, retryable, "retryable")
    wait_state(dsn, waiting, "waiting_external")
    wait_state(dsn, running, "running")

    stats = _stats(dsn)
    default = stats["default"]
    assert (default.available, default.running, default.scheduled, default.retryable,
            default.waiting_external, default.completed, default.failed, default.cancelled) == (
        0, 0, 1, 1, 1, 1, 1, 0)
    assert default.lag_seconds == 0 and not default.paused
    assert (stats["slow"].running, stats["slow"].available) == (1, 0)
    idle = stats["idle"]
    assert (idle.available, idle.cancelled, idle.running) == (2, 1, 0)
    assert 29 <= idle.lag_seconds < 120  # the oldest available job's age
    assert stats["quiet"].paused and stats["quiet"].available == 0
    assert list(stats) == sorted(stats)

    open_gate(pools.log_dir, "stats")
    wait_state(dsn, running, "completed")
    assert (_stats(dsn)["slow"].completed, _stats(dsn)["slow"].running) == (1, 0)


def test_every_duration_takes_seconds_or_a_timedelta(dsn):
    """SPEC §1: every delay, timeout and period is seconds or a timedelta."""
    from awa_pool import Pool, QueueConfig

    job_id, = enqueue_jobs(dsn, Job("noop", queue="nobody_serves_this"))
    with connection(dsn, autocommit=True) as conn:
        with pytest.raises(TimeoutError, match="not finished after 0.3s"):
            awa_pool.wait(conn, [job_id], timeout=timedelta(milliseconds=300))
        with pytest.raises(ValueError, match="wait timeout must be >= 0"):
            awa_pool.wait(conn, [job_id], timeout=timedelta(seconds=-1))
    pool = Pool(dsn, workers=1, shutdown_timeout=timedelta(seconds=5), connect_timeout=timedelta(minutes=1),
                retention_completed=timedelta(hours=2), retention_failed=timedelta(days=3),
                cancel_grace=timedelta(seconds=4), queues={"q": QueueConfig(aging=timedelta(seconds=90))})
    config = pool.config
    assert (config.shutdown_timeout, config.connect_timeout, config.retention_completed,
            config.retention_failed, config.cancel_grace) == (5.0, 60.0, 7200.0, 259200.0, 4.0)
    assert config.queues["q"].aging == 90.0
