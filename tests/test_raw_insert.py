"""INSERT INTO awa.jobs (SPEC §12, migration 0028): raw SQL producers in
any language insert one row or many, INSERT ... SELECT included, and
RETURNING id gives the job ids; each row takes awa.insert_job's path
(defaults, lanes, unique keys, NOTIFY at commit), a bad row fails the
whole statement with one clear SQL error, and nothing else on the view
becomes writable."""
from __future__ import annotations

import select
import time
import uuid

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest

import awa_pool
from awa_pool import Job
from helpers import connection, query, record, scalar, wait_for

RAW = ("INSERT INTO awa.jobs (kind, args, queue, priority, run_at, max_attempts, timeout_s, tags, "
       "metadata, ordering_key, unique_opts) VALUES ")   # retry_policy and expires_at: see their own test


def _inserted(conn, statement: str, params=None) -> list:
    with conn.cursor() as cur:
        cur.execute(statement, params)
        return [row[0] for row in cur.fetchall()] if cur.description else []


def _inbox_is_empty(dsn: str) -> None:
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_inbox") == 0, "rows stayed behind in awa.jobs_inbox"


def test_one_row_many_rows_and_insert_select_return_their_ids_in_order(dsn) -> None:
    with connection(dsn) as conn:
        one = _inserted(conn, "INSERT INTO awa.jobs (kind, args) VALUES ('one', '{\"n\": 1}') RETURNING id")
        many = _inserted(conn, "INSERT INTO awa.jobs (kind, args) VALUES ('m', '{\"n\": 1}'), ('m', '{\"n\": 2}'), "
                               "('m', '{\"n\": 3}') RETURNING id")
        selected = _inserted(conn, "INSERT INTO awa.jobs (kind, args, queue) SELECT 'sel', jsonb_build_object('n', i), "
                                   "'q' || (i % 2) FROM generate_series(1, 50) i RETURNING id")
        silent = _inserted(conn, "INSERT INTO awa.jobs (kind) VALUES ('no_returning')")
        conn.commit()
        records = [awa_pool.get_job(conn, i) for i in one + many + selected]
    assert len(one) == 1 and silent == []
    assert many == sorted(many) and selected == sorted(selected) and len(set(selected)) == 50
    assert [r.args["n"] for r in records[1:4]] == [1, 2, 3]
    assert [r.args["n"] for r in records[4:]] == list(range(1, 51))
    assert {r.queue for r in records[4:]} == {"q0", "q1"}
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 55
    _inbox_is_empty(dsn)


def test_a_raw_row_gets_insert_jobs_defaults_and_every_given_column(dsn) -> None:
    with connection(dsn) as conn:
        bare, = _inserted(conn, "INSERT INTO awa.jobs (kind) VALUES ('bare') RETURNING id")
        called = scalar_in(conn, "SELECT awa.insert_job('bare')")
        full, = _inserted(conn, RAW + "('full', '{\"a\": [1]}', 'q1', 4, now() + interval '1 hour', 3, 12.5, "
                                      "'{x,y}', '{\"m\": true}', 'key', NULL) RETURNING id")
        conn.commit()
        raw, sql, given = (awa_pool.get_job(conn, i) for i in (bare, called, full))
    same = ("queue", "args", "state", "priority", "max_attempts", "tags", "metadata", "timeout",
            "ordering_key", "attempt", "batch_id")
    assert {f: getattr(raw, f) for f in same} == {f: getattr(sql, f) for f in same}
    assert (raw.queue, raw.priority, raw.max_attempts, raw.args, raw.state) == ("default", 2, 25, {}, "available")
    assert (given.queue, given.priority, given.max_attempts, given.timeout) == ("q1", 4, 3, 12.5)
    assert (given.args, given.tags, given.metadata, given.ordering_key) == ({"a": [1]}, ("x", "y"), {"m": True}, "key")
    assert given.state == "scheduled"


def scalar_in(conn, statement: str):
    with conn.cursor() as cur:
        cur.execute(statement)
        return cur.fetchone()[0]


def test_a_raw_row_may_carry_a_retry_policy_and_an_expiry_checked_as_insert_job_checks_them(dsn) -> None:
    with connection(dsn) as conn:
        ids = _inserted(conn, "INSERT INTO awa.jobs (kind, retry_policy, expires_at, unique_opts) VALUES "
                              "('r', '{\"backoff\": \"constant\", \"base\": 3}', now() + interval '1 hour', NULL), "
                              "('u', '{\"backoff\": \"linear\", \"base\": 2}', NULL, '{}') RETURNING id")
        conn.commit()
        plain, unique = (awa_pool.get_job(conn, i) for i in ids)
        with pytest.raises(psycopg2.errors.InvalidParameterValue, match="retry_policy backoff must be"):
            _inserted(conn, "INSERT INTO awa.jobs (kind, retry_policy) VALUES ('ok', NULL), "
                            "('bad', '{\"backoff\": \"sometimes\"}')")
        conn.rollback()
    assert plain.retry_policy["backoff"] == "constant" and plain.retry_policy["base"] == 3
    assert plain.expires_at is not None and plain.expires_at > plain.created_at
    assert unique.retry_policy["backoff"] == "linear"
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 2
    _inbox_is_empty(dsn)


