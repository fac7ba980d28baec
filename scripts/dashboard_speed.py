"""How long each dashboard page takes on the server with a big history.

Builds a database with HISTORY terminal jobs spread over the last 24 hours
(the default retention of completed jobs) and QUEUED waiting jobs, then
requests every page through the WSGI app (Flask's test client: no network,
so the figure is the server's own time: queries plus rendering) and prints
the median and worst of several requests per page as a Markdown table.

    python scripts/dashboard_speed.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

The history is written with INSERT ... SELECT generate_series, in the exact
shape of the rows the completer writes to awa.jobs_done (final attempt's
wall/CPU/RSS in its columns, earlier attempts in attempt_log, errors with a
traceback, the ring segment by age); the queued jobs go through
awa_pool.enqueue_many, the public bulk path. Mix: render_tile 63 %,
send_digest 32 %, assemble 5 %, and a rare kind (reindex, 1 in 10,000);
2 % failed (dead-lettered in the mail queue), 1 % cancelled, 3 % retried
once after a failure, crash or timeout; peak RSS of render_tile creeps up
over the day (a slow leak the kinds page should show).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import psycopg2  # noqa: E402

from scriptdb import fresh_database  # noqa: E402

SPAN_S = 86400.0
CHUNK = 200_000

HISTORY_SQL = """
WITH ring AS (SELECT current, segments FROM awa.done_ring),
rows AS (
    SELECT g,
           now() - make_interval(secs => %(span)s * (1 - g::double precision / %(total)s)) AS created,
           %(span)s * (1 - g::double precision / %(total)s) AS age_s,
           CASE WHEN g %% 10000 = 7 THEN 'reindex' WHEN g %% 20 = 0 THEN 'assemble'
                WHEN g %% 3 = 0 THEN 'send_digest' ELSE 'render_tile' END AS kind,
           CASE WHEN (g * 7919) %% 1000 < 20 THEN 'failed' WHEN (g * 7919) %% 1000 < 30 THEN 'cancelled'
                ELSE 'completed' END AS state,
           (g * 104729) %% 100 < 3 AS retried,
           CASE g %% 3 WHEN 0 THEN 'crash' WHEN 1 THEN 'timeout' ELSE 'failed' END AS first_outcome
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
),
shaped AS (
    SELECT r.*,
           CASE r.kind WHEN 'send_digest' THEN 'mail' WHEN 'reindex' THEN 'default' ELSE 'render' END AS queue,
           CASE r.kind WHEN 'render_tile' THEN 0.3 + 2.5 * ((r.g * 31) %% 97) / 97.0
                       WHEN 'assemble' THEN 0.006 + 0.002 * ((r.g * 13) %% 7)
                       WHEN 'reindex' THEN 40.0
                       ELSE 0.0004 + 0.0002 * ((r.g * 17) %% 11) END AS wall,
           CASE r.kind WHEN 'render_tile' THEN 31000000 + (86400 - r.age_s) * 120 + ((r.g * 37) %% 500000)
                       ELSE 30000000 + ((r.g * 41) %% 900000) END AS rss
      FROM rows r
)
INSERT INTO awa.jobs_done (id, kind, queue, args, state, priority, run_at, created_at, attempt, max_attempts,
                           lease, tags, metadata, attempted_at, finalized_at, errors, attempt_log,
                           wall_s, cpu_s, peak_rss, result, dead_lettered, segment)
