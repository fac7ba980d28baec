"""Queue policy has one owner (SPEC §11): awa.queues, set by set_queue and
`awa-pool queues set`. A supervisor's --queue rate=/dlq only fill a value
nobody set, never clear one, and one naming a different value keeps the
database's and warns once."""
from __future__ import annotations

import json

import pytest

import awa_pool
from awa_pool import Job
from cli_run import cli, ok
from helpers import connection, count_lines, enqueue_jobs, exec_records, query, record, scalar, wait_for


def _policy(dsn: str, queue: str = "default"):
    return query(dsn, "SELECT rate_per_s, dlq, shards FROM awa.queues WHERE name = %s", (queue,))


def _live(dsn: str) -> int:
    return scalar(dsn, "SELECT count(*) FROM awa.supervisors WHERE stopped_at IS NULL")


def _set(dsn: str, queue: str = "default", **settings):
    with connection(dsn) as conn:
        policy = awa_pool.set_queue(conn, queue, **settings)
        conn.commit()
    return policy


def test_a_supervisor_without_rate_or_dlq_clears_neither(dsn, pools):
    """The defect: each starting supervisor used to write its own spec's
    rate and dlq, so one started with a bare `--queue default` switched the
    fleet's rate limit and dead-lettering off."""
    pools.start("--queue", "default,rate=10/s,dlq", workers=2, name="owner")
    wait_for(lambda: _live(dsn) == 1, timeout=30, message="the first supervisor registered")
    pools.start("--queue", "default", workers=2, name="bare")
    wait_for(lambda: _live(dsn) == 2, timeout=30, message="the second supervisor registered")
    assert _policy(dsn) == [(10.0, True, 1)]

    doomed = enqueue_jobs(dsn, [Job("fail", max_attempts=1)])[0]
    enqueue_jobs(dsn, [Job("noop") for _ in range(30)])
    wait_for(lambda: count_lines(pools.log_dir, "noop") >= 30, timeout=30, message="30 jobs ran")
    starts = sorted(r[3] for r in exec_records(pools.log_dir) if r[0] == "noop")
    # the bucket holds a burst of 10, then 10 per second: 31 starts take 2 s
    assert starts[-1] - starts[0] >= 1.5, f"30 starts in {starts[-1] - starts[0]:.2f}s: the rate was cleared"
    wait_for(lambda: record(dsn, doomed).state == "failed", timeout=30, message="the failing job failed")
    assert record(dsn, doomed).dead_lettered, "dead-lettering was switched off"


def test_a_spec_naming_other_values_keeps_the_databases_and_warns_once(dsn, pools):
    _set(dsn, rate="20/s", dlq=False)
    sup = pools.start("--queue", "default,rate=5/s,dlq", workers=1)
    wait_for(lambda: _live(dsn) == 1, timeout=30, message="the supervisor registered")
    wait_for(lambda: "the database's value holds" in sup.log_path.read_text(), timeout=30,
             message="the warning about the overridden rate and dlq")
    assert _policy(dsn) == [(20.0, False, 1)]
    warnings = [line for line in sup.log_path.read_text().splitlines() if "the database's value holds" in line]
    assert len(warnings) == 1, warnings
    assert "rate=5/s (the database has 20/s)" in warnings[0] and "dlq" in warnings[0]


def test_a_spec_fills_what_nobody_set_and_names_no_conflict_when_equal(dsn, pools):
    _set(dsn, rate=3)   # dlq stays unset
    sup = pools.start("--queue", "default,rate=3/s,dlq", workers=1)
    wait_for(lambda: _live(dsn) == 1, timeout=30, message="the supervisor registered")
    wait_for(lambda: _policy(dsn) == [(3.0, True, 1)], timeout=30, message="dlq filled in")
    assert "the database's value holds" not in sup.log_path.read_text()


def test_set_queue_changes_only_what_it_names_and_none_clears(dsn):
    policy = _set(dsn, "emails", rate="30/m", dlq=True)
    assert (policy.queue, policy.rate, policy.dlq, policy.shards, policy.paused) == ("emails", 0.5, True, 1, False)
    assert _set(dsn, "emails", shards=4).rate == 0.5   # the rate stays
    assert _policy(dsn, "emails") == [(0.5, True, 4)]
    policy = _set(dsn, "emails", rate=None, dlq=None, shards=None)
    assert (policy.rate, policy.dlq, policy.shards) == (None, None, 1)
    assert _set(dsn, "emails", rate=12.5).rate == 12.5


