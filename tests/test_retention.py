"""Retention: rotation of the terminal-history ring (carry forward, TRUNCATE,
lock contention), cleanup of bookkeeping rows, and a real supervisor
applying --retention-completed/--retention-failed."""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import psycopg2
import psycopg2.extensions
import pytest

import awa_pool
from awa_pool import Job
from awa_pool.worker.maintenance import DLQ_RETENTION_S, Retention
from awa_pool.core.sql import QUERIES
from helpers import query, scalar, wait_for

HOUR = 3600.0
DAY = 86400.0


def _done(dsn: str, state: str = "completed", age_s: float = 0.0, *, segment: Optional[int] = None,
          dead_lettered: bool = False, batch_id: Optional[int] = None) -> int:
    """A terminal job finalized `age_s` ago, in `segment` (default: the current one)."""
    return scalar(dsn, "INSERT INTO awa.jobs_done (id, kind, state, finalized_at, dead_lettered, batch_id, "
                       "segment) VALUES (nextval('awa.job_id_seq'), 'old', %s, "
                       "now() - make_interval(secs => %s), %s, %s, "
                       "coalesce(%s, (SELECT current FROM awa.done_ring))) RETURNING id",
                  (state, age_s, dead_lettered, batch_id, segment))


def _segments(dsn: str) -> Dict[int, int]:
    """job id -> segment of every terminal row."""
    return dict(query(dsn, "SELECT id, segment FROM awa.jobs_done"))


def _ring(dsn: str) -> tuple:
    return query(dsn, "SELECT current, extract(epoch FROM now() - rotated_at) FROM awa.done_ring")[0]


def test_rotation_carries_young_rows_forward_and_truncates_the_oldest(auto, dsn) -> None:
    # the fan-in trigger counts each member inserted below: one batch stays open, one is done
    batch_open = scalar(dsn, "INSERT INTO awa.batches (total, remaining) VALUES (3, 2) RETURNING id")
    batch_done = scalar(dsn, "INSERT INTO awa.batches (total, remaining) VALUES (1, 1) RETURNING id")
    query(dsn, "UPDATE awa.done_ring SET current = 7, rotated_at = now() - interval '1 day'")
    old = [_done(dsn, "completed", 2 * HOUR, segment=0),
           _done(dsn, "failed", 2 * DAY, segment=0),
           _done(dsn, "cancelled", 2 * DAY, segment=0),
           _done(dsn, "failed", DLQ_RETENTION_S + DAY, segment=0, dead_lettered=True),
           _done(dsn, "completed", 2 * HOUR, segment=0, batch_id=batch_done)]
    young = [_done(dsn, "completed", 600, segment=0),
             _done(dsn, "failed", 12 * HOUR, segment=0),
             _done(dsn, "cancelled", HOUR, segment=0),
             _done(dsn, "failed", 10 * DAY, segment=0, dead_lettered=True),
             _done(dsn, "completed", 2 * HOUR, segment=0, batch_id=batch_open)]
    elsewhere = _done(dsn, "completed", 2 * HOUR, segment=3)  # not the oldest segment: untouched

    service = Retention(completed_s=HOUR, failed_s=DAY)
    with auto.cursor() as cur:
        assert service.rotate(cur) == len(old)
    rotated, busy, dropped, carried, segment = service.last
    assert (rotated, busy, dropped, carried, segment) == (True, False, 5, 5, 0)

    segments = _segments(dsn)
    assert not set(old) & set(segments), "expired rows are gone"
    assert {segments[i] for i in young} == {7}, "young rows moved into the segment that was current"
    assert segments[elsewhere] == 3
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_done_0") == 0
    current, age = _ring(dsn)
    assert current == 0 and age < 60
    # moving rows is not finishing them again: batch counters are untouched
    assert query(dsn, "SELECT id, remaining FROM awa.batches ORDER BY id") == [(batch_open, 1), (batch_done, 0)]
    assert awa_pool.get_job(auto, young[0]).state == "completed"
    # new terminal rows now go to the emptied segment
    newest = _done(dsn)
    assert _segments(dsn)[newest] == 0


