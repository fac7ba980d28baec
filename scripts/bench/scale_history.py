"""scale.py's history curve: terminal history of 0, 1M and 10M rows (the
done ring as a day of traffic leaves it, scale_build.add_history), and on
it: every operator read (API, CLI, dashboard pages, Prometheus scrape),
the retention rotation, enqueue and drain rate.

Supervisors here never lead (no rotation behind the measurement's back);
the rotation is timed by calling awa.rotate_done_ring as the leader does,
inside a transaction that is rolled back, so the history stays put.
"""
from __future__ import annotations

import socket
import time
from typing import Any, List

import scale_build as build
import scale_reads as reads
from scale_fleet import Fleet, drain_rate, wait_for

Q = "scale"
SCRAPE_PAUSE_S = 5.2   # the queue gauges refresh from SQL at most every 5 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _record_reads(ctx: Any, size: int, timings: dict) -> None:
    for name, times in timings.items():
        for rep, ms in enumerate(times, 1):
            ctx.record(size, name, ms, rep, "ms")


def _rotation(ctx: Any, conn: Any, size: int) -> None:
    """The leader's retention call with its default retentions, the period
    forced to 0 so it turns now; rolled back each time."""
    for rep in range(1, ctx.reps + 1):
        with conn.cursor() as cur:
            t = time.perf_counter()
            cur.execute("SELECT rotated, dropped, carried FROM awa.rotate_done_ring(86400, 604800, "
                        "2592000, '200ms', 0)")
            rotated, dropped, carried = cur.fetchone()
            ms = 1000 * (time.perf_counter() - t)
        conn.rollback()
        if not rotated:
            raise RuntimeError("the rotation did not turn the ring")
        ctx.record(size, "retention rotation", ms, rep, "ms")
        ctx.record(size, "rotation dropped", dropped, rep, "rows")
        ctx.record(size, "rotation carried", carried, rep, "rows")


def _scrape(ctx: Any, size: int) -> None:
    port = _free_port()
    with Fleet(ctx.dsn, supervisors=1, workers=1, queues=["idle"], source=ctx.source, leader=False,
               metrics_port=port) as fleet:
        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                return False
        wait_for(up, 60, "the metrics endpoint", fleet)
        _record_reads(ctx, size, reads.time_reads([("Prometheus scrape", reads.scrape(port))],
                                                  ctx.reps, pause_s=SCRAPE_PAUSE_S))


def _enqueue_and_drain(ctx: Any, conn: Any, size: int) -> None:
    awa = ctx.awa
    # long enough for the middle 80% to be a steady drain (20,000 took half a
    # second, and how soon the second supervisor started decided the rate)
    n = 4000 if ctx.small else 100_000
    for rep in range(1, ctx.reps + 1):
        conn.autocommit = True
        t = time.perf_counter()
        for i in range(1000):
            awa.enqueue(conn, awa.Job("noop", {"e": i}, queue=Q))
        ctx.record(size, "enqueue 1/tx", 1000 / (time.perf_counter() - t), rep, "jobs/s")
        jobs = [awa.Job("noop", {"e": i}, queue=Q) for i in range(n - 1000)]
        t = time.perf_counter()
        for lo in range(0, len(jobs), 1000):
            awa.enqueue_many(conn, jobs[lo:lo + 1000])
        ctx.record(size, "enqueue_many", len(jobs) / (time.perf_counter() - t), rep, "jobs/s")
        conn.autocommit = False
        build.vacuum(conn, "awa.jobs_hot")
        since = time.time()
        with Fleet(ctx.dsn, supervisors=2, workers=1, queues=[Q], source=ctx.source, leader=False) as fleet:
            wait_for(lambda: build.count(conn, "SELECT count(*) FROM awa.jobs_hot") == 0, 600,
                     f"{n} jobs drained", fleet, every=0.1)
        ctx.record(size, "drain", drain_rate(conn, [Q], since)["jobs_per_s"], rep, "jobs/s")
        # back to the history this point measures
        with conn.cursor() as cur:
            cur.execute("DELETE FROM awa.jobs_done WHERE queue = %s", (Q,))
        conn.commit()
        build.vacuum(conn, "awa.jobs_done")


def history(ctx: Any, sizes: List[int]) -> None:
    for size in sizes:
        ctx.fresh()
        conn = ctx.connect()
        t = time.time()
        ctx.say(f"history {size:,}: building")
        build.add_history(conn, size, progress=lambda done: ctx.say(f"  {done:,} rows") if done % 2_000_000 == 0 else None)
        build.vacuum(conn, "awa.jobs_done")
        ctx.say(f"history {size:,}: built in {time.time() - t:.0f} s")
        # a sample job from the middle of history, and a deep page's age: half the history back
        sample = build.count(conn, "SELECT coalesce(max(id) / 2, 1) FROM awa.jobs_done")
        span = build.count(conn, "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0) "
                                 "FROM awa.jobs_done")
        api, api_conn = reads.api_reads(ctx.dsn, sample, max(span / 2, 60.0))
        try:
            _record_reads(ctx, size, reads.time_reads(api, ctx.reps))
        finally:
            api_conn.close()
        _record_reads(ctx, size, reads.time_reads(reads.cli_reads(ctx.dsn), ctx.reps))
        failed = build.count(conn, "SELECT coalesce(max(id), %(id)s) FROM awa.jobs_done "
                                   "WHERE state = 'failed' AND id <= %(id)s", {"id": sample}) if size else None
        _record_reads(ctx, size, reads.time_reads(
            reads.dashboard_reads(ctx.dsn, failed, sample, build.KINDS[0]), ctx.reps))
        _scrape(ctx, size)
        if size:
            _rotation(ctx, conn, size)
        _enqueue_and_drain(ctx, conn, size)
        conn.close()