SELECT nextval('awa.job_id_seq'), s.kind, s.queue,
       jsonb_build_object('band', s.g %% 16, 'bands', 16, 'width', 100),
       s.state::awa.job_state, 2, s.created, s.created,
       CASE WHEN s.retried THEN 2 ELSE 1 END, 3, CASE WHEN s.retried THEN 2 ELSE 1 END,
       CASE WHEN s.g %% 50 = 0 THEN ARRAY['urgent'] ELSE '{}'::text[] END, '{}'::jsonb,
       s.created + interval '2 ms', s.created + make_interval(secs => s.wall) + interval '3 ms',
       CASE WHEN s.state = 'failed' OR s.retried THEN
            (CASE WHEN s.retried THEN jsonb_build_array(jsonb_build_object(
                 'attempt', 1, 'at', s.created, 'kind', s.first_outcome,
                 'error', CASE s.first_outcome WHEN 'crash' THEN 'the child died: SIGKILL (out of memory?)'
                               WHEN 'timeout' THEN 'timed out after 300s' ELSE 'ValueError: tile out of range' END))
                  ELSE '[]'::jsonb END)
            || (CASE WHEN s.state = 'failed' THEN jsonb_build_array(jsonb_build_object(
                 'attempt', CASE WHEN s.retried THEN 2 ELSE 1 END, 'at', s.created, 'kind', 'failed',
                 'error', 'ValueError: tile out of range',
                 'traceback', E'Traceback (most recent call last):\\n  File "tilework/tasks.py", line 41, '
                              || E'in render_tile\\n    raise ValueError("tile out of range")\\n'
                              || E'ValueError: tile out of range\\n'))
                ELSE '[]'::jsonb END)
       END,
       CASE WHEN s.retried THEN jsonb_build_array(jsonb_build_object(
            'attempt', 1, 'outcome', s.first_outcome, 'started_at', s.created, 'finished_at', s.created,
            'wall_seconds', CASE WHEN s.first_outcome = 'failed' THEN s.wall END,
            'cpu_seconds', CASE WHEN s.first_outcome = 'failed' THEN s.wall * 0.97 END,
            'peak_rss_bytes', s.rss)) END,
       s.wall, s.wall * 0.97, s.rss::bigint,
       CASE WHEN s.state = 'completed' THEN jsonb_build_object('rows', 40, 'pid', 4000 + s.g %% 8) END,
       s.state = 'failed' AND s.queue = 'mail',
       (((ring.current - floor(s.age_s / (%(span)s / ring.segments))::int) %% ring.segments
         + ring.segments) %% ring.segments)::smallint
  FROM shaped s, ring