@pytest.mark.parametrize("settings, error, message", [
    ({"rate": -1}, ValueError, "rate must be > 0"),
    ({"rate": 0}, ValueError, "rate must be > 0"),
    ({"rate": "fast"}, ValueError, "rate must look like 10/s"),
    ({"rate": "-3/s"}, ValueError, "rate must look like 10/s"),
    ({"rate": True}, TypeError, "rate must be a number"),
    ({"rate": [1]}, TypeError, "rate must be a number"),
    ({"dlq": "yes"}, TypeError, "dlq must be True, False or None"),
    ({"shards": 0}, ValueError, "shards must be an int from 1 to 64"),
    ({"shards": "4"}, ValueError, "shards must be an int from 1 to 64"),
    ({"weight": 3}, ValueError, "unknown queue setting 'weight'"),
    ({"rate": 5, "colour": "red"}, ValueError, "unknown queue setting 'colour'"),
    ({}, ValueError, "nothing to set"),
])
def test_set_queue_refuses_bad_input_and_changes_nothing(dsn, settings, error, message):
    _set(dsn, rate=7, dlq=True)
    with connection(dsn) as conn:
        with pytest.raises(error, match=message):
            awa_pool.set_queue(conn, "default", **settings)
        conn.commit()
    assert _policy(dsn) == [(7.0, True, 1)]


@pytest.mark.parametrize("name, error", [("", ValueError), ("q" * 201, ValueError), (7, TypeError)])
def test_set_queue_refuses_a_bad_queue_name(dsn, name, error):
    with connection(dsn) as conn:
        with pytest.raises(error, match="queue"):
            awa_pool.set_queue(conn, name, rate=1)
    assert scalar(dsn, "SELECT count(*) FROM awa.queues") == 0


def test_a_running_supervisor_applies_a_change_without_a_restart(dsn, pools):
    pools.start("--queue", "default", workers=1)
    wait_for(lambda: _live(dsn) == 1, timeout=30, message="the supervisor registered")
    first = enqueue_jobs(dsn, [Job("fail", max_attempts=1)])[0]
    wait_for(lambda: record(dsn, first).state == "failed", timeout=30, message="the first failure")
    assert not record(dsn, first).dead_lettered
    _set(dsn, dlq=True)
    second = enqueue_jobs(dsn, [Job("fail", max_attempts=1)])[0]
    wait_for(lambda: record(dsn, second).state == "failed", timeout=30, message="the second failure")
    assert record(dsn, second).dead_lettered


def test_queue_stats_reports_the_policy(dsn):
    enqueue_jobs(dsn, [Job("noop", queue="plain"), Job("noop", queue="limited")])
    _set(dsn, "limited", rate="2/s", dlq=True, shards=2)
    with connection(dsn) as conn:
        stats = {row.queue: row for row in awa_pool.queue_stats(conn)}
    assert (stats["limited"].rate, stats["limited"].dlq, stats["limited"].shards) == (2.0, True, 2)
    assert (stats["plain"].rate, stats["plain"].dlq, stats["plain"].shards) == (None, None, 1)
    assert stats["limited"].available == 1


def test_cli_sets_and_shows_the_policy(dsn):
    enqueue_jobs(dsn, [Job("noop", queue="render")])
    out = ok("queues", "set", "render", "--rate", "10/s", "--dlq", "--database-url", dsn)
    assert "rate 10/s, dlq on, global max no limit, 1 lane(s)" in out
    shown = json.loads(ok("queues", "show", "render", "--json", "--database-url", dsn))
    assert (shown["queue"], shown["rate"], shown["dlq"], shown["shards"]) == ("render", 10.0, True, 1)
    assert shown["stats"]["available"] == 1
    text = ok("queues", "show", "render", "--database-url", dsn)
    assert "rate 10/s, dlq on" in text and "1 available" in text
    ok("queues", "set", "render", "--rate", "none", "--no-dlq", "--database-url", dsn)
    assert _policy(dsn, "render") == [(None, False, 1)]
    # the whole table reports the policy too
    listed = {row["queue"]: row for row in json.loads(ok("queues", "--json", "--database-url", dsn))}
    assert listed["render"]["dlq"] is False and listed["render"]["rate"] is None


@pytest.mark.parametrize("args, message", [
    (["--rate", "-1"], "rate must look like 10/s"),
    (["--rate", "0/s"], "rate must be > 0"),
    (["--rate", "lots"], "rate must look like 10/s"),
    (["--shards", "0"], "shards must be an int from 1 to 64"),
    (["--shards", "many"], "expected a positive integer or none"),
    ([], "nothing to set"),
])
def test_cli_refuses_bad_settings_in_one_line_and_changes_nothing(dsn, args, message):
    enqueue_jobs(dsn, [Job("noop", queue="render")])
    _set(dsn, "render", rate=4)
    result = cli("queues", "set", "render", *args, "--database-url", dsn)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert _policy(dsn, "render") == [(4.0, None, 1)]


def test_cli_refuses_an_unknown_queue_unless_forced(dsn):
    for command in (["set", "nosuch", "--rate", "1/s"], ["show", "nosuch"]):
        result = cli("queues", *command, "--database-url", dsn)
        assert result.returncode == 1 and "unknown queue 'nosuch'" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert scalar(dsn, "SELECT count(*) FROM awa.queues") == 0
    ok("queues", "set", "nosuch", "--rate", "1/s", "--force", "--database-url", dsn)
    assert _policy(dsn, "nosuch") == [(1.0, None, 1)]
