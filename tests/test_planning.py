"""The hot-path functions read jobs_hot by index however their session's
earlier calls were planned.

PL/pgSQL caches a generic plan after five calls. A supervisor that starts on
an empty queue would cache plans costed for a one-row table and keep using
them once the queue holds thousands of jobs, so each claim walked the whole
table (seen in the soak: claims of 2-3 s). Each test warms a session on an
empty table, fills the table behind its back (no ANALYZE, no VACUUM), and
counts the rows that session's next call reads in its own transaction.
"""
from __future__ import annotations

import json
from typing import List, Tuple

import psycopg2
import pytest

import awa_pool
from awa_pool import Job

pytestmark = pytest.mark.embedded_smoke  # plans may differ between PostgreSQL versions

ROWS = 20_000
TOUCHED = "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) " \
          "FROM pg_stat_xact_user_tables WHERE relid = 'awa.jobs_hot'::regclass"
CLAIM = "SELECT id, lease FROM awa.claim('plan', %s, 1, 60.0, 0::smallint, NULL)"
COMPLETE = ("SELECT awa.complete_jobs(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY[0.1]::real[], "
            "ARRAY[0.1]::real[], ARRAY[0]::bigint[])")


def fill(dsn: str) -> None:
    with psycopg2.connect(dsn) as producer:
        awa_pool.enqueue_many(producer, [Job("plan_kind", {"i": i}, queue="plan") for i in range(ROWS)])
    producer.close()


def fill_and_claim_all(dsn: str) -> tuple:
    """Fill the table and claim every job (another session): the last (id, lease)."""
    fill(dsn)
    with psycopg2.connect(dsn) as claimer, claimer.cursor() as cur:
        cur.execute(CLAIM, (ROWS,))
        running = cur.fetchall()
    claimer.close()
    assert len(running) == ROWS
    return running[-1]


