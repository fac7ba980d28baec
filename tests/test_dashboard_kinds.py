"""The kinds page's read model (awa_pool/dashboard/kinds.py): its counts per
kind and slice come from awa.done_kinds and equal what awa.jobs_done holds,
counted by `awa-pool kinds`' rules, through every change of history (a
purge, a retry, the rotation and its fold), also for a dashboard that kept
the samples of closed slices from an earlier view."""
from __future__ import annotations

from typing import Dict, List, Tuple

import psycopg2
import pytest

import awa_pool
from awa_pool.dashboard.kinds import KIND_BUCKETS, KIND_WINDOWS, KindTrends
from awa_pool.ops.stats import kind_stats
from dashboard_helpers import drain, enqueue, failed_job
from helpers import connection, query, scalar

Counts = Dict[Tuple[str, int], Tuple[int, int, int, int, int]]

# Terminal jobs spread over the last day, one every 4.7 minutes (so every
# width of slice gets several), in each way a job ends: g % 8 picks
#   0 completed                       1 completed after a retry and a crash
#   2 failed (raised)                 3 failed: its last attempt crashed
#   4 failed: timed out twice         5 cancelled before it ever ran
#   6 cancelled while running         7 failed fatally, dead-lettered
HISTORY = """
INSERT INTO awa.jobs_done (id, kind, queue, state, attempt, attempted_at, finalized_at, wall_s, cpu_s,
                           peak_rss, errors, attempt_log, dead_lettered, segment)
SELECT nextval('awa.job_id_seq'), 'k' || (g % 3), 'q', s.state::awa.job_state, 1,
       CASE WHEN g % 8 <> 5 THEN f.at - interval '2 seconds' END, f.at,
       CASE WHEN g % 8 IN (0, 1, 2, 7) THEN (g % 50) / 10.0 END,
       CASE WHEN g % 8 IN (0, 1, 2, 7) THEN (g % 50) / 20.0 END,
       CASE WHEN g % 8 IN (0, 1, 2, 7) THEN 1000000 + g END,
       CASE g % 8 WHEN 2 THEN '[{"kind": "failed", "error": "boom"}]'::jsonb
                  WHEN 3 THEN '[{"kind": "crash", "error": "signal 9"}]'
                  WHEN 4 THEN '[{"kind": "timeout"}, {"kind": "timeout"}]'
                  WHEN 7 THEN '[{"kind": "fatal", "error": "bad args"}]' END,
       CASE g % 8 WHEN 1 THEN '[{"outcome": "retry"}, {"outcome": "crash"}]'::jsonb
                  WHEN 4 THEN '[{"outcome": "timeout"}]' END,
       g % 8 = 7, (SELECT current FROM awa.done_ring)
  FROM generate_series(1, 300) g
 CROSS JOIN LATERAL (SELECT now() - make_interval(secs => g * 282) AS at) f
 CROSS JOIN LATERAL (SELECT CASE WHEN g % 8 IN (0, 1) THEN 'completed'
                                 WHEN g % 8 IN (5, 6) THEN 'cancelled' ELSE 'failed' END AS state) s"""

# What the page must say, counted from the rows themselves: per kind and
# slice, the jobs finished, and their attempts by kind_stats' rules (a
# job's own attempt when it ran and has figures or failed, plus each entry
# of its attempt_log, all in the slice the job finished in).
RECOUNT = """
WITH p AS (
    SELECT make_interval(secs => %(width)s::double precision) AS width, to_timestamp(%(since)s) AS since
),
jobs AS (
    SELECT x.kind, date_bin(p.width, x.finalized_at, TIMESTAMPTZ 'epoch') AS slot, x.state, x.errors,
           x.attempt_log, x.attempted_at, x.wall_s
      FROM awa.jobs_done x, p
     WHERE x.finalized_at >= p.since
),
attempts AS (
    SELECT kind, slot, CASE WHEN state = 'failed' THEN coalesce(errors -> -1 ->> 'kind', 'failed')
                            WHEN state = 'cancelled' THEN 'cancel' ELSE state::text END AS outcome
      FROM jobs WHERE attempted_at IS NOT NULL AND (wall_s IS NOT NULL OR state = 'failed')
    UNION ALL
    SELECT kind, slot, e ->> 'outcome' FROM jobs, jsonb_array_elements(attempt_log) e
     WHERE attempt_log IS NOT NULL
),
tally AS (
    SELECT kind, slot, count(*) AS runs,
           count(*) FILTER (WHERE outcome IN ('failed', 'fatal', 'retry', 'lost', 'deadline',
                                              'callback_timeout')) AS failures,
           count(*) FILTER (WHERE outcome = 'crash') AS crashes,
           count(*) FILTER (WHERE outcome = 'timeout') AS timeouts
      FROM attempts GROUP BY 1, 2
)
SELECT f.kind, extract(epoch FROM f.slot)::double precision, f.finished, coalesce(t.runs, 0),
       coalesce(t.failures, 0), coalesce(t.crashes, 0), coalesce(t.timeouts, 0)
  FROM (SELECT kind, slot, count(*) AS finished FROM jobs GROUP BY 1, 2) f
  LEFT JOIN tally t USING (kind, slot)"""


