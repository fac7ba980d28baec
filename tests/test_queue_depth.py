"""queue_depth (SPEC §9): live jobs per queue and state, from the live
tables only; finished history never counts."""
from __future__ import annotations

import pytest

import apps.basic  # noqa: F401  (registers "add" for drain)
import awa_pool
from awa_pool import Job, QueueDepth, testing


def test_queue_depth_counts_live_jobs_only(conn) -> None:
    done = awa_pool.enqueue_many(conn, [apps.basic.add.job(a=n, b=n) for n in range(3)])
    assert sorted(testing.drain(conn)) == [(i, "completed") for i in done]   # history now
    awa_pool.enqueue_many(conn, [Job("a", queue="q1"), Job("a", queue="q1", delay=600),
                                 Job("a", queue="q2", priority=1)])
    awa_pool.cancel_job(conn, awa_pool.enqueue(conn, Job("gone", queue="q2")))
    conn.commit()

    depth = awa_pool.queue_depth(conn)
    assert list(depth) == ["q1", "q2"]          # "default" holds only finished jobs
    assert depth["q1"] == QueueDepth("q1", available=1, scheduled=1)
    assert depth["q1"].total == 2 and depth["q2"].total == 1
    only = awa_pool.queue_depth(conn, ["q2", "default", "never_used"])
    assert list(only) == ["default", "never_used", "q2"]
    assert only["default"].total == 0 and only["never_used"] == QueueDepth("never_used")
    assert awa_pool.queue_depth(conn, []) == {}


def test_queue_depth_rejects_bad_queue_lists(conn) -> None:
    with pytest.raises(TypeError, match="list of queue names"):
        awa_pool.queue_depth(conn, "q1")
    with pytest.raises(TypeError, match="queue must be a string"):
        awa_pool.queue_depth(conn, [1])
    with pytest.raises(ValueError, match="must not be empty"):
        awa_pool.queue_depth(conn, [""])