def rows_read_by(conn, sql: str, params: tuple) -> int:
    """Rows of jobs_hot that one call reads, counted inside its transaction."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        cur.fetchall()
        cur.execute(TOUCHED)
        touched = cur.fetchone()[0]
    conn.rollback()
    return touched


def test_claim_reads_only_what_it_claims_after_the_queue_fills(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            for _ in range(8):  # past the five custom plans: a generic plan would be cached now
                cur.execute(CLAIM, (1,))
                assert cur.fetchall() == []
        conn.commit()
        fill(dsn)
        assert rows_read_by(conn, CLAIM, (1,)) < 100
    finally:
        conn.close()


def warmed_on_an_empty_table(dsn: str):
    """A session whose complete_jobs plan was made (and, past five calls,
    cached) while no job existed."""
    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        for _ in range(8):
            cur.execute(COMPLETE, (-1, -1))
            cur.fetchall()
    conn.commit()
    return conn


def test_complete_reads_only_the_jobs_it_completes_after_the_table_fills(dsn: str) -> None:
    conn = warmed_on_an_empty_table(dsn)
    try:
        job_id, lease = fill_and_claim_all(dsn)
        assert rows_read_by(conn, COMPLETE, (job_id, lease)) < 100
    finally:
        conn.close()


COMPLETE_ONE = "SELECT awa.complete_job(%s, %s, 0.1, 0.1, 0)"


def test_complete_one_reads_only_its_job_after_the_table_fills(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            for _ in range(8):  # its plan is generic from the first call; cached on an empty table
                cur.execute(COMPLETE_ONE, (-1, -1))
                assert cur.fetchall() == []
        conn.commit()
        job_id, lease = fill_and_claim_all(dsn)
        assert rows_read_by(conn, COMPLETE_ONE, (job_id, lease + 1)) < 100  # a stale lease moves nothing
        with conn.cursor() as cur:
            cur.execute(COMPLETE_ONE, (job_id, lease))
            assert cur.fetchall() == [(job_id,)]
            cur.execute(TOUCHED)
            assert cur.fetchone()[0] < 100
        conn.commit()
        assert awa_pool.get_job(conn, job_id).state == "completed"
    finally:
        conn.close()


def nested_plans(conn, sql: str, params: tuple) -> Tuple[list, List[str]]:
    """Plans of the statements `sql` runs inside functions, from auto_explain
    (sent to this client as notices); skips where the module is missing."""
    with conn.cursor() as cur:
        try:
            cur.execute("LOAD 'auto_explain'")
        except psycopg2.Error:
            conn.rollback()
            pytest.skip("auto_explain is not installed on this server")
        for setting in ("log_min_duration = 0", "log_nested_statements = on",
                        "log_level = notice"):
            cur.execute(f"SET auto_explain.{setting}")
        del conn.notices[:]
        cur.execute(sql, params)
        rows = cur.fetchall()
        cur.execute("SET auto_explain.log_min_duration = -1")
    return rows, [n for n in conn.notices if "Delete on jobs_hot" in n]


def test_a_big_flush_on_the_cached_completion_plan_joins_by_hash_not_by_rescans(dsn: str) -> None:
    """complete_jobs' plan, cached on an empty table, must stay linear in the
    flush size: a nested loop rescans the outcome arrays once per row (W2
    fell tenfold when that plan was cached)."""
    conn = warmed_on_an_empty_table(dsn)
    try:
        fill(dsn)
        with psycopg2.connect(dsn) as claimer, claimer.cursor() as cur:
            cur.execute(CLAIM, (2_000,))
            running = cur.fetchall()
        claimer.close()
        ids = [job_id for job_id, _ in running]
        leases = [lease for _, lease in running]
        flush = ("SELECT awa.complete_jobs(%s::bigint[], %s::bigint[], %s::real[], %s::real[], "
                 "%s::bigint[])")
        n = len(ids)
        rows, plans = nested_plans(conn, flush, (ids, leases, [0.1] * n, [0.1] * n, [0] * n))
        assert len(rows) == n == 2_000
        assert len(plans) == 1, plans
        assert "Nested Loop" not in plans[0] and "Hash Join" in plans[0], plans[0]
        assert "jobs_hot_pkey" in plans[0], plans[0]  # read by key, however estimated
        with conn.cursor() as cur:
            cur.execute(TOUCHED)
            assert cur.fetchone()[0] <= n + 100
        conn.commit()
        assert awa_pool.get_job(conn, ids[-1]).state == "completed"
    finally:
        conn.close()


def test_one_id_twice_in_a_flush_completes_the_job_under_its_current_lease(dsn: str) -> None:
    """A stale outcome beside the current one for the same job: the join pairs
    each id with its own lease, so the current one completes it, once."""
    job_id, lease = fill_and_claim_all(dsn)
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT awa.complete_jobs(%s::bigint[], %s::bigint[], '{0.1,0.2}', "
                        "'{0.1,0.2}', '{0,0}')", ([job_id, job_id], [lease - 1, lease]))
            assert cur.fetchall() == [(job_id,)]
        conn.commit()
        with conn.cursor() as cur:
            cur.execute("SELECT state::text, lease FROM awa.jobs_done WHERE id = %s", (job_id,))
            assert cur.fetchall() == [("completed", lease)]
    finally:
        conn.close()


SETTLE = "SELECT job_id FROM awa.settle_jobs(%s::jsonb)"


def test_a_big_settle_on_a_plan_cached_on_an_empty_table_reads_by_key_and_joins_by_hash(dsn: str) -> None:
    """settle_jobs keeps one generic plan too (0013): made while no job
    existed, it must still read a flush's rows by key, linear in its size."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            for _ in range(8):
                cur.execute(SETTLE, (json.dumps([{"id": -1, "lease": -1, "outcome": "retry"}]),))
                assert cur.fetchall() == []
        conn.commit()
        fill(dsn)
        with psycopg2.connect(dsn) as claimer, claimer.cursor() as cur:
            cur.execute(CLAIM, (2_000,))
            running = cur.fetchall()
        claimer.close()
        flush = json.dumps([{"id": job_id, "lease": lease, "outcome": "retry", "delay_s": 60}
                            for job_id, lease in running])
        rows, plans = nested_plans(conn, SETTLE, (flush,))
        assert len(rows) == len(running) == 2_000
        assert len(plans) == 1, plans
        assert "Nested Loop" not in plans[0] and "Hash Join" in plans[0], plans[0]
        assert "jobs_hot_pkey" in plans[0], plans[0]
        with conn.cursor() as cur:
            cur.execute(TOUCHED)
            assert cur.fetchone()[0] <= len(running) + 100
        conn.commit()
        assert awa_pool.get_job(conn, running[-1][0]).state == "retryable"
    finally:
        conn.close()