def page_counts(trends: KindTrends, dsn: str, window_s: float) -> Tuple[Counts, float]:
    """The page's counts, per (kind, slice number) with any, and where its window starts."""
    with connection(dsn) as conn:
        read = trends.read(conn, window_s)
    width = window_s / KIND_BUCKETS
    counts = {(t.kind, round(b.start / width)): (b.finished, b.attempts, b.failures, b.crashes, b.timeouts)
              for t in read for b in t.buckets if b.finished or b.attempts}
    since = min((t.buckets[0].start for t in read), default=0.0)
    return counts, since


def recount(dsn: str, window_s: float, since: float) -> Counts:
    width = window_s / KIND_BUCKETS
    return {(kind, round(slot / width)): tuple(int(v) for v in values)
            for kind, slot, *values in query(dsn, RECOUNT, {"width": width, "since": since})}


def check_every_window(trends: KindTrends, dsn: str) -> Dict[str, Counts]:
    """For each window the page offers, its counts equal a recount of the rows."""
    seen = {}
    for label, window_s in KIND_WINDOWS.items():
        counts, since = page_counts(trends, dsn, window_s)
        assert counts == recount(dsn, window_s, since), label
        seen[label] = counts
    return seen


def totals(counts: Counts) -> Dict[str, List[int]]:
    out: Dict[str, List[int]] = {}
    for (kind, _), values in counts.items():
        out[kind] = [a + b for a, b in zip(out.get(kind, [0] * 5), values)]
    return out


def rotate(dsn: str) -> Tuple[bool, int]:
    """The leader's rotation, now: completed rows kept 0 s, the others a week."""
    return tuple(query(dsn, "SELECT rotated, dropped FROM awa.rotate_done_ring(0, 604800, 604800, '200ms', 0)")[0])


@pytest.fixture
def history(dsn: str) -> str:
    query(dsn, HISTORY)
    enqueue(dsn, *[awa_pool.Job("add", {"a": i, "b": i}) for i in range(3)])   # and some run for real, now
    drain(dsn)
    failed_job(dsn)
    query(dsn, "ANALYZE awa.jobs_done")
    return dsn


def expected_totals() -> Dict[str, List[int]]:
    """HISTORY's totals per kind, by hand: finished, attempts, failures,
    crashes, timeouts for each g % 8 (see HISTORY)."""
    per_case = {0: [1, 1, 0, 0, 0], 1: [1, 3, 1, 1, 0], 2: [1, 1, 1, 0, 0], 3: [1, 1, 0, 1, 0],
                4: [1, 2, 0, 0, 2], 5: [1, 0, 0, 0, 0], 6: [1, 0, 0, 0, 0], 7: [1, 1, 1, 0, 0]}
    out: Dict[str, List[int]] = {}
    for g in range(1, 301):
        kind = f"k{g % 3}"
        out[kind] = [a + b for a, b in zip(out.get(kind, [0] * 5), per_case[g % 8])]
    return out