def test_returning_shows_the_jobs_state_and_given_columns(dsn) -> None:
    with connection(dsn) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO awa.jobs (kind, run_at) VALUES ('now', NULL), ('later', now() + interval '1 day'), "
                    "('past', now() - interval '1 day') RETURNING id, kind, state::text, queue, priority, tags")
        rows = cur.fetchall()
        cur.execute("INSERT INTO awa.jobs (kind) VALUES ('star') RETURNING *")
        star = dict(zip([d.name for d in cur.description], cur.fetchone()))
        conn.commit()
        assert [awa_pool.get_job(conn, row[0]).state for row in rows] == ["available", "scheduled", "available"]
    assert [row[1:] for row in rows] == [("now", "available", "default", 2, []), ("later", "scheduled", "default", 2, []),
                                         ("past", "available", "default", 2, [])]
    assert star["kind"] == "star" and star["state"] == "available" and star["attempt"] is None
    assert query(dsn, "SELECT kind, state::text FROM awa.jobs ORDER BY id") == [
        ("now", "available"), ("later", "scheduled"), ("past", "available"), ("star", "available")]


def test_unique_rows_go_through_insert_job_and_return_the_holders_id(dsn) -> None:
    with connection(dsn) as conn:
        first = _inserted(conn, "INSERT INTO awa.jobs (kind, args, unique_opts) VALUES "
                                "('u', '{\"k\": 1}', '{}'), ('plain', NULL, NULL), ('u', '{\"k\": 1}', '{}'), "
                                "('u', '{\"k\": 2}', '{\"by_args\": true}') RETURNING id")
        again = _inserted(conn, "INSERT INTO awa.jobs (kind, args, unique_opts) VALUES ('u', '{\"k\": 1}', "
                                "'{\"states\": [\"available\"]}') RETURNING id")
        by_kind = _inserted(conn, "INSERT INTO awa.jobs (kind, args, unique_opts) VALUES ('u', '{\"k\": 3}', "
                                  "'{\"by_args\": false}'), ('u', '{\"k\": 4}', '{\"by_args\": false}') RETURNING id")
        # the key is computed in SQL: Python's Unique() finds the raw job
        python = awa_pool.enqueue(conn, Job("u", {"k": 2}, unique=awa_pool.Unique()))
        conn.commit()
    assert first[0] == first[2] != first[3] and first[1] not in (first[0], first[3])
    assert again == [first[0]] and python == first[3]
    assert by_kind[0] == by_kind[1] and by_kind[0] not in first   # the key of kind alone is another key
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 4
    _inbox_is_empty(dsn)


def test_a_sharded_queue_gives_raw_rows_the_lanes_of_enqueue(dsn) -> None:
    with connection(dsn) as conn:
        awa_pool.set_queue_shards(conn, "sharded", 8)
        keyed = _inserted(conn, "INSERT INTO awa.jobs (kind, queue, ordering_key) SELECT 'k', 'sharded', 'key-' || i "
                                "FROM generate_series(1, 20) i RETURNING id")
        python = awa_pool.enqueue_many(conn, [Job("k", queue="sharded", ordering_key=f"key-{i}") for i in range(1, 21)])
        spread = _inserted(conn, "INSERT INTO awa.jobs (kind, queue) SELECT 'k', 'sharded' FROM generate_series(1, 200) "
                                 "RETURNING id")
        conn.commit()
    lane = dict(query(dsn, "SELECT id, lane FROM awa.jobs_hot"))
    assert [lane[i] for i in keyed] == [lane[i] for i in python]   # a key pins one lane, whoever inserts it
    assert len({lane[i] for i in spread}) > 1 and all(0 <= lane[i] < 8 for i in spread)


def _notified(listener, within: float) -> list:
    """The queues notified on awa_jobs within `within` seconds (once one
    came, whatever else the same commit sends in the next 0.3 s)."""
    payloads: list = []
    deadline = time.monotonic() + within
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return sorted(payloads)
        if select.select([listener], [], [], remaining)[0]:
            listener.poll()
            payloads += [n.payload for n in listener.notifies]
            del listener.notifies[:]
            if payloads:
                deadline = min(deadline, time.monotonic() + 0.3)


