"""scale.py's live curve: the operator reads that count live jobs
(queue_stats, queue_depth, `awa-pool queues`, the dashboard's overview, a
Prometheus scrape) on a backlog of 0 to 5M available jobs plus a tenth as
many scheduled ones, with a leader running as in production; then
queue_stats and queue_depth while two supervisors drain that backlog.

Since migration 0025 the leader keeps a census of the live jobs and the
reads use it above 100,000 live jobs; the curve also records what each
census took and how often the leader retakes it. With --source of an older
checkout (no census) it gives the curve before.
"""
from __future__ import annotations

import socket
from typing import Any, List

import scale_build as build
import scale_reads as reads
from scale_fleet import Fleet, done_count, wait_for
from scale_history import SCRAPE_PAUSE_S, _free_port, _record_reads

Q, LATER_Q = "scale", "scale_later"
DRAIN_READ_EVERY_S = 3.0


def _census(conn: Any) -> Any:
    """(jobs, took_s, period_s) of the leader's last census, () while none
    was taken, or None when the schema has none (a checkout before
    migration 0025)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('awa.live_census_meta') IS NOT NULL")
        if not cur.fetchone()[0]:
            conn.rollback()
            return None
        cur.execute("SELECT jobs, took_s, awa.census_period_s(took_s) FROM awa.live_census_meta "
                    "WHERE counted_at IS NOT NULL")
        row = cur.fetchone()
    conn.rollback()
    return tuple(row) if row else ()


def live(ctx: Any, depths: List[int]) -> None:
    for depth in depths:
        ctx.say(f"live {depth:,}: building")
        ctx.fresh()
        conn = ctx.connect()
        if depth:
            build.add_available(conn, Q, depth)
            build.add_scheduled(conn, LATER_Q, depth // 10, 4_000_000_000.0)
        build.vacuum(conn, "awa.jobs_hot", "awa.jobs_deferred")
        total = depth + depth // 10
        port = _free_port()
        # the supervisor serves another queue: it leads (and keeps the census)
        # without draining what is measured
        with Fleet(ctx.dsn, supervisors=1, workers=1, queues=["idle"], source=ctx.source,
                   metrics_port=port) as fleet:
            def ready() -> bool:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                except OSError:
                    return False
                census = _census(conn)
                return census is None or (census != () and census[0] >= total)
            wait_for(ready, 600, "the metrics endpoint and the leader's first census", fleet)
            census = _census(conn)
            if census:
                ctx.record(depth, "census", 1000.0 * census[1], 1, "ms")
                ctx.record(depth, "census period", census[2], 1, "s")
            api, api_conn = reads.api_reads(ctx.dsn, 1, 3600.0)
            wanted = {"queue_stats"}
            timed = [(name, fn) for name, fn in api if name in wanted]

            def depth_read() -> None:
                try:
                    ctx.awa.queue_depth(api_conn)
                finally:
                    api_conn.rollback()
            timed.append(("queue_depth", depth_read))
            timed += [(name, fn) for name, fn in reads.cli_reads(ctx.dsn) if name == "awa-pool queues"]
            timed += [(name, fn) for name, fn in reads.dashboard_reads(ctx.dsn, None, 1, "noop")
                      if name == "dashboard overview"]
            _record_reads(ctx, depth, reads.time_reads(timed, ctx.reps))
            _record_reads(ctx, depth, reads.time_reads([("Prometheus scrape", reads.scrape(port))],
                                                       ctx.reps, pause_s=SCRAPE_PAUSE_S))
            api_conn.close()
        if depth:
            _reads_while_draining(ctx, conn, depth)
        conn.close()


def _reads_while_draining(ctx: Any, conn: Any, depth: int) -> None:
    """queue_stats and queue_depth every DRAIN_READ_EVERY_S while two
    supervisors drain the backlog at full speed: what the recent finishes
    (the last 10 and 60 seconds) cost when thousands finish each second."""
    import time

    with Fleet(ctx.dsn, supervisors=2, workers=1, queues=[Q], source=ctx.source) as fleet:
        wait_for(lambda: done_count(conn, [Q]) > 0, 120, "the first completion", fleet, every=0.05)
        for rep in range(1, ctx.reps + 1):
            time.sleep(DRAIN_READ_EVERY_S)
            for name, read in (("queue_stats while draining", ctx.awa.queue_stats),
                               ("queue_depth while draining", ctx.awa.queue_depth)):
                t = time.perf_counter()
                read(conn)
                ctx.record(depth, name, 1000.0 * (time.perf_counter() - t), rep, "ms")
                conn.rollback()
            ratio = _estimate_against_exact(conn)
            if ratio is not None:
                ctx.record(depth, "finished_10s, estimate / exact", ratio, rep, "ratio")


def _estimate_against_exact(conn: Any) -> Any:
    """queue_stats' finished_10s for Q over an exact count of the same
    window, in one statement (so one clock), or None when nothing finished."""
    with conn.cursor() as cur:
        cur.execute("SELECT q.finished_10s::float8 / nullif((SELECT count(*) FROM awa.jobs_done d "
                    "  WHERE d.queue = q.queue AND d.finalized_at > statement_timestamp() - interval '10 s'), 0) "
                    "FROM awa.queue_stats() q WHERE q.queue = %s", (Q,))
        row = cur.fetchone()
    conn.rollback()
    return row[0] if row else None
