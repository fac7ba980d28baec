"""Property-based tests (hypothesis): Job validation, the args / metadata /
result round trip through enqueue -> a real pool's handler -> the stored
result, and the --queue spec parser. Example counts stay modest: the round
trips go through a real supervisor, one job per example."""
from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Dict, Iterator

import psycopg2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awa_pool.core import job as awa_job

import awa_pool
from awa_pool import Job
from awa_pool.core.config import QueueConfig, parse_queue_spec
from awa_pool.core.errors import ConfigError
from cli_run import cli
from helpers import pool_connection, query, scalar, wait_for

# -- strategies ----------------------------------------------------------------------------

# Any text Postgres can store: every code point but NUL and lone surrogates.
CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
TEXT = st.text(alphabet=CHARS, max_size=40)
NAME = st.text(alphabet=CHARS, min_size=1, max_size=200)
SCALARS = (st.none() | st.booleans() | st.integers()
           | st.integers(min_value=-10 ** 80, max_value=10 ** 80)
           | st.floats(allow_nan=False, allow_infinity=False) | TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(TEXT, inner, max_size=4), max_leaves=25)
OBJECTS = st.dictionaries(TEXT, VALUES, max_size=6)


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def canonical(value: Any) -> Any:
    """JSON equality: jsonb keeps numbers as decimals, so 1e16 comes back as
    the integer 10000000000000000 and -0.0 as 0.0. Compare numbers by their
    decimal value, tuples as lists."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, (list, tuple)):
        return [canonical(item) for item in value]
    if isinstance(value, dict):
        return {key: canonical(item) for key, item in value.items()}
    raise AssertionError(f"not JSON: {value!r}")


# -- Job validation ---------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(kind=NAME, args=OBJECTS, queue=NAME, priority=st.integers(1, 4), max_attempts=st.integers(1, 1000),
       tags=st.lists(NAME, max_size=20), metadata=OBJECTS,
       when=st.one_of(st.none(), st.floats(0, 10 ** 6), st.timedeltas(timedelta(0), timedelta(days=3650)),
                      st.datetimes(timezones=st.just(timezone.utc))),
       timeout=st.one_of(st.none(), st.floats(0.001, 10 ** 6)), ordering_key=st.one_of(st.none(), NAME))
def test_valid_jobs_are_accepted_as_given(kind, args, queue, priority, max_attempts, tags, metadata, when,
                                          timeout, ordering_key) -> None:
    timing = {"run_at": when} if isinstance(when, datetime) else {"delay": when}
    job = Job(kind, args, queue=queue, priority=priority, max_attempts=max_attempts, tags=tags,
              metadata=metadata, timeout=timeout, ordering_key=ordering_key, **timing)
    assert (job.kind, job.queue, job.priority, job.max_attempts) == (kind, queue, priority, max_attempts)
    assert job.tags == tuple(tags) and job.ordering_key == ordering_key
    assert canonical(job.args) == canonical(args) and canonical(job.metadata) == canonical(metadata)
    assert canonical(json.loads(job.args_json)) == canonical(args)
    assert canonical(json.loads(job.metadata_json)) == canonical(metadata)


def _bad_text() -> st.SearchStrategy:
    """Text no job field may hold: empty, too long, with NUL, with a lone surrogate."""
    return st.one_of(
        st.just(""),
        st.text(min_size=201, max_size=260),
        st.builds(lambda a, b: a + "\x00" + b, TEXT, TEXT),
        st.builds(lambda a, b: a + "\ud83d" + b, TEXT, TEXT),
        st.integers(), st.none(), st.binary(min_size=1, max_size=5),
    )


def _bad_json() -> st.SearchStrategy:
    """Values that are not JSON: NaN, infinities, sets, bytes, objects, non-string
    keys, NUL or lone surrogates in strings or keys, nesting deeper than Python
    can encode."""
    return st.one_of(
        st.sampled_from([float("nan"), float("inf"), float("-inf")]),
        st.sets(st.integers(), min_size=1, max_size=3),
        st.binary(max_size=5), st.builds(object), st.builds(lambda: 1j),
        st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
        st.builds(lambda a: a + "\x00", TEXT), st.builds(lambda a: "\udfff" + a, TEXT),
        st.builds(lambda a: {a + "\x00": 1}, TEXT), st.builds(lambda a: {"\ud800" + a: 1}, TEXT),
        st.just(_deep(5000)),
    )


INVALID = st.one_of(
    st.builds(lambda v: ("kind", v), _bad_text()),
    st.builds(lambda v: ("queue", v), _bad_text()),
    st.builds(lambda v: ("tag", v), _bad_text()),
    st.builds(lambda v: ("ordering_key", v), _bad_text().filter(lambda v: v is not None)),
    st.builds(lambda v: ("args", v), st.one_of(st.lists(st.integers(), max_size=2), TEXT, st.integers(),
                                               st.booleans())),
    st.builds(lambda v: ("args_value", v), _bad_json()),
    st.builds(lambda v: ("metadata_value", v), _bad_json()),
    st.builds(lambda v: ("priority", v), st.one_of(st.integers().filter(lambda p: not 1 <= p <= 4),
                                                   st.booleans(), st.floats(), TEXT)),
    st.builds(lambda v: ("max_attempts", v), st.one_of(st.integers().filter(lambda p: not 1 <= p <= 1000),
                                                       st.booleans(), st.floats(), TEXT)),
    st.builds(lambda v: ("delay", v), st.one_of(st.floats(max_value=-0.001), st.just(float("nan")), TEXT)),
    st.builds(lambda v: ("timeout", v), st.one_of(st.floats(max_value=0), st.just(float("inf")), TEXT)),
    st.builds(lambda v: ("run_at", v), st.one_of(st.datetimes(timezones=st.none()), TEXT, st.integers())),
    st.builds(lambda: ("run_at_and_delay", None)),
    st.builds(lambda n: ("tags", n), st.integers(21, 40)),
    st.builds(lambda: ("tags", "a string")),
)


def _invalid_job(field: str, value: Any) -> Job:
    kwargs: Dict[str, Any] = {}
    kind, args = "valid_kind", {"ok": 1}
    if field == "kind":
        kind = value
    elif field == "args":
        args = value
    elif field == "args_value":
        args = {"key": value}
    elif field == "metadata_value":
        kwargs["metadata"] = {"key": value}
    elif field == "tag":
        kwargs["tags"] = ["fine", value]
    elif field == "tags":
        kwargs["tags"] = value if isinstance(value, str) else [f"t{i}" for i in range(value)]
    elif field == "run_at_and_delay":
        kwargs.update(run_at=datetime.now(timezone.utc), delay=5)
    else:
        kwargs[field] = value
    return Job(kind, args, **kwargs)


@settings(max_examples=300, deadline=None)
@given(case=INVALID)
def test_invalid_jobs_raise_type_or_value_error_in_one_line(case) -> None:
    field, value = case
    with pytest.raises((TypeError, ValueError)) as caught:
        _invalid_job(field, value)
    message = str(caught.value)
    assert message and "\n" not in message, repr(message)
    assert len(message) < 2000


def test_nesting_too_deep_for_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nest"):
        Job("k", {"deep": _deep(5000)})
    assert Job("k", {"deep": _deep(500)}).args_json.count("[") == 501


# -- the round trip through a real pool -------------------------------------------------------

@pytest.fixture
def echo_pool(pools, dsn) -> Iterator[psycopg2.extensions.connection]:
    """A supervisor running tests/apps/echo.py, and a connection to enqueue with."""
    with pool_connection(pools, dsn, "apps.echo") as conn:
        yield conn


def _run(conn, job: Job) -> awa_pool.JobRecord:
    job_id = awa_pool.enqueue(conn, job)
    conn.commit()
    record = awa_pool.wait(conn, [job_id], timeout=30)[0]
    conn.rollback()
    return record


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=OBJECTS, metadata=OBJECTS, tags=st.lists(NAME, max_size=4))
def test_args_and_metadata_round_trip_through_a_handler(echo_pool, args, metadata, tags) -> None:
    """What the producer enqueued is what the handler received and what the
    admin API reads back, and the handler's result is stored as returned."""
    record = _run(echo_pool, Job("echo", args, metadata=metadata, tags=tags))
    assert record.state == "completed", record.errors
    assert canonical(record.result["args"]) == canonical(args)
    assert canonical(record.result["metadata"]) == canonical(metadata)
    assert record.result["tags"] == tags and record.result["kind"] == "echo"
    assert canonical(record.args) == canonical(args) and canonical(record.metadata) == canonical(metadata)
    assert list(record.tags) == tags


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_any_json_result_is_stored_as_returned(echo_pool, value) -> None:
    record = _run(echo_pool, Job("echo_value", {"value": value}))
    assert record.state == "completed", record.errors
    if value is None:
        assert record.result is None   # a handler returning None stores no result
    else:
        assert canonical(record.result) == canonical(value)