def test_rotation_waits_for_its_period(auto, dsn) -> None:
    service = Retention(completed_s=700, failed_s=1400)  # period = 700 / 7 = 100 s
    query(dsn, "UPDATE awa.done_ring SET rotated_at = now() - interval '50 seconds'")
    with auto.cursor() as cur:
        service.rotate(cur)
    assert service.last[:2] == (False, False) and _ring(dsn)[0] == 0
    query(dsn, "UPDATE awa.done_ring SET rotated_at = now() - interval '101 seconds'")
    with auto.cursor() as cur:
        service.rotate(cur)
    assert service.last[0] is True and _ring(dsn)[0] == 1
    with auto.cursor() as cur:
        service.rotate(cur)
    assert service.last[0] is False, "one rotation per period"


def test_rotation_skips_a_segment_in_use_and_retries_later(auto, dsn) -> None:
    expired = _done(dsn, "completed", 2 * HOUR, segment=1)
    young = _done(dsn, "completed", 60, segment=1)
    query(dsn, "UPDATE awa.done_ring SET rotated_at = now() - interval '1 day'")
    reader = psycopg2.connect(dsn)
    try:
        with reader.cursor() as cur:  # a long report holds the oldest segment open
            cur.execute("SELECT count(*) FROM awa.jobs_done_1")
        service = Retention(completed_s=HOUR, failed_s=DAY)
        started = time.monotonic()
        with auto.cursor() as cur:
            assert service.rotate(cur) == 0
            elapsed = time.monotonic() - started
            cur.execute("SHOW lock_timeout")
            assert cur.fetchone()[0] == "0", "the short lock_timeout does not leak into the session"
        assert service.last[:2] == (False, True) and service.busy == 1
        assert elapsed < 2.0, "the TRUNCATE gives up quickly instead of queueing ahead of readers"
        assert _segments(dsn) == {expired: 1, young: 1}, "nothing moved"
        assert _ring(dsn)[0] == 0
    finally:
        reader.rollback()
        reader.close()
    with auto.cursor() as cur:
        assert service.rotate(cur) == 1
    assert _segments(dsn) == {young: 0} and _ring(dsn)[0] == 1


def test_rotation_restores_lock_timeout_inside_a_transaction(conn, dsn) -> None:
    query(dsn, "UPDATE awa.done_ring SET rotated_at = now() - interval '1 day'")
    with conn.cursor() as cur:
        cur.execute("SET lock_timeout = '7s'")
        Retention(completed_s=HOUR, failed_s=DAY).rotate(cur)
        cur.execute("SHOW lock_timeout")
        assert cur.fetchone()[0] == "7s"
    conn.commit()


def test_rotation_without_rows_to_keep_reads_the_segment_once(auto, dsn) -> None:
    expired = [_done(dsn, "completed", 2 * HOUR, segment=1) for _ in range(3)]
    kept = _done(dsn, "failed", 2 * HOUR, segment=2)
    query(dsn, "UPDATE awa.done_ring SET rotated_at = now() - interval '1 day'")
    statements = _explained_statements(auto, lambda cur: Retention(completed_s=HOUR, failed_s=DAY).rotate(cur))
    assert not any(text.lstrip().startswith("UPDATE awa.jobs_done") for text in statements), \
        "no carry-forward UPDATE when nothing in the segment is kept"
    assert _segments(dsn) == {kept: 2} and not set(expired) & set(_segments(dsn))
    query(dsn, "UPDATE awa.done_ring SET rotated_at = now() - interval '1 day'")
    statements = _explained_statements(auto, lambda cur: Retention(completed_s=HOUR, failed_s=DAY).rotate(cur))
    assert any(text.lstrip().startswith("UPDATE awa.jobs_done") for text in statements)
    assert _segments(dsn) == {kept: 1}, "the failed row inside its retention moved to the current segment"