"""


def fill(url: str, history: int, queued: int, *, say: Any = print) -> Dict[str, int]:
    """Write `history` terminal jobs and `queued` waiting ones (90 %
    available, 10 % scheduled); returns ids the timing uses."""
    import awa_pool
    from awa_pool.core.periodic import make_schedule
    from awa_pool.api.periodic_admin import register_schedules

    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO awa.queues (name, dlq) VALUES ('mail', true)")
        started = time.monotonic()
        for first in range(1, history + 1, CHUNK):
            last = min(history, first + CHUNK - 1)
            with conn, conn.cursor() as cur:
                cur.execute(HISTORY_SQL, {"first": first, "last": last, "total": history, "span": SPAN_S})
        say(f"history: {history:,} terminal jobs in {time.monotonic() - started:.1f}s")
        started = time.monotonic()
        queues = ["render"] * 6 + ["default"] * 3 + ["mail"]
        for first in range(0, queued, 10_000):
            jobs = [awa_pool.Job("render_tile" if queues[i % 10] == "render" else "send_digest",
                                 {"band": i % 16, "bands": 16}, queue=queues[i % 10],
                                 tags=["urgent"] if i % 50 == 0 else (),
                                 delay=3600 if i % 10 == 9 else None)
                    for i in range(first, min(queued, first + 10_000))]
            with conn:
                awa_pool.enqueue_many(conn, jobs)
        say(f"queued: {queued:,} jobs in {time.monotonic() - started:.1f}s")
        with conn:
            register_schedules(conn, [
                make_schedule("hourly_digest", "0 * * * *", "send_digest", {"to": "ops@example.com"}),
                make_schedule("nightly_reindex", "30 2 * * *", "reindex", {}, queue="default")])
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM (ANALYZE) awa.jobs_done")
            cur.execute("VACUUM (ANALYZE) awa.jobs_hot")
            cur.execute("VACUUM (ANALYZE) awa.jobs_deferred")
    finally:
        conn.close()
    return existing_ids(url)


def existing_ids(url: str) -> Dict[str, int]:
    """The id range of the history and a failed job in its middle."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT min(id), max(id) FROM awa.jobs_done")
            low, high = cur.fetchone()
            cur.execute("SELECT max(id) FROM awa.jobs_done WHERE state = 'failed' AND kind = 'render_tile' "
                        "AND id < %s", ((low + high) // 2,))
            return {"low": low, "high": high, "failed": cur.fetchone()[0]}
    finally:
        conn.close()


def pages(ids: Dict[str, int]) -> List[Tuple[str, str]]:
    middle = (ids["low"] + ids["high"]) // 2
    return [
        ("overview", "/"),
        ("overview fragment (every 2 s)", "/fragment/overview"),
        ("jobs, first page", "/jobs"),
        ("jobs, deep page (keyset, mid-history)", f"/jobs?before={middle}"),
        ("jobs, state=failed", "/jobs?state=failed"),
        ("jobs, state=failed, deep page", f"/jobs?state=failed&before={middle}"),
        ("jobs, state=running", "/jobs?state=running"),
        ("jobs, state=scheduled", "/jobs?state=scheduled"),
        ("jobs, queue=mail", "/jobs?queue=mail"),
        ("jobs, kind=render_tile", "/jobs?kind=render_tile"),
        ("jobs, kind=reindex (1 in 10,000)", "/jobs?kind=reindex"),
        ("jobs, tag=urgent", "/jobs?tag=urgent"),
        ("jobs, older_than=12h", "/jobs?older_than=12h"),
        ("job detail (failed, traceback)", f"/jobs/{ids['failed']}"),
        ("cancel by filter: count (queue=render)", "/jobs/cancel?queue=render"),
        ("kinds, last hour", "/kinds"),
        ("kinds, last 6 h", "/kinds?window=6h"),
        ("kinds, last 24 h", "/kinds?window=24h"),
        ("cron", "/cron"),
        ("dead letters", "/dlq"),
    ]


def backend_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a local PostgreSQL backend has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_pages(url: str, ids: Dict[str, int], repeat: int) -> List[Tuple[str, str, float, float, float, float]]:
    """(label, path, first request ms, median ms, worst ms, CPU ms) per page.
    The first request of a page includes what a fresh dashboard process pays
    once (the kinds page reads its whole window, then only new slices). CPU
    ms is the CPU one request used, in this process and in its PostgreSQL
    backend (read from /proc: the server must be local): what the request
    costs on an idle machine, however busy this one is."""
    from awa_pool.dashboard import create_app

    app = create_app(url)
    client = app.test_client()
    client.get("/cron")   # the connection and the templates' first compile are not any page's cost
    with app.extensions["awa_connections"].connection() as conn:
        backend = conn.get_backend_pid()   # the test client is one thread: it reuses this one
    results = []
    for label, path in pages(ids):
        started = time.perf_counter()
        response = client.get(path)
        first = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, f"{path}: HTTP {response.status_code}"
        client.get(path)
        times = []
        cpu_started, backend_started = time.process_time(), backend_cpu_s(backend)
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
        cpu_ms = ((time.process_time() - cpu_started) + (backend_cpu_s(backend) - backend_started)) * 1000 / repeat
        results.append((label, path, first, statistics.median(times), max(times), cpu_ms))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="a server URL (a database is created on it)")
    parser.add_argument("--database", default="awa_dashboard_speed", help="name of the database to (re)create")
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15, help="timed requests per page")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--reuse", action="store_true", help="time an existing database kept by --keep")
    args = parser.parse_args()

    from scriptdb import drop_database

    from scriptdb import with_database

    url = with_database(args.database_url, args.database) if args.reuse else \
        fresh_database(args.database_url, args.database)
    try:
        ids = existing_ids(url) if args.reuse else \
            fill(url, args.history, args.queued, say=lambda m: print(m, file=sys.stderr))
        results = time_pages(url, ids, args.repeat)
        conn = psycopg2.connect(url)
        with conn.cursor() as cur:
            cur.execute("SHOW server_version")
            server = cur.fetchone()[0]
        conn.close()
    finally:
        if not args.keep:
            drop_database(args.database_url, args.database)
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}: {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, PostgreSQL {server}; {args.history:,} terminal jobs over "
          f"24 h, {args.queued:,} queued; {args.repeat} requests per page")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print("| page | path | CPU ms | median ms | worst ms | first ms |")
    print("|---|---|---:|---:|---:|---:|")
    for label, path, first, median, worst, cpu in results:
        print(f"| {label} | `{path}` | {cpu:.1f} | {median:.1f} | {worst:.1f} | {first:.1f} |")
    slowest = max(results, key=lambda r: r[5])
    print(f"\nmost CPU: {slowest[0]} at {slowest[5]:.1f} ms per request")


if __name__ == "__main__":
    main()