def test_edge_values_round_trip_exactly(echo_pool) -> None:
    """Huge integers keep every digit; deep nesting, empty containers and
    every kind of character survive; a 5 MB args object is fine."""
    edges = {
        "huge_int": 10 ** 300 + 7, "negative_huge": -(2 ** 521 - 1), "zero": 0, "max_float": 1.7976931348623157e308,
        "tiny_float": 5e-324, "empty_list": [], "empty_object": {}, "empty_text": "",
        "unicode": "žluťoučký kůň 🐎 تست 中文 \u200b\u202e", "controls": "\x01\x02\t\n\r\x1b\x7f",
        "quotes": "'\";\\--/*", "deep": _deep(400), "keys": {"": 1, " ": 2, "\n": 3, "'": 4, "\\": 5},
    }
    record = _run(echo_pool, Job("echo", edges))
    assert record.state == "completed", (record.crashes, record.errors)
    assert record.result["args"]["huge_int"] == 10 ** 300 + 7
    assert record.result["args"]["negative_huge"] == -(2 ** 521 - 1)
    assert canonical(record.result["args"]) == canonical(edges)
    big = {"blob": "é" * (5 * 1024 * 1024 // 2), "n": 1}
    record = _run(echo_pool, Job("echo_value", {"value": 1, "big": big}))
    assert record.state == "completed" and record.result == 1
    assert record.args["big"] == big


@pytest.mark.parametrize("what,message", [
    ("nul", "NUL"),
    ("surrogate", "surrogate"),
    ("huge", "over the 1048576-byte limit"),
    ("deep", "deep"),
    ("nan", "NaN"),
    ("set", "not JSON-serializable"),
])
def test_results_that_cannot_be_stored_fail_clearly_and_spare_the_child(echo_pool, what, message) -> None:
    first = _run(echo_pool, Job("bad_value", {"what": what}, max_attempts=3))
    assert first.state == "failed" and first.attempt == 1, "not retried: retrying cannot help"
    error = first.errors[-1]["error"]
    assert message in error and "\n" not in error, error
    assert first.crashes == 0
    # the child that ran it is still serving
    after = _run(echo_pool, Job("echo", {"after": what}))
    assert after.state == "completed"
    assert awa_pool.get_job(echo_pool, after.id).result["args"] == {"after": what}


def test_args_deeper_than_python_can_decode_fail_without_crashing_a_child(echo_pool, dsn) -> None:
    """A raw SQL producer can store args nested deeper than Python's json can
    read: the job fails with a clear error; no child dies over it; reading
    it back (get_job, list_jobs, the CLI) shows a stand-in for those args
    instead of raising."""
    with echo_pool.cursor() as cur:
        cur.execute("SELECT awa.insert_job('echo', %s::jsonb, queue => 'echo')",
                    ('{"deep": ' + "[" * 3000 + "]" * 3000 + "}",))
        job_id = cur.fetchone()[0]
    echo_pool.commit()
    state = wait_for(lambda: (s := scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)))
                     in ("completed", "failed", "retryable") and s, timeout=30, message="the deep job to end")
    crashes, error = query(dsn, "SELECT crashes, errors->-1->>'error' FROM awa.jobs WHERE id = %s", (job_id,))[0]
    assert state == "failed" and crashes == 0, (state, crashes, error)
    assert "nest too deeply" in error and "\n" not in error
    assert _run(echo_pool, Job("echo", {"still": "alive"})).state == "completed"

    record = awa_pool.get_job(echo_pool, job_id)
    assert record.state == "failed" and list(record.args) == [awa_job.UNDECODABLE]
    assert "nested too deeply" in record.args[awa_job.UNDECODABLE]
    assert job_id in [r.id for r in awa_pool.list_jobs(echo_pool, queue="echo")]
    echo_pool.rollback()
    for args in (("jobs", "show", str(job_id)), ("jobs", "list", "--queue", "echo"),
                 ("jobs", "show", str(job_id), "--json")):
        result = cli(*args, "--database-url", dsn)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (args, result.stderr)
        assert "nested too deeply" in result.stdout or args[1] == "list", result.stdout