def test_counts_equal_the_rows_in_every_slice_and_agree_with_awa_pool_kinds(history: str) -> None:
    seen = check_every_window(KindTrends(), history)
    # every 48-minute slice of the day holds some of the jobs (one every 4.7 minutes)
    assert len({slot for _, slot in seen["24h"]}) == KIND_BUCKETS
    week = totals(seen["7d"])    # the whole history
    assert week == dict(expected_totals(), add=[3, 3, 0, 0, 0], fail=[1, 1, 1, 0, 0])
    # the same counts as `awa-pool kinds` (every job here is finished)
    with connection(history) as conn:
        cli = {s.kind: [s.runs, s.failures, s.crashes, s.timeouts] for s in kind_stats(conn)}
    assert {kind: values[1:] for kind, values in week.items()} == cli


def test_counts_follow_a_purge_a_retry_and_the_rotation(history: str) -> None:
    dsn = history
    trends = KindTrends()   # one dashboard, looking again after each change
    before = totals(check_every_window(trends, dsn)["7d"])
    # A first turn of the ring drops nothing (the oldest segment is empty)
    # and folds the writers' rows into slot 0, so the purge below is
    # folded into rows that are there already.
    assert rotate(dsn) == (True, 0)
    assert scalar(dsn, "SELECT count(*) FROM awa.done_kinds WHERE slot <> 0") == 0
    with connection(dsn) as conn:
        assert awa_pool.dlq_purge(conn, all=True) == 37   # g % 8 = 7: 37 of 300
        failed = scalar(dsn, "SELECT min(id) FROM awa.jobs_done WHERE kind = 'k1' AND state = 'failed'")
        assert awa_pool.retry_job(conn, failed).value == "available"   # back out of history
        conn.commit()
    after = totals(check_every_window(trends, dsn)["7d"])
    assert sum(v[0] for v in after.values()) == sum(v[0] for v in before.values()) - 38

    # Once round the ring: completed rows are dropped with their segment,
    # failed and cancelled ones carried forward (and every session's rows
    # folded into slot 0).
    for _ in range(8):
        assert rotate(dsn)[0]
        check_every_window(trends, dsn)
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs_done WHERE state = 'completed'") == 0
    assert scalar(dsn, "SELECT count(*) FROM awa.done_kinds WHERE slot <> 0") == 0
    rotated = totals(check_every_window(trends, dsn)["7d"])
    assert "add" not in rotated and rotated["fail"] == [1, 1, 1, 0, 0]
    query(dsn, "TRUNCATE awa.jobs_done")
    assert page_counts(trends, dsn, KIND_WINDOWS["7d"])[0] == {}


def test_closed_slices_keep_their_samples_and_only_new_ones_are_sampled(dsn: str) -> None:
    enqueue(dsn, *[awa_pool.Job("add", {"a": i, "b": i}) for i in range(4)])
    drain(dsn)
    trends = KindTrends()
    with connection(dsn) as conn:
        first = trends.read(conn, 86400.0)
        assert trends.slices_sampled == KIND_BUCKETS           # the first view samples the window
        again = trends.read(conn, 86400.0)
        assert trends.slices_sampled <= 2                      # then the open slice (and one closing)
    assert [(t.kind, t.total("finished"), len(t.all_values("wall"))) for t in again] \
        == [(t.kind, t.total("finished"), len(t.all_values("wall"))) for t in first] == [("add", 4, 4)]


def test_the_migration_counts_the_history_already_there(empty_dsn: str) -> None:
    """A database at 0019 with history gets exact `finished` counts from 0020."""
    from awa_pool.api.migrate import MIGRATIONS, migrate
    from awa_pool.core.sql import QUERIES

    conn = psycopg2.connect(empty_dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(QUERIES["bootstrap_migrations"])
            for version, name, text in MIGRATIONS:
                if version < 20:
                    cur.execute(text)
                    cur.execute(QUERIES["record_migration"], {"version": version, "name": name})
            cur.execute(HISTORY)
        conn.commit()
        assert migrate(conn) == [version for version, _, _ in MIGRATIONS if version >= 20]
    finally:
        conn.close()
    assert scalar(empty_dsn, "SELECT count(*) FROM awa.done_kinds WHERE slot <> 0") == 0
    check_every_window(KindTrends(), empty_dsn)
    assert scalar(empty_dsn, "SELECT sum(finished) FROM awa.done_kinds") == 300
    assert query(empty_dsn, "SELECT sum(jobs) FROM awa.done_counts")[0][0] == 300