def test_rotation_and_maintenance_never_compile_with_jit(auto, dsn) -> None:
    """A big history segment is costed past jit_above_cost, and compiling
    its scan took longer than the scan (migration 0015). With the threshold
    at zero, nothing the rotation runs is compiled."""
    if not scalar(dsn, "SELECT pg_jit_available()"):
        pytest.skip("this server has no JIT")
    query(dsn, "UPDATE awa.done_ring SET rotated_at = now() - interval '1 day'")
    _done(dsn, "failed", 2 * HOUR, segment=2)  # kept: the UPDATE runs too
    with auto.cursor() as cur:
        cur.execute("SET jit_above_cost = 0")
        assert _jit_compiled(auto, lambda c: c.execute("SELECT count(*) FROM awa.jobs_done")), \
            "the probe sees JIT where the session allows it"
        # the calling SELECT is the session's own statement; what runs inside is not
        inside = [plan for plan in _plans(auto, lambda c: Retention(completed_s=HOUR, failed_s=DAY).rotate(c))
                  if "awa.rotate_done_ring(" not in plan]
        assert inside and not any(_JIT in plan for plan in inside)
        cur.execute(QUERIES["maintenance_session"])
        assert not _jit_compiled(auto, lambda c: c.execute("SELECT count(*) FROM awa.jobs_done"))


def _explain_into_notices(cur) -> None:
    """auto_explain sends the plan of every statement, nested ones included,
    to this client as a NOTICE (the test server runs as a superuser)."""
    try:
        cur.execute("LOAD 'auto_explain'")
    except psycopg2.Error:
        pytest.skip("auto_explain is not installed on this server")
    cur.execute("SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on; "
                "SET auto_explain.log_nested_statements = on; SET auto_explain.log_level = notice")


def _plans(conn, action) -> List[str]:
    with conn.cursor() as cur:
        _explain_into_notices(cur)
        conn.notices.clear()
        action(cur)
        cur.execute("SET auto_explain.log_min_duration = -1")
    return list(conn.notices)


def _explained_statements(conn, action) -> List[str]:
    """The text of each statement `action` ran, nested ones included."""
    return [plan.split("Query Text:", 1)[1] for plan in _plans(conn, action) if "Query Text:" in plan]


_JIT = "\nJIT:"  # the section EXPLAIN ANALYZE adds to a plan that was compiled


def _jit_compiled(conn, action) -> bool:
    return any(_JIT in plan for plan in _plans(conn, action))


def test_a_full_turn_of_the_ring_removes_old_jobs_and_keeps_young_ones(auto, dsn) -> None:
    """Jobs finished through the real completion path; after a full turn of
    the ring (8 forced rotations), exactly the expired ones are gone."""
    ids = awa_pool.enqueue_many(auto, [Job("noop", {"i": i}) for i in range(6)])
    query(dsn, "SELECT * FROM awa.claim('default', 10, NULL)")
    leases = dict(query(dsn, "SELECT id, lease FROM awa.jobs_hot"))
    query(dsn, "SELECT awa.complete_jobs(%s, %s, %s::real[], %s::real[], %s::bigint[])",
          (ids[:4], [leases[i] for i in ids[:4]], [0.1] * 4, [0.1] * 4, [1] * 4))
    query(dsn, "SELECT * FROM awa.settle_jobs(%s::jsonb)", (
        '[{"id": %d, "lease": %d, "outcome": "fatal", "error": "x"}, '
        '{"id": %d, "lease": %d, "outcome": "cancel", "error": "y"}]'
        % (ids[4], leases[ids[4]], ids[5], leases[ids[5]]),))
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_done") == 6
    # ids[0] completed 2 h ago, ids[4] failed 3 days ago: both expired
    query(dsn, "UPDATE awa.jobs_done SET finalized_at = now() - interval '2 hours' WHERE id = %s", (ids[0],))
    query(dsn, "UPDATE awa.jobs_done SET finalized_at = now() - interval '3 days' WHERE id = %s", (ids[4],))
    query(dsn, "UPDATE awa.jobs_done SET finalized_at = now() - interval '20 hours' WHERE id = %s", (ids[5],))

    service = Retention(completed_s=HOUR, failed_s=DAY)
    dropped = 0
    with auto.cursor() as cur:
        for _ in range(8):
            dropped += service.rotate(cur, period_s=0)
            assert service.last[0] is True
    assert dropped == 2
    remaining = {row[0]: row[1] for row in query(dsn, "SELECT id, state::text FROM awa.jobs_done")}
    assert remaining == {ids[1]: "completed", ids[2]: "completed", ids[3]: "completed",
                         ids[5]: "cancelled"}
    assert awa_pool.get_job(auto, ids[0]) is None and awa_pool.get_job(auto, ids[4]) is None