# -- the --queue spec parser -------------------------------------------------------------------

QUEUE_NAMES = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00,="),
                      min_size=1, max_size=200).filter(
    lambda name: name.strip() == name and name != "")


@st.composite
def queue_specs(draw) -> tuple:
    name = draw(QUEUE_NAMES)
    minimum = draw(st.integers(0, 50))
    maximum = draw(st.one_of(st.none(), st.integers(max(1, minimum), 500)))
    weight = draw(st.one_of(st.none(), st.integers(1, 1000).map(float), st.floats(0.01, 1000).map(lambda w: round(w, 3))))
    rate = draw(st.one_of(st.none(), st.tuples(st.integers(1, 10_000), st.sampled_from(["s", "m", "h", "sec", "min"]))))
    aging = draw(st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.sampled_from(["", "s", "m", "h", "ms"]))))
    dlq = draw(st.booleans())
    options = [f"min={minimum}"] if minimum or draw(st.booleans()) else []
    if maximum is not None:
        options.append(f"max={maximum}")
    if rate is not None:
        options.append(f"rate={rate[0]}/{rate[1]}")
    if aging is not None:
        options.append(f"aging={aging[0]}{aging[1]}")
    if dlq:
        options.append(draw(st.sampled_from(["dlq", "DLQ", " dlq "])))
    options = draw(st.permutations(options))
    head = name if weight is None else f"{name}={weight:g}"
    per = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "ms": 0.001}
    expected = QueueConfig(weight=float(f"{weight:g}") if weight is not None else 1.0, min=minimum, max=maximum,
                           rate=rate[0] / per[rate[1]] if rate else None,
                           aging=aging[0] * unit[aging[1]] if aging else QueueConfig().aging, dlq=dlq)
    return ",".join([head, *options]), name, expected


