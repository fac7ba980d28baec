"""Big queue states for scale.py, built with SQL in minutes instead of by
running jobs for hours.

Live jobs go in through awa_pool's own insert functions (generate_series
feeding awa.insert_uniform_jobs and awa.insert_jobs), so they are exactly
the rows a producer makes. Terminal history cannot be produced that way
without running every job, so `add_history` writes rows into awa.jobs_done
shaped as the completer, settle_jobs and cancel_job write them: every column
set as those functions set it, states and retries in realistic proportions,
finalized_at spread over the retention window, and each row in the ring
segment retention would have put it in (awa.done_ring's position and
rotated_at set to match), so a rotation finds the ring as it would be after
a day of traffic.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

CHUNK = 100_000          # jobs per insert statement (one transaction each)
HISTORY_CHUNK = 500_000  # history rows per statement
KINDS = ("send_email", "resize_image", "render_pdf", "import_rows", "sync_crm", "webhook",
         "transcode", "nightly_report")
QUEUE_OF_KIND = ("emails", "images", "reports", "etl", "etl", "default", "images", "reports")
BASE_WALL_S = (0.05, 0.8, 2.5, 12.0, 0.4, 0.03, 30.0, 45.0)  # typical handler time per kind


def _chunks(n: int, size: int):
    lo = 0
    while lo < n:
        yield lo, min(n, lo + size)
        lo += size


def add_available(conn: Any, queue: str, n: int, *, kind: str = "noop", first: int = 0,
                  priority: int = 2, progress: Optional[Callable[[int], None]] = None) -> None:
    """n available jobs of `kind` in `queue` ({"i": first..first+n-1} as args),
    through awa.insert_uniform_jobs (what enqueue_many runs), a chunk per
    transaction."""
    with conn.cursor() as cur:
        for lo, hi in _chunks(n, CHUNK):
            cur.execute("SELECT count(*) FROM awa.insert_uniform_jobs(%s, %s, %s, 25, NULL, "
                        "(SELECT jsonb_agg(jsonb_build_object('i', g) ORDER BY g) "
                        "   FROM generate_series(%s, %s) g))",
                        (kind, queue, priority, first + lo, first + hi - 1))
            conn.commit()
            if progress:
                progress(hi)


def add_blobs(conn: Any, queue: str, n: int, size: int, *, kind: str = "echo") -> None:
    """n available jobs whose args are {"blob": <size characters>}."""
    per = max(1, min(CHUNK, (8 << 20) // max(size, 1)))  # at most ~8 MB per statement
    with conn.cursor() as cur:
        for lo, hi in _chunks(n, per):
            cur.execute("SELECT count(*) FROM awa.insert_uniform_jobs(%s, %s, 2, 25, NULL, "
                        "(SELECT jsonb_agg(jsonb_build_object('blob', repeat(chr(97 + g %% 26), %s))) "
                        "   FROM generate_series(%s, %s) g))", (kind, queue, size, lo, hi - 1))
            conn.commit()


def add_scheduled(conn: Any, queue: str, n: int, run_at_epoch: float, *, kind: str = "noop") -> None:
    """n jobs scheduled for one moment, through awa.insert_jobs with run_at."""
    with conn.cursor() as cur:
        for lo, hi in _chunks(n, CHUNK):
            cur.execute("SELECT count(*) FROM awa.insert_jobs((SELECT jsonb_agg(jsonb_build_object("
                        "'kind', %s::text, 'queue', %s::text, 'args', jsonb_build_object('i', g), "
                        "'run_at', to_timestamp(%s)) ORDER BY g) FROM generate_series(%s, %s) g))",
                        (kind, queue, run_at_epoch, lo, hi - 1))
            conn.commit()


# One terminal row per g in [lo, hi) of n, the newest last (ids grow with
# age, as real ids do). Mix: 97% completed (7% of them after a failed first
# attempt, so with errors and an attempt_log entry), 2% failed after 3
# attempts, 1% cancelled. Per-kind wall time, CPU 80% of wall, 50-150 MB peak RSS.
HISTORY_SQL = """
WITH ring AS (SELECT current, segments FROM awa.done_ring),
rows AS (
    SELECT g, (g * 7919) %% 1000 AS r, ((g * 2654435761) %% 1000) / 1000.0 AS u, g %% 8 + 1 AS k,
           %(t0)s::timestamptz - make_interval(secs => %(span)s * (%(n)s - g - 0.5) / %(n)s) AS fin,
           %(span)s * (%(n)s - g - 0.5) / %(n)s AS age
      FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) g
),
shaped AS (
    SELECT g, r, u, k, fin,
           CASE WHEN r < 970 THEN 'completed' WHEN r < 990 THEN 'failed' ELSE 'cancelled' END AS state,
           CASE WHEN r < 900 THEN 1 WHEN r < 970 THEN 2 WHEN r < 990 THEN 3 ELSE 1 END AS attempt,
           (%(walls)s::real[])[k] * (0.5 + u) AS wall,
           floor(age / %(period)s) AS back
      FROM rows
)
INSERT INTO awa.jobs_done (
    id, kind, queue, args, state, priority, run_at, created_at, attempt, max_attempts, lease,
    timeout_s, tags, metadata, unique_key, lane, ordering_key, batch_id, supervisor_id,
    attempted_at, deadline, finalized_at, crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
    progress, result, callback_id, callback_timeout_at, callback_result, dead_lettered, segment)