def test_ready_rows_notify_their_queues_at_commit_only(dsn) -> None:
    with connection(dsn, autocommit=True) as listener, connection(dsn) as conn:
        listener.cursor().execute("LISTEN awa_jobs")
        _inserted(conn, "INSERT INTO awa.jobs (kind, queue) VALUES ('a', 'q1'), ('b', 'q1'), ('c', 'q2')")
        assert _notified(listener, 0.3) == [], "NOTIFY before the commit"
        conn.rollback()
        assert _notified(listener, 0.3) == [], "NOTIFY after a rollback"
        _inserted(conn, "INSERT INTO awa.jobs (kind, queue, run_at) VALUES ('later', 'q3', now() + interval '1 hour')")
        conn.commit()
        assert _notified(listener, 0.3) == [], "a scheduled job woke the supervisors"
        _inserted(conn, "INSERT INTO awa.jobs (kind, queue) VALUES ('a', 'q1'), ('b', 'q1'), ('c', 'q2')")
        conn.commit()
        assert _notified(listener, 10.0) == ["q1", "q2"], "one NOTIFY per queue within 10 s of the commit"


BAD_ROWS = [
    ("priority", "INSERT INTO awa.jobs (kind, priority) VALUES ('ok', 2), ('bad', 7)",
     "priority must be from 1 (highest) to 4 (lowest), got 7"),
    ("args array", "INSERT INTO awa.jobs (kind, args) VALUES ('ok', '{}'), ('bad', '[1, 2]')",
     "args must be a JSON object, got array"),
    ("args string", "INSERT INTO awa.jobs (kind, args) VALUES ('bad', '\"text\"')", "args must be a JSON object, got string"),
    ("empty kind", "INSERT INTO awa.jobs (kind) VALUES ('ok'), ('')", "kind is required (a non-empty text)"),
    ("no kind", "INSERT INTO awa.jobs (args) VALUES ('{}')", "kind is required"),
    ("long kind", "INSERT INTO awa.jobs (kind) VALUES (repeat('k', 201))", "kind must be at most 200 characters, got 201"),
    ("empty queue", "INSERT INTO awa.jobs (kind, queue) VALUES ('bad', '')", "queue must be a non-empty text"),
    ("metadata", "INSERT INTO awa.jobs (kind, metadata) VALUES ('bad', '3')", "metadata must be a JSON object, got number"),
    ("max_attempts", "INSERT INTO awa.jobs (kind, max_attempts) VALUES ('bad', 0)", "max_attempts must be from 1 to 1000"),
    ("timeout", "INSERT INTO awa.jobs (kind, timeout_s) VALUES ('bad', -1)", "timeout_s must be a positive number"),
    ("tag", "INSERT INTO awa.jobs (kind, tags) VALUES ('bad', '{a,\"\"}')", "each tag must be a non-empty text"),
    ("tags", "INSERT INTO awa.jobs (kind, tags) SELECT 'bad', array_agg(i::text) FROM generate_series(1, 21) i",
     "at most 20 tags, got 21"),
    ("ordering key", "INSERT INTO awa.jobs (kind, ordering_key) VALUES ('bad', '')", "ordering_key must be a non-empty"),
    ("unique key", "INSERT INTO awa.jobs (kind, unique_opts) VALUES ('bad', '{\"by_arg\": true}')",
     "unique_opts has an unknown key 'by_arg'"),
    ("unique states", "INSERT INTO awa.jobs (kind, unique_opts) VALUES ('bad', '{\"states\": [\"done\"]}')",
     "unique_opts states must be a non-empty list of job states"),
    ("unique row", "INSERT INTO awa.jobs (kind, unique_opts, priority) VALUES ('ok', '{}', 2), ('bad', '{}', 0)",
     "priority must be from 1"),
    ("a state", "INSERT INTO awa.jobs (kind, state) VALUES ('bad', 'running')", "awa_pool sets the other columns itself"),
    ("an id", "INSERT INTO awa.jobs (id, kind) VALUES (1, 'bad')", "awa_pool sets the other columns itself"),
    ("a result", "INSERT INTO awa.jobs (kind, result) VALUES ('bad', '{}')", "awa_pool sets the other columns itself"),
    ("a copy", "INSERT INTO awa.jobs SELECT * FROM awa.jobs", "awa_pool sets the other columns itself"),
]