@settings(max_examples=300, deadline=None)
@given(case=queue_specs())
def test_valid_queue_specs_parse_to_what_they_say(case) -> None:
    spec, name, expected = case
    parsed_name, config = parse_queue_spec(spec)
    assert parsed_name == name
    assert config.min == expected.min and config.max == expected.max and config.dlq == expected.dlq
    assert math.isclose(config.weight, expected.weight, rel_tol=1e-9)
    assert (config.rate is None) == (expected.rate is None)
    if expected.rate is not None:
        assert math.isclose(config.rate, expected.rate, rel_tol=1e-9)
    assert math.isclose(config.aging, expected.aging, rel_tol=1e-9, abs_tol=1e-12)


INVALID_OPTIONS = st.one_of(
    st.sampled_from(["min=-1", "min=x", "max=0", "max=-3", "max=", "min", "rate=0/s", "rate=-1/s", "rate=fast",
                     "rate=1/day", "aging=-5", "aging=soon", "weight=0", "weight=-1", "weight=nan", "weight=inf",
                     "weight=", "bogus=1", "dlq=yes", "", "min=3,max=2"]),
    st.text(alphabet="abcxyz", min_size=1, max_size=8).filter(
        lambda k: k not in ("dlq",)).map(lambda k: f"{k}=1"),
)


@settings(max_examples=200, deadline=None)
@given(name=QUEUE_NAMES, bad=INVALID_OPTIONS)
def test_invalid_queue_specs_are_one_clear_config_error(name, bad) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_queue_spec(f"{name},{bad}")
    message = str(caught.value)
    assert message.startswith("--queue") and "\n" not in message


@settings(max_examples=300, deadline=None)
@given(spec=st.text(max_size=60))
def test_any_string_either_parses_or_is_a_config_error(spec) -> None:
    """Fuzz: no other exception escapes, and a parsed name is one a job could use."""
    try:
        name, config = parse_queue_spec(spec)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(config, QueueConfig)
    Job("k", queue=name)  # the name is valid as a job's queue
