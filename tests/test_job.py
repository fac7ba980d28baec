"""Job and Unique validation: every bad value raises before any SQL runs."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import awa_pool
from awa_pool import Job, JobState, Unique
from helpers import scalar


def test_defaults() -> None:
    job = Job("send_email")
    assert job.kind == "send_email"
    assert job.args == {}
    assert job.queue == "default"
    assert job.priority == 2
    assert job.max_attempts == 25
    assert job.timeout is None and job.run_at is None and job.delay is None
    assert job.tags == () and job.metadata == {} and job.unique is None


def test_job_is_immutable_and_comparable() -> None:
    job = Job("k", {"a": 1}, queue="q")
    with pytest.raises(AttributeError):
        job.queue = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        job.surprise = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        del job.args
    assert job.args == {"a": 1} and job.args_json == '{"a":1}'
    assert job == Job("k", {"a": 1}, queue="q")
    assert job != Job("k", {"a": 2}, queue="q")
    assert job.replace(priority=1).priority == 1
    assert job.replace(priority=1).queue == "q"



def test_a_copy_with_checked_metadata_equals_the_job_built_with_it() -> None:
    """What a traced enqueue stamps: the same job as one built with that metadata."""
    from awa_pool.core.job import check_json

    job = Job("k", {"a": 1}, queue="q", priority=1, tags=["t"], metadata={"m": 1}, timeout=3)
    metadata = {"m": 1, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    stamped = job.with_checked_metadata(metadata, check_json(metadata, "metadata"))
    assert stamped == Job("k", {"a": 1}, queue="q", priority=1, tags=["t"], metadata=metadata, timeout=3)
    assert stamped.bulk_shape() == Job("k", {"b": 2}, queue="q", priority=1, tags=["t"], metadata=metadata,
                                       timeout=3).bulk_shape()
    assert job.metadata == {"m": 1}  # the original is untouched
    assert stamped.replace(priority=2).metadata == metadata  # and the copy behaves as any job

BAD_JOBS = [
    # (kwargs, exception, message fragment)
    (dict(kind=""), ValueError, "kind must not be empty"),
    (dict(kind=None), TypeError, "kind must be a string"),
    (dict(kind=42), TypeError, "kind must be a string"),
    (dict(kind="k" * 201), ValueError, "at most 200"),
    (dict(kind="a\x00b"), ValueError, "NUL"),
    (dict(args=[1, 2]), TypeError, "args must be a dict"),
    (dict(args="{}"), TypeError, "args must be a dict"),
    (dict(args={"a": object()}), TypeError, "not JSON-serializable"),
    (dict(args={"a": {1, 2}}), TypeError, "not JSON-serializable"),
    (dict(args={1: "a"}), TypeError, "non-string key"),
    (dict(args={"a": float("nan")}), ValueError, "NaN"),
    (dict(args={"a": float("inf")}), ValueError, "infinity"),
    (dict(args={"a": "x\x00y"}), ValueError, "NUL"),
    (dict(args={"a": "\ud800"}), ValueError, "surrogate"),
    (dict(args={"a": b"bytes"}), TypeError, "bytes"),
    (dict(queue=""), ValueError, "queue must not be empty"),
    (dict(queue="q" * 201), ValueError, "at most 200"),
    (dict(queue=5), TypeError, "queue must be a string"),
    (dict(priority=0), ValueError, "priority must be from 1"),
    (dict(priority=5), ValueError, "priority must be from 1"),
    (dict(priority=-1), ValueError, "priority must be from 1"),
    (dict(priority=True), TypeError, "priority must be an int"),
    (dict(priority=1.5), TypeError, "priority must be an int"),
    (dict(priority="1"), TypeError, "priority must be an int"),
    (dict(run_at=datetime(2030, 1, 1)), ValueError, "timezone-aware"),
    (dict(run_at="2030-01-01"), TypeError, "run_at must be a datetime"),
    (dict(run_at=datetime.now(timezone.utc), delay=5), ValueError, "mutually exclusive"),
    (dict(delay=-1), ValueError, "delay must be >= 0"),
    (dict(delay="5"), TypeError, "delay must be seconds"),
    (dict(delay=float("nan")), ValueError, "finite"),
    (dict(delay=timedelta(seconds=-3)), ValueError, "delay must be >= 0"),
    (dict(max_attempts=0), ValueError, "max_attempts must be from 1"),
    (dict(max_attempts=1001), ValueError, "max_attempts must be from 1"),
    (dict(max_attempts=2.0), TypeError, "max_attempts must be an int"),
    (dict(timeout=0), ValueError, "timeout must be > 0"),
    (dict(timeout=-5), ValueError, "timeout must be > 0"),
    (dict(timeout="10"), TypeError, "timeout must be seconds"),
    (dict(unique=True), TypeError, "unique must be an awa_pool.Unique"),
    (dict(tags="one"), TypeError, "not a single string"),
    (dict(tags=[1]), TypeError, "each tag must be a string"),
    (dict(tags=[""]), ValueError, "each tag must not be empty"),
    (dict(tags=[f"t{i}" for i in range(21)]), ValueError, "at most 20 tags"),
    (dict(metadata=[1]), TypeError, "metadata must be a dict"),
    (dict(metadata={"a": object()}), TypeError, "not JSON-serializable"),
    (dict(ordering_key=""), ValueError, "ordering_key must not be empty"),
    (dict(ordering_key=3), TypeError, "ordering_key must be a string"),
]


@pytest.mark.parametrize("kwargs,exc,fragment", BAD_JOBS,
                         ids=[f"{next(iter(k))}-{i}" for i, (k, _, _) in enumerate(BAD_JOBS)])
def test_bad_job_raises_clear_error(kwargs: dict, exc: type, fragment: str) -> None:
    kwargs = dict(kwargs)
    kind = kwargs.pop("kind", "k")
    args = kwargs.pop("args", None)
    with pytest.raises(exc) as info:
        Job(kind, args, **kwargs)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


BAD_UNIQUES = [
    (dict(by_args="yes"), TypeError, "by_args must be a bool"),
    (dict(by_queue=1), TypeError, "by_queue must be a bool"),
    (dict(period=0), ValueError, "period must be > 0"),
    (dict(period=-10), ValueError, "period must be > 0"),
    (dict(states=["running", "bogus"]), ValueError, "bogus"),
    (dict(states="running"), TypeError, "collection"),
    (dict(states=[]), ValueError, "at least one state"),
]


@pytest.mark.parametrize("kwargs,exc,fragment", BAD_UNIQUES)
def test_bad_unique_raises(kwargs: dict, exc: type, fragment: str) -> None:
    with pytest.raises(exc) as info:
        Unique(**kwargs)
    assert fragment in str(info.value)


def test_unique_normalizes() -> None:
    unique = Unique(period=timedelta(hours=1), states=["running", JobState.AVAILABLE])
    assert unique.period == 3600.0
    assert unique.states == frozenset({JobState.RUNNING, JobState.AVAILABLE})
    assert Unique().states == awa_pool.DEFAULT_UNIQUE_STATES


def test_job_state_is_str_enum() -> None:
    assert JobState.COMPLETED == "completed"
    assert JobState("failed").terminal
    assert not JobState.RUNNING.terminal


def test_valid_edge_values_accepted() -> None:
    job = Job("k" * 200, {"n": 10 ** 30, "s": "ünïcödé ✓", "nested": {"l": [1, None, True]}},
              queue="q" * 200, priority=4, max_attempts=1000, timeout=timedelta(minutes=5),
              delay=timedelta(seconds=0), tags=["a"] * 20, metadata={"m": 1},
              ordering_key="customer-7")
    assert job.timeout == 300.0
    assert job.delay == 0.0


def test_invalid_job_touches_no_table(conn, dsn) -> None:
    """Construction fails before SQL, so the database is untouched."""
    from awa_pool import enqueue

    for kwargs, exc, _ in BAD_JOBS:
        kwargs = dict(kwargs)
        with pytest.raises(exc):
            enqueue(conn, Job(kwargs.pop("kind", "k"), kwargs.pop("args", None), **kwargs))
    assert conn.get_transaction_status() == 0  # idle: no statement was sent
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 0
    assert scalar(dsn, "SELECT count(*) FROM awa.unique_keys") == 0


def test_enqueue_rejects_non_jobs(conn) -> None:
    from awa_pool import enqueue, enqueue_many

    with pytest.raises(TypeError, match="expected an awa_pool.Job"):
        enqueue(conn, {"kind": "x"})
    with pytest.raises(TypeError, match="expected an awa_pool.Job"):
        enqueue_many(conn, [Job("ok"), "not a job"])
    assert conn.get_transaction_status() == 0


def test_python_and_sql_producers_share_the_job_defaults(dsn) -> None:
    """A raw SQL producer calling awa.insert_job without options gets the
    defaults a Job (and an undecorated kind) gets in Python."""
    import re

    from awa_pool.core.job import JOB_DEFAULTS

    signature = scalar(dsn, "SELECT pg_get_function_arguments('awa.insert_job'::regproc)")
    sql_defaults = dict(re.findall(r"(\w+) \w[\w ]*? DEFAULT ('[^']*'|\w+)", signature))
    assert sql_defaults["queue"] == f"'{JOB_DEFAULTS['queue']}'"
    assert int(sql_defaults["priority"]) == JOB_DEFAULTS["priority"]
    assert int(sql_defaults["max_attempts"]) == JOB_DEFAULTS["max_attempts"]
    assert sql_defaults["timeout_s"] == "NULL" and JOB_DEFAULTS["timeout"] is None
    job = Job("k")
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == tuple(
        JOB_DEFAULTS[name] for name in ("queue", "priority", "max_attempts", "timeout"))
