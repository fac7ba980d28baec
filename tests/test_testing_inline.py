"""The pieces under the pytest plugin, used from this suite (where the plugin
is active too): testdb's template and clones, testing.run_jobs and
enqueued.Enqueued."""
from __future__ import annotations

import datetime
import secrets

import psycopg2
import pytest

import awa_pool
from awa_pool.testkit import testdb
from awa_pool.api.migrate import LATEST_VERSION, MIGRATIONS
from awa_pool.testing import Enqueued, TooManyJobs, run_jobs
from helpers import query, scalar


@awa_pool.task("inline_snooze_forever", queue="inline_a")
def snooze_forever() -> None:
    raise awa_pool.Snooze(0)


@awa_pool.task("inline_echo", queue="inline_b")
def echo(word: str) -> str:
    return word


def _oid(server_url: str, name: str):
    return scalar(server_url, "SELECT oid FROM pg_database WHERE datname = %s", (name,))


def _other_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if a migration had been edited: another fingerprint, another template."""
    version, name, text = MIGRATIONS[-1]
    edited = f"{text}\n-- edited {secrets.token_hex(4)}\n"
    monkeypatch.setattr(testdb, "MIGRATIONS", MIGRATIONS[:-1] + [(version, name, edited)])


def _drop(server_url: str, *names: str) -> None:
    conn = psycopg2.connect(testdb.with_database(server_url, "postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        for name in names:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.close()


def test_the_template_is_named_after_the_schema_and_shared(awa_server, server_url: str) -> None:
    assert awa_server.template_name == f"awa_tpl_{testdb.schema_fingerprint()}"
    built = _oid(server_url, awa_server.ensure_template())
    other = testdb.TestServer(server_url, worker="gw7")      # another worker, another session
    name = other.create_database()
    try:
        assert other.ensure_template() == awa_server.template_name
        assert _oid(server_url, other.template_name) == built  # reused, not rebuilt
        assert name.startswith("awa_t_gw7_")
        assert scalar(other.url_for(name), "SELECT max(version) FROM awa.schema_migrations") == LATEST_VERSION
    finally:
        other.drop_database(name)
        other.close()                                          # waits for the background drop
    assert _oid(server_url, name) is None
    comment = scalar(server_url, "SELECT shobj_description(oid, 'pg_database') FROM pg_database "
                                 "WHERE datname = %s", (awa_server.template_name,))
    assert comment.startswith(testdb.TEMPLATE_MARKER)


def test_a_schema_change_builds_a_new_template_and_retires_unused_ones(
        server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = testdb.schema_fingerprint()
    _other_schema(monkeypatch)
    assert testdb.schema_fingerprint() != before
    tag = secrets.token_hex(3)
    stale, recent = f"awa_tpl_stale{tag}", f"awa_tpl_recent{tag}"
    server = testdb.TestServer(server_url, worker="schema")
    try:
        conn = psycopg2.connect(testdb.with_database(server_url, "postgres"))
        conn.autocommit = True
        with conn.cursor() as cur:
            for name, used in ((stale, "2020-01-01"), (recent, datetime.date.today().isoformat())):
                cur.execute(f'CREATE DATABASE "{name}"')
                cur.execute(f'COMMENT ON DATABASE "{name}" IS %s', (testdb.TEMPLATE_MARKER + used,))
        conn.close()
        assert _oid(server_url, server.template_name) is None
        server.ensure_template()
        assert _oid(server_url, server.template_name) is not None
        assert _oid(server_url, stale) is None, "a template unused for weeks is dropped"
        assert _oid(server_url, recent) is not None, "a template in use stays"
        # dropped under the session (by hand, or by another session): rebuilt on the next clone
        _drop(server_url, server.template_name)
        with server.database() as url:
            assert scalar(url, "SELECT max(version) FROM awa.schema_migrations") == LATEST_VERSION
    finally:
        server.close()
        _drop(server_url, server.template_name, stale, recent)


def test_run_jobs_serves_every_queue_or_one(awa_conn, awa_run_jobs) -> None:
    ids = [echo.enqueue(awa_conn, word=word) for word in ("a", "b")]
    other = awa_pool.enqueue(awa_conn, awa_pool.Job("inline_echo", {"word": "c"}, queue="inline_c"))
    assert [(run.id, run.result) for run in awa_run_jobs(queue="inline_c")] == [(other, "c")]
    runs = awa_run_jobs()
    assert [(run.id, run.queue, run.state, run.outcome) for run in runs] == [
        (ids[0], "inline_b", "completed", "completed"), (ids[1], "inline_b", "completed", "completed")]
    assert awa_run_jobs() == []


def test_run_jobs_stops_a_job_that_never_ends(awa_conn) -> None:
    job_id = snooze_forever.enqueue(awa_conn)
    with pytest.raises(TooManyJobs, match=r"ran max_jobs=5 jobs and 1 more are due"):
        run_jobs(awa_conn, max_jobs=5)
    assert scalar_in(awa_conn, "SELECT state::text FROM awa.jobs WHERE id = %s", job_id) == "available"
    with pytest.raises(ValueError, match="max_jobs must be an int >= 1"):
        run_jobs(awa_conn, max_jobs=0)


def scalar_in(conn, sql: str, *params):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()[0]


def test_enqueued_matches_fields_and_lists_what_was_enqueued(awa_conn, awa_enqueued) -> None:
    first = awa_pool.enqueue(awa_conn, awa_pool.Job("report", {"n": 0, "fmt": "pdf"}, tags=("nightly",),
                                                    priority=1))
    for n in range(1, 25):
        awa_pool.enqueue(awa_conn, awa_pool.Job("report", {"n": n, "fmt": "pdf"}))
    assert awa_enqueued.assert_enqueued("report", tags=["nightly"], priority=1).id == first
    assert awa_enqueued.assert_enqueued("report", args_include={"fmt": "pdf"}, count=25).id == first
    assert [record.args["n"] for record in awa_enqueued.jobs("report")] == list(range(25))
    with pytest.raises(AssertionError) as failed:
        awa_enqueued.assert_enqueued("report", args_include={"fmt": "pdf"}, count=3)
    lines = str(failed.value).splitlines()
    assert lines[0].startswith("expected 3 job(s) of kind 'report' with args including {'fmt': 'pdf'}, "
                               f"found 25 (ids [{first}, ")
    assert lines[0].endswith("; enqueued instead (25):")
    assert lines[1] == f"  #{first} report args={{'n': 0, 'fmt': 'pdf'}} queue='default' state='available'"
    assert lines[-1] == "  ... and 5 more" and len(lines) == 22
    with pytest.raises(TypeError, match=r"unknown job field\(s\) colour: use args=, args_include= or one of id,"):
        awa_enqueued.jobs("report", colour="red")


def test_run_jobs_and_enqueued_take_a_connection_of_the_callers(dsn: str, awa_run_jobs) -> None:
    """As with a Django or SQLAlchemy test database: no awa_conn needed."""
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(dsn) as other:
        job_id = echo.enqueue(other, word="x")
        Enqueued(other).assert_enqueued("inline_echo", {"word": "x"}, state="available")
        assert [(run.id, run.state, run.result) for run in awa_run_jobs(conn=other)] == [
            (job_id, "completed", "x")]
        Enqueued(other).assert_enqueued("inline_echo", {"word": "x"}, state="completed")


def test_the_suite_runs_on_the_plugins_databases(awa_database: str, dsn: str, conn, awa_conn) -> None:
    assert dsn == awa_database and conn is awa_conn
    assert query(dsn, "SELECT current_database()")[0][0].startswith("awa_t_")