SELECT nextval('awa.job_id_seq'), (%(kinds)s::text[])[k], (%(queues)s::text[])[k],
       jsonb_build_object('id', g, 'path', 'bucket/objects/' || g || '.bin', 'width', 128),
       s.state::awa.job_state, 2,
       fin - make_interval(secs => wall * attempt + 0.05),
       fin - make_interval(secs => wall * attempt + 0.05),
       attempt, CASE WHEN s.state = 'failed' THEN 3 ELSE 25 END, attempt, NULL, '{}', '{}', NULL, 0,
       NULL, NULL, 1 + g %% 4,
       fin - make_interval(secs => wall), NULL, fin, 0,
       CASE WHEN attempt > 1 OR s.state <> 'completed' THEN (
           SELECT jsonb_agg(jsonb_build_object(
                      'attempt', a, 'at', fin - make_interval(secs => wall * (attempt - a)),
                      'kind', CASE WHEN s.state = 'cancelled' THEN 'cancel' ELSE 'failed' END,
                      'error', CASE WHEN s.state = 'cancelled' THEN 'cancelled by an operator'
                                    ELSE 'ValueError: row ' || g || ' has no column "amount"' END,
                      'traceback', CASE WHEN s.state = 'cancelled' THEN NULL ELSE
                          'Traceback (most recent call last):' || chr(10)
                          || repeat('  File "app/tasks.py", line 42, in import_rows' || chr(10), 6)
                          || 'ValueError: row ' || g || ' has no column "amount"' END)
                      ORDER BY a)
             FROM generate_series(1, CASE WHEN s.state = 'completed' THEN attempt - 1 ELSE attempt END) a)
       END,
       CASE WHEN attempt > 1 THEN (
           SELECT jsonb_agg(jsonb_build_object(
                      'attempt', a, 'started_at', fin - make_interval(secs => wall * (attempt - a + 1)),
                      'finished_at', fin - make_interval(secs => wall * (attempt - a)),
                      'outcome', 'failed', 'wall_seconds', wall, 'cpu_seconds', wall * 0.8,
                      'peak_rss_bytes', (50e6 + u * 100e6)::bigint) ORDER BY a)
             FROM generate_series(1, attempt - 1) a)
       END,
       CASE WHEN s.state = 'cancelled' THEN NULL ELSE wall END,
       CASE WHEN s.state = 'cancelled' THEN NULL ELSE wall * 0.8 END,
       CASE WHEN s.state = 'cancelled' THEN NULL ELSE (50e6 + u * 100e6)::bigint END,
       NULL,
       CASE WHEN s.state = 'completed' AND k %% 2 = 0 THEN jsonb_build_object('bytes', g %% 100000) END,
       NULL, NULL, NULL, false,
       (((SELECT current FROM ring) - back)::integer %% 8 + 8) %% 8
  FROM shaped s
"""


def ring_period_s(keep_completed_s: float, keep_failed_s: float) -> float:
    """The rotation period awa.rotate_done_ring uses with 8 segments."""
    return max(1.0, min(keep_completed_s, keep_failed_s) / 7)


def add_history(conn: Any, n: int, *, keep_completed_s: float = 86400.0,
                keep_failed_s: float = 7 * 86400.0,
                progress: Optional[Callable[[int], None]] = None) -> None:
    """n terminal rows finalized evenly over the last 8 rotation periods, the
    ring as it stands in steady traffic when its next rotation is due: the
    current segment holds the last period, each older segment one period
    more, and the oldest (rotated next) rows past the completed retention
    (its failed and cancelled rows are still inside theirs and get carried).
    Run supervisors with leader=False on it, or the leader rotates at once."""
    period = ring_period_s(keep_completed_s, keep_failed_s)
    span_s = 8 * period
    t0 = time.time()
    with conn.cursor() as cur:
        cur.execute("SELECT segments FROM awa.done_ring")
        if cur.fetchone()[0] != 8:
            raise RuntimeError("add_history assumes the ring's 8 segments")
        cur.execute("UPDATE awa.done_ring SET rotated_at = to_timestamp(%s) - make_interval(secs => %s)",
                    (t0, period))
        conn.commit()
        for lo, hi in _chunks(n, HISTORY_CHUNK):
            cur.execute(HISTORY_SQL, {"t0": _ts(t0), "span": span_s, "n": n, "lo": lo, "hi": hi,
                                      "period": period, "walls": list(BASE_WALL_S),
                                      "kinds": list(KINDS), "queues": list(QUEUE_OF_KIND)})
            conn.commit()
            if progress:
                progress(hi)


def _ts(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1e6):06d}+00"


def vacuum(conn: Any, *tables: str) -> None:
    """VACUUM ANALYZE, as autovacuum would have by the time a state is this big."""
    old = conn.autocommit
    conn.commit()
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for table in tables:
                cur.execute(f"VACUUM (ANALYZE) {table}")
    finally:
        conn.autocommit = old


def clear_done(conn: Any) -> None:
    """Empty terminal history (a TRUNCATE of every ring segment)."""
    with conn.cursor() as cur:
        cur.execute("TRUNCATE awa.jobs_done")
    conn.commit()


def clear_live(conn: Any) -> None:
    with conn.cursor() as cur:
        cur.execute("TRUNCATE awa.jobs_hot, awa.jobs_deferred")
    conn.commit()


def count(conn: Any, sql: str, params: Any = None) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        value = cur.fetchone()[0]
    conn.commit()
    return int(value or 0)
