"""A backlog's claims scan from past the last claim (migration 0021).

Claimed jobs stay in the claim index until VACUUM, so a claim that starts
at the front of its queue steps over every job claimed since: its cost grew
with how long the backlog had been draining. These tests hold that a claim
with a cursor reads a few index pages however many jobs went before, takes
exactly the jobs and order a claim from the start would, and still finds
jobs that become available behind the cursor.
"""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, List

import pytest

from awa_pool import Job, enqueue_many
from awa_pool.worker.claimer import LOOK_FROM_START_EVERY_S, Claimer
from awa_pool.core.config import PoolConfig, QueueConfig
from awa_pool.worker.fetcher import advance, claim
from awa_pool.worker.placement import JobTimes
from helpers import connection, query, scalar

Q = "cursor"


@pytest.fixture
def auto_conn(dsn: str):
    with connection(dsn, autocommit=True) as conn:
        yield conn


def _supervisor(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute("INSERT INTO awa.supervisors (hostname, pid, version, queues, workers) "
                    "VALUES ('test', 1, 'test', %s, 1) RETURNING id", ([Q],))
        return cur.fetchone()[0]


def _claimer(conn: Any, supervisor_id: int) -> Claimer:
    def db(_what: str, fn: Callable[[Any], Any]) -> Any:
        with conn.cursor() as cur:
            return fn(cur)

    claimer = Claimer(PoolConfig(dsn="postgresql://unused"), JobTimes(), db=db,
                      on_claimed=lambda queue, rows: None)
    claimer.start({Q: QueueConfig(aging=0)}, supervisor_id)
    return claimer


def _cursor_then_a_late_job(dsn: str, conn: Any, backlog: int) -> "tuple[Claimer, float, int]":
    """A claimer with a cursor 10 jobs into a backlog, then a job that is
    available at once with a run_at older than every job of the backlog."""
    with connection(dsn) as producer:
        enqueue_many(producer, [Job("noop", {"i": i}, queue=Q) for i in range(backlog)])
        producer.commit()
    claimer = _claimer(conn, _supervisor(conn))
    now = time.monotonic()
    assert len(claimer.claim(Q, 10, now)) == 10
    with connection(dsn) as producer:
        late = enqueue_many(producer, [Job("noop", {"late": True}, queue=Q,
                                           run_at=datetime.now(timezone.utc) - timedelta(hours=1))])[0]
        producer.commit()
    return claimer, now, late


def _index_pages_read(conn: Any, fn: Callable[[], Any]) -> int:
    """Pages of the claim index that fn()'s statements read (this session's
    counters, flushed before and after; nothing else uses this database)."""
    def hits() -> int:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_stat_force_next_flush()")
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute("SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes "
                        "WHERE indexrelname = 'jobs_hot_claim'")
            return cur.fetchone()[0]

    before = hits()
    fn()
    return hits() - before


def test_a_claim_past_its_cursor_does_not_step_over_the_jobs_claimed_before(dsn: str, auto_conn: Any) -> None:
    with connection(dsn) as conn:
        enqueue_many(conn, [Job("noop", {"i": i}, queue=Q) for i in range(30_000)])
        conn.commit()
    with auto_conn.cursor() as cur:
        # what autovacuum would clear up is what this test is about
        cur.execute("ALTER TABLE awa.jobs_hot SET (autovacuum_enabled = false)")
    sid = _supervisor(auto_conn)
    with auto_conn.cursor() as cur:
        drained = claim(cur, queue=Q, limit=20_000, supervisor_id=sid, aging_s=0)
    cursor = advance(None, drained)

    with auto_conn.cursor() as cur:
        from_start: List[Any] = []
        past: List[Any] = []
        pages_from_start = _index_pages_read(auto_conn, lambda: from_start.extend(
            claim(cur, queue=Q, limit=64, supervisor_id=sid, aging_s=0)))
        cursor = advance(cursor, from_start)
        pages_past = _index_pages_read(auto_conn, lambda: past.extend(
            claim(cur, queue=Q, limit=64, supervisor_id=sid, aging_s=0, after=cursor)))

    assert [j.id for j in from_start] == list(range(drained[-1].id + 1, drained[-1].id + 65))
    assert [j.id for j in past] == list(range(from_start[-1].id + 1, from_start[-1].id + 65))
    # 20,000 dead entries are about 60 leaf pages to step over; past the cursor a claim
    # reads the root, an inner page and a leaf or two per priority level
    assert pages_from_start >= 50, pages_from_start
    assert pages_past <= 16, pages_past


def test_claims_with_a_cursor_take_the_jobs_in_the_order_a_claim_from_the_start_would(
        dsn: str, auto_conn: Any) -> None:
    base = datetime.now(timezone.utc) - timedelta(minutes=5)
    jobs = []
    for i in range(400):
        # many jobs share one run_at (ties broken by id); others differ by a microsecond
        run_at = base + timedelta(microseconds=(i // 3) if i % 2 else 0)
        jobs.append(Job("noop", {"i": i}, queue=Q, priority=1 + i % 4, run_at=run_at))
    with connection(dsn) as conn:
        enqueue_many(conn, jobs)
        conn.commit()
    expected = [row[0] for row in query(
        dsn, "SELECT id FROM awa.jobs_hot WHERE queue = %s ORDER BY priority, run_at, id", (Q,))]

    claimer = _claimer(auto_conn, _supervisor(auto_conn))
    taken: List[int] = []
    now = time.monotonic()
    while True:
        got = claimer.claim(Q, 7, now)   # one clock reading: every claim after the first uses the cursor
        taken.extend(job.id for job in got)
        if len(got) < 7:
            break
    assert taken == expected


def test_a_job_made_available_behind_the_cursor_is_claimed_by_the_next_look_from_the_start(
        dsn: str, auto_conn: Any) -> None:
    claimer, now, late = _cursor_then_a_late_job(dsn, auto_conn, backlog=200)

    assert late not in [job.id for job in claimer.claim(Q, 10, now + 0.01)]   # behind the cursor
    looked = claimer.claim(Q, 10, now + LOOK_FROM_START_EVERY_S)
    assert looked[0].id == late


def test_a_claim_past_the_cursor_that_comes_back_short_looks_again_from_the_start(
        dsn: str, auto_conn: Any) -> None:
    claimer, now, late = _cursor_then_a_late_job(dsn, auto_conn, backlog=20)

    rest = claimer.claim(Q, 50, now + 0.01)
    assert len(rest) == 11 and late in [job.id for job in rest]
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_hot WHERE queue = %s AND state = 'available'", (Q,)) == 0
    assert (Q, 0) not in claimer.cursors   # the backlog is gone: claims look from the start again