@pytest.mark.parametrize("what,statement,message", BAD_ROWS, ids=[case[0] for case in BAD_ROWS])
def test_a_bad_row_fails_the_statement_with_one_clear_error_and_inserts_nothing(dsn, what, statement, message) -> None:
    with connection(dsn) as conn:
        before = _inserted(conn, "INSERT INTO awa.jobs (kind) VALUES ('kept') RETURNING id")
        conn.commit()
        with pytest.raises(psycopg2.errors.CheckViolation) as caught:
            _inserted(conn, statement)
        conn.rollback()
    error = caught.value.diag.message_primary
    assert error.startswith("awa.jobs: ") and "\n" not in error
    assert message in error, error
    assert query(dsn, "SELECT id FROM awa.jobs") == [(before[0],)]
    _inbox_is_empty(dsn)


def test_nothing_but_insert_is_writable_through_the_view(dsn) -> None:
    with connection(dsn) as conn:
        job_id, = _inserted(conn, "INSERT INTO awa.jobs (kind) VALUES ('x') RETURNING id")
        conn.commit()
        for statement in ("UPDATE awa.jobs SET priority = 1", "DELETE FROM awa.jobs",
                          "INSERT INTO awa.jobs (kind) VALUES ('x') ON CONFLICT DO NOTHING"):
            with pytest.raises(psycopg2.Error):
                _inserted(conn, statement)
            conn.rollback()
    assert record(dsn, job_id).priority == 2 and scalar(dsn, "SELECT count(*) FROM awa.jobs") == 1


def test_a_savepoint_or_a_concurrent_transaction_keeps_its_own_rows(dsn) -> None:
    with connection(dsn) as one, connection(dsn) as two:
        kept = _inserted(one, "INSERT INTO awa.jobs (kind) SELECT 'one' FROM generate_series(1, 100) RETURNING id")
        theirs = _inserted(two, "INSERT INTO awa.jobs (kind) SELECT 'two' FROM generate_series(1, 100) RETURNING id")
        _inserted(one, "SAVEPOINT s")
        _inserted(one, "INSERT INTO awa.jobs (kind) VALUES ('undone')")
        with pytest.raises(psycopg2.errors.CheckViolation):
            _inserted(one, "INSERT INTO awa.jobs (kind, priority) VALUES ('bad', 9)")
        _inserted(one, "ROLLBACK TO SAVEPOINT s")
        kept += _inserted(one, "INSERT INTO awa.jobs (kind) VALUES ('one') RETURNING id")
        two.rollback()
        one.commit()
    assert sorted(row[0] for row in query(dsn, "SELECT id FROM awa.jobs")) == sorted(kept)
    assert not set(theirs) & set(kept)
    _inbox_is_empty(dsn)


def test_a_real_pool_runs_raw_inserted_jobs(dsn, pools) -> None:
    pools.start(app="apps.basic", workers=2)
    with connection(dsn) as conn:
        ids = _inserted(conn, "INSERT INTO awa.jobs (kind, args) SELECT 'add', jsonb_build_object('a', i, 'b', 1) "
                              "FROM generate_series(1, 20) i RETURNING id")
        ids += _inserted(conn, "INSERT INTO awa.jobs (kind, args, run_at) VALUES ('add', '{\"a\": 0, \"b\": 0}', "
                               "now() + interval '0.5 seconds') RETURNING id")
        conn.commit()
    for job_id in ids:
        wait_for(lambda: record(dsn, job_id).state == "completed", timeout=60, message=f"job {job_id} to complete")
    assert [record(dsn, i).result for i in ids[:3]] == [{"sum": 2}, {"sum": 3}, {"sum": 4}]


def test_a_producer_granted_before_migration_0028_may_insert_after_it(empty_dsn) -> None:
    """The migration gives the new privileges to every role that already
    held the producer profile (grant_producer gives them from now on)."""
    from psycopg2 import sql

    from awa_pool.core.sql import QUERIES, load_migrations

    role = f"awa_early_producer_{uuid.uuid4().hex[:12]}"
    query(empty_dsn, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with connection(empty_dsn) as conn, conn.cursor() as cur:
            cur.execute(QUERIES["bootstrap_migrations"])
            for version, _name, text in load_migrations():
                if version == 28:
                    cur.execute("SELECT awa.grant_producer(%s)", (role,))
                cur.execute(text)
            conn.commit()
        params = psycopg2.extensions.parse_dsn(empty_dsn)
        params["user"] = role
        with psycopg2.connect(**params) as producer, producer.cursor() as cur:
            cur.execute("INSERT INTO awa.jobs (kind, args) VALUES ('early', '{}') RETURNING id")
            assert cur.fetchone()[0] > 0
        producer.close()
        assert query(empty_dsn, "SELECT kind FROM awa.jobs") == [("early",)]
    finally:
        query(empty_dsn, sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        query(empty_dsn, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