def test_cleanup_of_fires_unique_keys_and_batches_is_bounded(auto, dsn) -> None:
    query(dsn, "INSERT INTO awa.cron_fires (name, fire_at, job_id) "
               "SELECT 'c', now() - make_interval(days => 3, secs => s), s FROM generate_series(1, 5) s")
    query(dsn, "INSERT INTO awa.cron_fires (name, fire_at, job_id) VALUES ('c', now() - interval '1 hour', 9)")
    alive = awa_pool.enqueue(auto, Job("u", {"k": 1}, unique=awa_pool.Unique()))
    finished = _done(dsn, "completed", 60)
    query(dsn, "INSERT INTO awa.unique_keys (key, job_id) VALUES (decode('00', 'hex'), %s)", (finished,))
    query(dsn, "INSERT INTO awa.unique_keys (key, job_id) "
               "SELECT decode(lpad(to_hex(s), 2, '0') || 'ff', 'hex'), -s FROM generate_series(1, 5) s")
    query(dsn, "INSERT INTO awa.batches (total, remaining, done_at) VALUES "
               "(1, 0, now() - interval '30 days'), (1, 0, now() - interval '31 days'), "
               "(1, 0, now() - interval '1 hour'), (2, 1, NULL)")

    service = Retention(completed_s=HOUR, failed_s=7 * DAY, batch=2)
    with auto.cursor() as cur:
        removed = service.clean(cur)
        for _ in range(5):  # unique keys are scanned one bounded chunk per pass
            removed += service.clean(cur)
    assert removed == 5 + 5 + 2
    assert query(dsn, "SELECT job_id FROM awa.cron_fires") == [(9,)]
    assert sorted(r[0] for r in query(dsn, "SELECT job_id FROM awa.unique_keys")) == sorted([alive, finished])
    assert query(dsn, "SELECT total, remaining FROM awa.batches ORDER BY id") == [(1, 0), (2, 1)]
    # keys of live and finished jobs stay: the live one still deduplicates
    with auto.cursor() as cur:
        assert service.clean(cur) == 0
    assert awa_pool.enqueue(auto, Job("u", {"k": 1}, unique=awa_pool.Unique())) == alive


def test_supervisor_applies_retention_settings(pools, dsn) -> None:
    """A pool started with 10 s retentions turns its ring every 10/7 s: a job
    that completed long enough ago disappears while a younger one stays."""
    retention_s = 10
    pools.start("--retention-completed", f"{retention_s}s", "--retention-failed", f"{retention_s}s",
                workers=1)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True

    def age(job_id: int) -> Optional[float]:
        return scalar(dsn, "SELECT extract(epoch FROM now() - finalized_at) FROM awa.jobs WHERE id = %s",
                      (job_id,))

    try:
        first = awa_pool.enqueue(conn, Job("noop"))
        wait_for(lambda: (age(first) or 0) > retention_s / 2, timeout=30, message="the first job to age")
        second = awa_pool.enqueue(conn, Job("noop"))
        wait_for(lambda: age(second) is not None, timeout=30, message="the second job to complete")
        wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.jobs WHERE id = %s", (first,)) == 0,
                 timeout=30, message="retention to remove the first job")
        second_age = age(second)
        # removed at its first truncation, between 10 and about 12.5 s old: the
        # second, 5 s younger, is still inside its retention and must be there
        assert second_age is not None and second_age < retention_s, "a young job is kept"
        assert scalar(dsn, "SELECT now() - rotated_at < interval '5 seconds' FROM awa.done_ring"), \
            "the ring keeps turning"
    finally:
        conn.close()
