"""Periodic jobs: declaration checks, tick computation (pure), registration,
the FireCron service against a real database, admin calls, and two real
supervisors firing an every-second schedule across a leader kill."""
from __future__ import annotations

import os
import signal
import threading
from datetime import datetime, timedelta, timezone
from typing import List

import psycopg2
import psycopg2.extensions
import pytest

import awa_pool
from awa_pool.core.errors import ConfigError
from awa_pool.worker.maintenance import FireCron
from awa_pool.core.periodic import CATCH_UP_CAP, declared, due_fire_times, make_schedule, next_fire_time
from awa_pool.api.periodic_admin import (UnknownSchedule, list_schedules, pause_schedule, register_schedules,
                                     resume_schedule, trigger_schedule)
from helpers import query, scalar, wait_for

UTC = timezone.utc


def _fires(dsn: str, name: str) -> List[tuple]:
    """(fire_at, job_id, metadata) of every fired tick of a schedule, in tick order."""
    return query(dsn, "SELECT f.fire_at, f.job_id, j.metadata FROM awa.cron_fires f "
                      "JOIN awa.jobs j ON j.id = f.job_id WHERE f.name = %s ORDER BY f.fire_at", (name,))


# -- declaration ---------------------------------------------------------------

@pytest.mark.parametrize("expression", [
    "bad", "* * * *", "61 * * * *", "* 25 * * *", "* * * * * * *", "0 0 31 2 *", "", "   ",
    "*/0 * * * *", "0 0 * * 8x", None, 5,
])
def test_invalid_cron_expression_fails_at_declaration(expression) -> None:
    with pytest.raises(ConfigError) as info:
        awa_pool.periodic("bad_cron", expression, "noop")
    message = str(info.value)
    assert "bad_cron" in message and "\n" not in message
    assert "bad_cron" not in {s.name for s in declared()}


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "Europe/Pariss", "UTC+3", None, 1])
def test_invalid_time_zone_fails_at_declaration(zone) -> None:
    with pytest.raises(ConfigError) as info:
        awa_pool.periodic("bad_zone", "0 2 * * *", "noop", timezone=zone)
    assert "time zone" in str(info.value) or "timezone" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs", [
    {"missed_fire_policy": "fire_all"},
    {"args": [1, 2]},
    {"args": {"s": {1, 2}}},
    {"metadata": "x"},
    {"queue": ""},
    {"priority": 9},
    {"max_attempts": 0},
    {"tags": "one-string"},
])
def test_other_invalid_declarations_fail_with_config_error(kwargs) -> None:
    with pytest.raises(ConfigError):
        awa_pool.periodic("bad_other", "* * * * *", "noop", **kwargs)
    with pytest.raises(ConfigError):
        awa_pool.periodic("", "* * * * *", "noop")
    with pytest.raises(ConfigError):
        awa_pool.periodic("x" * 201, "* * * * *", "noop")
    with pytest.raises(ConfigError):
        awa_pool.periodic("no_kind", "* * * * *", "")


def test_declaration_registry_and_redeclaration() -> None:
    first = awa_pool.periodic("test_periodic_decl", "0 2 * * *", "build_report", {"fmt": "pdf"},
                              timezone="Europe/Paris", queue="reports")
    assert first in declared()
    # the same declaration again (a module imported twice) is fine
    assert awa_pool.periodic("test_periodic_decl", "0  2 * * *", "build_report", {"fmt": "pdf"},
                             timezone="Europe/Paris", queue="reports") == first
    with pytest.raises(ConfigError, match="already declared"):
        awa_pool.periodic("test_periodic_decl", "0 3 * * *", "build_report", {"fmt": "pdf"},
                          timezone="Europe/Paris", queue="reports")


# -- tick computation (pure) ---------------------------------------------------

