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

import psycopg2

import awa_pool
from awa_pool import Job

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


def test_complete_reads_only_the_jobs_it_completes_after_the_table_fills(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            for _ in range(8):
                cur.execute(COMPLETE, (-1, -1))
                cur.fetchall()
        conn.commit()
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