def _t(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def test_six_fields_put_seconds_first() -> None:
    start = _t(2024, 1, 1, 0, 0, 0)
    assert next_fire_time("*/15 * * * * *", "UTC", start) == _t(2024, 1, 1, 0, 0, 15)
    assert next_fire_time("30 0 * * * *", "UTC", start) == _t(2024, 1, 1, 0, 0, 30)
    assert next_fire_time("*/15 * * * *", "UTC", start) == _t(2024, 1, 1, 0, 15, 0)
    assert next_fire_time("@hourly", "UTC", start) == _t(2024, 1, 1, 1, 0, 0)


def test_coalesce_fires_once_and_catch_up_replays_in_order() -> None:
    now = _t(2024, 1, 1, 0, 0, 10) + timedelta(microseconds=500_000)
    last = _t(2024, 1, 1, 0, 0, 4)
    assert due_fire_times("* * * * * *", "UTC", last, now, "coalesce") == [_t(2024, 1, 1, 0, 0, 10)]
    assert due_fire_times("* * * * * *", "UTC", last, now, "catch_up") == [
        _t(2024, 1, 1, 0, 0, s) for s in range(5, 11)]
    # a tick exactly at `now` is due; nothing after it
    assert due_fire_times("*/5 * * * * *", "UTC", last, _t(2024, 1, 1, 0, 0, 10), "catch_up") == [
        _t(2024, 1, 1, 0, 0, 5), _t(2024, 1, 1, 0, 0, 10)]
    assert due_fire_times("* * * * * *", "UTC", _t(2024, 1, 1, 0, 0, 10), now, "catch_up") == []


def test_catch_up_is_capped_to_the_newest_missed_ticks() -> None:
    now = _t(2024, 6, 1, 12, 0, 0)
    ticks = due_fire_times("* * * * * *", "UTC", now - timedelta(days=365), now, "catch_up")
    assert len(ticks) == CATCH_UP_CAP
    assert ticks[-1] == now and ticks[0] == now - timedelta(seconds=CATCH_UP_CAP - 1)
    assert ticks == sorted(ticks)
    assert len(due_fire_times("* * * * * *", "UTC", now - timedelta(days=1), now, "catch_up", cap=7)) == 7


def test_brand_new_schedule_fires_only_its_latest_due_tick() -> None:
    now = _t(2024, 6, 1, 12, 0, 0, ) + timedelta(seconds=30)
    for policy in ("coalesce", "catch_up"):
        assert due_fire_times("0 * * * *", "UTC", None, now, policy) == [_t(2024, 6, 1, 12, 0, 0)]


def test_daylight_saving_changes_follow_croniter() -> None:
    paris = "Europe/Paris"
    # spring forward (2024-03-31 02:00 -> 03:00): 02:30 does not exist that day
    spring = [next_fire_time("30 2 * * *", paris, _t(2024, 3, 29, 12))]
    for _ in range(2):
        spring.append(next_fire_time("30 2 * * *", paris, spring[-1]))
    assert spring == [_t(2024, 3, 30, 1, 30), _t(2024, 3, 31, 1, 0), _t(2024, 4, 1, 0, 30)]
    # fall back (2024-10-27 03:00 -> 02:00): 02:30 happens twice, both fire
    ticks = due_fire_times("*/30 * * * *", paris, _t(2024, 10, 26, 23, 45), _t(2024, 10, 27, 2, 5),
                           "catch_up")
    assert ticks == [_t(2024, 10, 27, 0, 0), _t(2024, 10, 27, 0, 30), _t(2024, 10, 27, 1, 0),
                     _t(2024, 10, 27, 1, 30), _t(2024, 10, 27, 2, 0)]
    # a daily local-time schedule keeps its local hour across the change
    assert next_fire_time("0 9 * * *", paris, _t(2024, 10, 26, 12)) == _t(2024, 10, 27, 8, 0)
    assert next_fire_time("0 9 * * *", paris, _t(2024, 10, 25, 12)) == _t(2024, 10, 26, 7, 0)


# -- registration ----------------------------------------------------------------

def test_register_upserts_without_touching_pause_or_last_fire(auto, dsn) -> None:
    other = make_schedule("other_deployment", "0 * * * *", "theirs")
    register_schedules(auto, [other])
    nightly = make_schedule("nightly", "0 2 * * *", "build_report", {"fmt": "pdf"},
                            timezone="Europe/Paris", queue="reports", tags=("ops",),
                            metadata={"team": "data"})
    assert register_schedules(auto, [nightly]) == 1
    row = query(dsn, "SELECT expression, timezone, kind, queue, args, priority, max_attempts, tags, "
                     "metadata, missed_fire_policy, paused, last_fire_at > now() - interval '1 minute' "
                     "FROM awa.cron_jobs WHERE name = 'nightly'")[0]
    assert row == ("0 2 * * *", "Europe/Paris", "build_report", "reports", {"fmt": "pdf"}, 2, 25,
                   ["ops"], {"team": "data"}, "coalesce", False, True)
    assert register_schedules(auto, [nightly]) == 0, "an unchanged schedule is not rewritten"

    pause_schedule(auto, "nightly")
    query(dsn, "UPDATE awa.cron_jobs SET last_fire_at = '2020-01-01T02:00:00+01' WHERE name = 'nightly'")
    changed = make_schedule("nightly", "0 3 * * *", "build_report", {"fmt": "html"},
                            timezone="Europe/Paris", queue="reports", missed_fire_policy="catch_up")
    assert register_schedules(auto, [changed]) == 1
    expression, args, policy, paused, last = query(
        dsn, "SELECT expression, args, missed_fire_policy, paused, last_fire_at FROM awa.cron_jobs "
             "WHERE name = 'nightly'")[0]
    assert (expression, args, policy, paused) == ("0 3 * * *", {"fmt": "html"}, "catch_up", True)
    assert last == datetime(2020, 1, 1, 1, 0, tzinfo=UTC)
    assert scalar(dsn, "SELECT count(*) FROM awa.cron_jobs WHERE name = 'other_deployment'") == 1


def test_registration_takes_the_task_defaults() -> None:
    @awa_pool.task("test_periodic_defaults_kind", queue="reports", priority=3, max_attempts=4)
    def handler() -> None:
        return None

    resolved = make_schedule("with_defaults", "0 2 * * *", "test_periodic_defaults_kind").resolved()
    assert (resolved["queue"], resolved["priority"], resolved["max_attempts"]) == ("reports", 3, 4)
    explicit = make_schedule("explicit", "0 2 * * *", "test_periodic_defaults_kind", queue="q",
                             priority=1, max_attempts=9).resolved()
    assert (explicit["queue"], explicit["priority"], explicit["max_attempts"]) == ("q", 1, 9)
    unknown = make_schedule("unknown_kind", "0 2 * * *", "nobody_handles_this").resolved()
    assert (unknown["queue"], unknown["priority"], unknown["max_attempts"]) == ("default", 2, 25)


# -- firing (FireCron.tick against the database) ------------------------------------

def test_fire_cron_coalesce_fires_once_with_metadata(auto, dsn) -> None:
    register_schedules(auto, [make_schedule("coalesced", "* * * * * *", "cron_tick", {"n": 1},
                                            queue="cron", metadata={"team": "ops"})])
    query(dsn, "UPDATE awa.cron_jobs SET last_fire_at = now() - interval '1 hour'")
    service = FireCron()
    with auto.cursor() as cur:
        assert service.tick(cur) == 1
    fires = _fires(dsn, "coalesced")
    assert len(fires) == 1
    fire_at, job_id, metadata = fires[0]
    assert fire_at.microsecond == 0
    assert scalar(dsn, "SELECT last_fire_at FROM awa.cron_jobs WHERE name = 'coalesced'") == fire_at
    assert metadata == {"team": "ops", "awa:cron": "coalesced",
                        "awa:fire_at": fire_at.astimezone(UTC).isoformat()}
    record = awa_pool.get_job(auto, job_id)
    assert (record.kind, record.queue, record.args, record.state) == ("cron_tick", "cron", {"n": 1}, "available")
    assert datetime.fromisoformat(record.metadata["awa:fire_at"]) == fire_at


def test_catch_up_replays_missed_ticks_up_to_the_cap(auto, dsn) -> None:
    register_schedules(auto, [
        make_schedule("hourly_catch_up", "0 * * * *", "cron_tick", missed_fire_policy="catch_up"),
        make_schedule("hourly_coalesce", "0 * * * *", "cron_tick"),
        make_schedule("secondly_catch_up", "* * * * * *", "cron_tick", missed_fire_policy="catch_up"),
    ])
    query(dsn, "UPDATE awa.cron_jobs SET last_fire_at = date_trunc('hour', now()) - interval '5 hours' "
               "+ interval '1 second' WHERE name LIKE 'hourly%%'")
    query(dsn, "UPDATE awa.cron_jobs SET last_fire_at = now() - interval '150 seconds' "
               "WHERE name = 'secondly_catch_up'")
    before = dict(query(dsn, "SELECT name, last_fire_at FROM awa.cron_jobs"))
    with auto.cursor() as cur:
        FireCron().tick(cur)
    after = dict(query(dsn, "SELECT name, last_fire_at FROM awa.cron_jobs"))

    hourly = [f[0] for f in _fires(dsn, "hourly_catch_up")]
    assert len(hourly) >= 5 and hourly[-1] == after["hourly_catch_up"]
    assert hourly == due_fire_times("0 * * * *", "UTC", before["hourly_catch_up"],
                                    after["hourly_catch_up"], "catch_up")
    assert all(b - a == timedelta(hours=1) for a, b in zip(hourly, hourly[1:]))

    coalesced = [f[0] for f in _fires(dsn, "hourly_coalesce")]
    assert coalesced == [after["hourly_coalesce"]] and coalesced[0] == hourly[-1]

    secondly = [f[0] for f in _fires(dsn, "secondly_catch_up")]
    assert len(secondly) == CATCH_UP_CAP, "150 missed ticks replay only the newest 100"
    assert all(b - a == timedelta(seconds=1) for a, b in zip(secondly, secondly[1:]))
    assert secondly[0] > before["secondly_catch_up"] + timedelta(seconds=40)
    # the jobs are there, one per tick, in tick order
    ids = [f[1] for f in _fires(dsn, "secondly_catch_up")]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE kind = 'cron_tick'") == \
        len(hourly) + len(coalesced) + len(secondly)


def test_new_schedule_does_not_backfill(auto, dsn) -> None:
    register_schedules(auto, [make_schedule("yearly", "0 0 1 1 *", "cron_tick",
                                            missed_fire_policy="catch_up")])
    with auto.cursor() as cur:
        assert FireCron().tick(cur) == 0
    # a row written by hand with no last fire fires its latest tick only
    query(dsn, "INSERT INTO awa.cron_jobs (name, expression, kind, missed_fire_policy) "
               "VALUES ('raw_sql', '0 * * * *', 'cron_tick', 'catch_up')")
    with auto.cursor() as cur:
        assert FireCron().tick(cur) == 1
    (fire_at, _, _), = _fires(dsn, "raw_sql")
    assert fire_at == scalar(dsn, "SELECT date_trunc('hour', last_fire_at) FROM awa.cron_jobs "
                                  "WHERE name = 'raw_sql'")


def test_two_leaders_by_accident_cannot_double_fire(dsn) -> None:
    setup = psycopg2.connect(dsn)
    setup.autocommit = True
    register_schedules(setup, [make_schedule("contended", "* * * * * *", "cron_tick",
                                             missed_fire_policy="catch_up")])
    query(dsn, "UPDATE awa.cron_jobs SET last_fire_at = date_trunc('second', now()) - interval '5 seconds'")
    expected = scalar(dsn, "SELECT last_fire_at FROM awa.cron_jobs")
    ticks = [expected + timedelta(seconds=s) for s in range(1, 6)]
    fire = "SELECT fire_at, job_id FROM awa.fire_cron(%s, %s, %s::timestamptz[])"

    first = psycopg2.connect(dsn)            # leader 1: fires, not committed yet
    second = psycopg2.connect(dsn)           # leader 2: same decision, same moment
    second.autocommit = True
    results = {}
    try:
        with first.cursor() as cur:
            cur.execute(fire, ("contended", expected, ticks))
            results["first"] = cur.fetchall()

        def other() -> None:
            with second.cursor() as cur:
                cur.execute(fire, ("contended", expected, ticks))
                results["second"] = cur.fetchall()

        thread = threading.Thread(target=other)
        thread.start()
        wait_for(lambda: scalar(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                     "current_database() AND wait_event_type = 'Lock'") == 1,
                 timeout=10, message="the second leader to block on the schedule row")
        first.commit()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        first.close()
        second.close()
    assert len(results["first"]) == 5 and results["second"] == []

    # even with last_fire_at rewound (an operator, a restore), fired ticks stay fired
    query(dsn, "UPDATE awa.cron_jobs SET last_fire_at = %s", (expected,))
    assert query(dsn, fire, ("contended", expected, ticks)) == []
    assert scalar(dsn, "SELECT last_fire_at FROM awa.cron_jobs") == ticks[-1]
    # a stale expectation fires nothing
    assert query(dsn, fire, ("contended", expected - timedelta(seconds=1), ticks)) == []
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 5
    assert scalar(dsn, "SELECT count(DISTINCT metadata->>'awa:fire_at') FROM awa.jobs") == 5
    setup.close()


def test_invalid_stored_schedule_is_skipped_not_fatal(auto, dsn) -> None:
    register_schedules(auto, [make_schedule("good", "* * * * * *", "cron_tick")])
    query(dsn, "INSERT INTO awa.cron_jobs (name, expression, timezone, kind, last_fire_at) VALUES "
               "('bad_expr', 'not cron', 'UTC', 'x', now() - interval '1 hour'), "
               "('bad_zone', '* * * * *', 'Nowhere/Land', 'x', now() - interval '1 hour')")
    query(dsn, "UPDATE awa.cron_jobs SET last_fire_at = now() - interval '1 minute'")
    with auto.cursor() as cur:
        assert FireCron().tick(cur) == 1
    listed = {info.name: info for info in list_schedules(auto)}
    assert listed["good"].next_fire_at is not None and listed["good"].error is None
    assert listed["bad_expr"].next_fire_at is None and listed["bad_expr"].error
    assert listed["bad_zone"].next_fire_at is None and listed["bad_zone"].error


# -- admin -------------------------------------------------------------------------

def test_pause_resume_trigger_and_list(auto, dsn) -> None:
    register_schedules(auto, [make_schedule("admin_me", "0 * * * *", "cron_tick", {"a": 1})])
    query(dsn, "UPDATE awa.cron_jobs SET last_fire_at = now() - interval '3 hours'")
    info, = list_schedules(auto)
    assert info.name == "admin_me" and not info.paused
    assert info.next_fire_at == next_fire_time("0 * * * *", "UTC", info.last_fire_at)

    pause_schedule(auto, "admin_me")
    with auto.cursor() as cur:
        assert FireCron().tick(cur) == 0, "a paused schedule does not fire"
    info, = list_schedules(auto, "admin_me")
    assert info.paused and info.next_fire_at > scalar(dsn, "SELECT now()")

    job_id = trigger_schedule(auto, "admin_me")  # works while paused
    record = awa_pool.get_job(auto, job_id)
    assert record.kind == "cron_tick" and record.args == {"a": 1}
    assert record.metadata["awa:trigger"] == "manual" and record.metadata["awa:cron"] == "admin_me"
    assert scalar(dsn, "SELECT count(*) FROM awa.cron_fires") == 0, "a trigger is not a tick"

    resume_schedule(auto, "admin_me")
    info, = list_schedules(auto)
    assert not info.paused
    assert info.last_fire_at >= scalar(dsn, "SELECT now() - interval '1 minute'"), \
        "ticks missed while paused are skipped"
    with auto.cursor() as cur:
        assert FireCron().tick(cur) == 0

    for call in (pause_schedule, resume_schedule, trigger_schedule):
        with pytest.raises(UnknownSchedule, match="no periodic job named 'missing'"):
            call(auto, "missing")


def test_admin_calls_never_commit(conn, dsn) -> None:
    setup = psycopg2.connect(dsn)
    setup.autocommit = True
    register_schedules(setup, [make_schedule("tx", "0 * * * *", "cron_tick")])
    setup.close()
    pause_schedule(conn, "tx")
    trigger_schedule(conn, "tx")
    conn.rollback()
    assert scalar(dsn, "SELECT paused FROM awa.cron_jobs") is False
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 0


# -- real supervisors ------------------------------------------------------------------

def test_every_second_schedule_fires_once_per_tick_across_a_leader_kill(pools, dsn) -> None:
    """Two supervisors run apps.cron's every-second catch_up schedule for
    about ten seconds; the leader is killed with SIGKILL half-way. Every
    tick in the window fires exactly once: no duplicate, no gap."""
    supervisors = [pools.start(app="apps.cron", workers=1, name=f"cron{i}") for i in range(2)]
    first = wait_for(lambda: scalar(dsn, "SELECT min(fire_at) FROM awa.cron_fires"), timeout=30,
                     message="the first tick to fire")
    wait_for(lambda: scalar(dsn, "SELECT max(fire_at) FROM awa.cron_fires") >= first + timedelta(seconds=4),
             timeout=20, message="five seconds of ticks")
    leader_pid = wait_for(lambda: scalar(dsn, "SELECT pid FROM awa.supervisors WHERE is_leader"),
                          timeout=10, message="a leader")
    assert leader_pid in {p.pid for p in supervisors}
    os.kill(leader_pid, signal.SIGKILL)
    killed_at = scalar(dsn, "SELECT now()")
    survivor = next(p for p in supervisors if p.pid != leader_pid)
    wait_for(lambda: scalar(dsn, "SELECT pid FROM awa.supervisors WHERE is_leader") == survivor.pid,
             timeout=10, message="the other supervisor to take over")
    wait_for(lambda: scalar(dsn, "SELECT max(fire_at) FROM awa.cron_fires") >= killed_at + timedelta(seconds=5),
             timeout=20, message="five seconds of ticks after the kill")

    fires = [row[0] for row in query(dsn, "SELECT fire_at FROM awa.cron_fires WHERE name = 'every_second' "
                                          "ORDER BY fire_at")]
    assert len(fires) >= 10
    steps = {b - a for a, b in zip(fires, fires[1:])}
    assert steps == {timedelta(seconds=1)}, f"gaps or duplicates between ticks: {sorted(steps)}"
    jobs = query(dsn, "SELECT metadata->>'awa:fire_at', count(*) FROM awa.jobs "
                      "WHERE metadata->>'awa:cron' = 'every_second' GROUP BY 1")
    assert all(n == 1 for _, n in jobs), "one job per tick"
    assert sorted(datetime.fromisoformat(at) for at, _ in jobs) == fires
    assert survivor.poll() is None
