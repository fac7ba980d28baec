"""The curves of scale.py that run supervisors on a big live state: backlog
depth, jobs due at once, queue count, payload size, supervisor count. The
history curve (operator reads) lives in scale_history.py, the live curve
(reads that count live jobs) in scale_live.py.

Each function takes the Context and the curve's points, builds each point's
state with scale_build, measures it ctx.reps times and records every
measurement with ctx.record.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional

import scale_build as build
from scale_fleet import (Fleet, background_pids, backend_pids, cpu_seconds, done_count, drain_rate,
                         machine_times, p50_p99, peak_rss, probe_pickups, wait_for)
from scale_history import history  # noqa: F401  (scale.py looks curves up here)
from scale_live import live  # noqa: F401

Q = "scale"
# The backlog's supervisors serve Q with priority aging off: with the
# default (60 s), backlog jobs older than a minute rank as priority 1 and a
# new priority-1 job waits its turn among them, by design (no job starves);
# docs/benchmarks.md gives that figure separately.
STRICT_Q = f"{Q},aging=0"
DRAIN_WINDOW_S = 10.0        # a drain measurement stops after this long...
DRAIN_CAP = 300_000          # ...or after this many jobs
PROBES, PROBE_HZ = 100, 50.0  # pickup probes per measurement
SMALL_BATCH = int(__import__("os").environ.get("SMALL_BATCH", "8"))              # the backlog curve's second setting: max_batch_per_child


def _enqueue_rates(ctx: Any, conn: Any, point: Any, rep: int) -> None:
    """One job per transaction (1,000 calls, autocommit) and enqueue_many
    (20 chunks of 1,000) into queue Q, then remove what was added."""
    awa = ctx.awa
    with conn.cursor() as cur:
        cur.execute("SELECT last_value FROM awa.job_id_seq")
        before = cur.fetchone()[0]
    conn.commit()
    conn.autocommit = True
    try:
        n1 = 200 if ctx.small else 1000
        t = time.perf_counter()
        for i in range(n1):
            awa.enqueue(conn, awa.Job("noop", {"e": i}, queue=Q))
        ctx.record(point, "enqueue 1/tx", n1 / (time.perf_counter() - t), rep, "jobs/s")
        chunks = 5 if ctx.small else 20
        jobs = [[awa.Job("noop", {"e": c * 1000 + i}, queue=Q) for i in range(1000)] for c in range(chunks)]
        t = time.perf_counter()
        for chunk in jobs:
            awa.enqueue_many(conn, chunk)
        ctx.record(point, "enqueue_many", chunks * 1000 / (time.perf_counter() - t), rep, "jobs/s")
    finally:
        conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute("DELETE FROM awa.jobs_hot WHERE id > %s", (before,))
    conn.commit()
    build.vacuum(conn, "awa.jobs_hot")


def _drain_window(ctx: Any, conn: Any, fleet: Fleet, queues: List[str], target: int,
                  window_s: float = DRAIN_WINDOW_S) -> float:
    """Wait for the first completion, then until `target` jobs are done or
    the window has passed; returns when the first completion was seen."""
    first = wait_for(lambda: done_count(conn, queues) > 0, 120, "the first completion", fleet, every=0.05)
    wait_for(lambda: done_count(conn, queues) >= target or time.time() - first > window_s,
             window_s + 600, f"{target} completions", fleet, every=0.25)
    return first


class _CpuMeter:
    """CPU of the fleet's supervisors, children and PostgreSQL backends, and
    of the server's background processes (checkpointer, WAL writer,
    autovacuum), from now until record(), per job completed meanwhile (less
    sensitive to a shared machine's load than a rate); and the share of the
    machine's time left idle or waiting for the disk."""

    def __init__(self, ctx: Any, conn: Any, fleet: Fleet, queues: Optional[List[str]] = None) -> None:
        self.ctx = ctx
        self.conn = conn
        self.queues = queues or [Q]
        pids = fleet.pids()
        self.groups = {"supervisor": pids["supervisors"], "children": pids["children"],
                       "postgres": backend_pids(conn, ctx.dbname)}
        self.background = set(background_pids(conn))
        self.start = {p: cpu_seconds(p) for p in set().union(self.background, *self.groups.values())}
        self.machine = machine_times()
        self.done = done_count(conn, self.queues)

    def record(self, point: Any, rep: int, tag: str, done: int) -> None:
        jobs = max(done - self.done, 1)
        # background processes that started meanwhile (autovacuum workers) count whole
        self.groups["postgres background"] = sorted(self.background | set(background_pids(self.conn)))
        for label, group in self.groups.items():
            used = sum(cpu_seconds(p) - self.start.get(p, 0.0) for p in group)
            self.ctx.record(point, f"CPU per job, {label}{tag}", 1e6 * used / jobs, rep, "us")
        busy, idle, iowait = (b - a for a, b in zip(self.machine, machine_times()))
        total = max(busy + idle + iowait, 1e-9)
        self.ctx.record(point, f"machine idle{tag}", idle / total, rep, "share")
        self.ctx.record(point, f"machine waiting for disk{tag}", iowait / total, rep, "share")


def backlog(ctx: Any, depths: List[int]) -> None:
    for depth in depths:
        ctx.say(f"backlog {depth:,}: building")
        ctx.fresh()
        conn = ctx.connect()
        build.add_available(conn, Q, depth)
        build.vacuum(conn, "awa.jobs_hot")
        for rep in range(1, ctx.reps + 1):
            _enqueue_rates(ctx, conn, depth, rep)
        runs = [(rep, None) for rep in range(1, ctx.reps + 1)]
        runs += [(rep, SMALL_BATCH) for rep in range(1, ctx.reps + 1)]
        for i, (rep, batch) in enumerate(runs):
            tag = "" if batch is None else f" (batch <= {batch})"
            since = time.time()
            with Fleet(ctx.dsn, supervisors=2, workers=1, queues=[STRICT_Q], source=ctx.source,
                       max_batch=batch) as fleet:
                wait_for(lambda: done_count(conn, [Q]) > 0, 120, "the first completion", fleet, every=0.05)
                cpu = _CpuMeter(ctx, conn, fleet)
                lat = probe_pickups(ctx.dsn, fleet, Q, PROBES, PROBE_HZ, ctx.awa)
                _drain_window(ctx, conn, fleet, [Q], min(depth, DRAIN_CAP))
                cpu.record(depth, rep, tag, done_count(conn, [Q]))   # probes are kind 'probe': not counted
            rate = drain_rate(conn, [Q], since)
            ctx.record(depth, "drain" + tag, rate["jobs_per_s"], rep, "jobs/s")
            p50, p99 = p50_p99(lat)
            ctx.record(depth, "pickup p50" + tag, p50, rep, "ms")
            ctx.record(depth, "pickup p99" + tag, p99, rep, "ms")
            left = build.count(conn, "SELECT count(*) FROM awa.jobs_hot WHERE queue = %s", (Q,))
            if i < len(runs) - 1:  # back to the same depth, vacuumed, no history
                build.add_available(conn, Q, depth - left, first=depth + (i + 1) * depth)
                build.clear_done(conn)
                build.vacuum(conn, "awa.jobs_hot")
        conn.close()


def _due_state(ctx: Any, conn: Any, n: int, per_job: float) -> float:
    """n jobs due at one moment, built and vacuumed before it; returns it."""
    build.clear_live(conn)
    build.clear_done(conn)
    due = time.time() + n * per_job * 2.0 + n * 2e-5 + 15
    ctx.say(f"scheduled {n:,}: building, due in {due - time.time():.0f} s")
    build.add_scheduled(conn, Q, n, due)
    build.vacuum(conn, "awa.jobs_deferred", "awa.jobs_hot")
    if time.time() > due - 3:
        raise RuntimeError("the build overran the due time; raise the margin")
    return due


def _promoted(conn: Any, fleet: Fleet, due: float) -> float:
    return wait_for(lambda: time.time() >= due and build.count(
        conn, "SELECT count(*) FROM awa.jobs_deferred") == 0, 900, "every job promoted", fleet, every=0.25)


def scheduled(ctx: Any, sizes: List[int]) -> None:
    """n jobs scheduled for one moment T (the build is timed on a trial chunk
    first, so T falls a few seconds after the build and its VACUUM): the
    leader promoting them alone (its supervisor serves another queue), then
    while two supervisors drain them as they come."""
    for n in sizes:
        ctx.fresh()
        conn = ctx.connect()
        t = time.time()
        build.add_scheduled(conn, Q, 10_000, time.time() + 86400)
        per_job = (time.time() - t) / 10_000
        for rep in range(1, ctx.reps + 1):
            due = _due_state(ctx, conn, n, per_job)
            with Fleet(ctx.dsn, supervisors=1, workers=1, queues=["idle"], source=ctx.source) as fleet:
                promoted = _promoted(conn, fleet, due)
            ctx.record(n, "promotion, nothing draining", n / max(promoted - due, 1e-3), rep, "jobs/s")
        for rep in range(1, ctx.reps + 1):
            due = _due_state(ctx, conn, n, per_job)
            with Fleet(ctx.dsn, supervisors=2, workers=1, queues=[Q], source=ctx.source) as fleet:
                promoted = _promoted(conn, fleet, due)
                wait_for(lambda: done_count(conn, [Q]) >= n, 1800, "every job done", fleet, every=0.5)
            last = build.count(conn, "SELECT extract(epoch FROM max(attempted_at)) * 1000 FROM awa.jobs_done")
            ctx.record(n, "promotion", n / max(promoted - due, 1e-3), rep, "jobs/s")
            ctx.record(n, "due to all promoted", promoted - due, rep, "s")
            ctx.record(n, "due to last running", last / 1000.0 - due, rep, "s")
            ctx.record(n, "drain", drain_rate(conn, [Q], due)["jobs_per_s"], rep, "jobs/s")
        conn.close()


def queues(ctx: Any, counts: List[int]) -> None:
    """Weighted shares with 20 ms jobs (1 supervisor x 15 children; even
    queues weight 2, odd weight 1), then no-op drain and CPU per job (2
    supervisors x 1 child serving every queue)."""
    for count in counts:
        names = [f"q{i:04d}" for i in range(count)]
        specs = [f"{q}={2 if i % 2 == 0 else 1}" for i, q in enumerate(names)]
        ctx.fresh()
        conn = ctx.connect()
        for rep in range(1, ctx.reps + 1):
            build.clear_live(conn)
            build.clear_done(conn)
            # enough jobs per queue for the first half of the starts to span
            # several turns of every queue (a turn of 1,000 queues is 1,500 batches)
            per = max(24, (2000 if ctx.small else 8000) // count)
            for q in names:
                build.add_available(conn, q, per, kind="sleep")
            build.vacuum(conn, "awa.jobs_hot")
            half = per * count // 2
            with Fleet(ctx.dsn, supervisors=1, workers=15, queues=specs, source=ctx.source) as fleet:
                start = time.time()   # half the jobs started, or two minutes
                wait_for(lambda: len(fleet.records("start")) >= half or time.time() - start > 120, 180,
                         f"{half} job starts", fleet)
                starts = sorted(fleet.records("start"), key=lambda r: float(r[1]))[:half]
            half = len(starts)
            span = float(starts[-1][1]) - float(starts[0][1])
            ctx.record(count, "20 ms jobs started", half / span, rep, "jobs/s")
            if count > 1:
                heavy = sum(1 for q, _ in starts if int(q[1:]) % 2 == 0)
                ctx.record(count, "share of weight-2 queues (ideal 0.667)", heavy / half, rep, "share")
            build.clear_live(conn)
            build.clear_done(conn)
            per = max(20, (10_000 if ctx.small else 60_000) // count)
            for q in names:
                build.add_available(conn, q, per)
            build.vacuum(conn, "awa.jobs_hot")
            since = time.time()
            with Fleet(ctx.dsn, supervisors=2, workers=1, queues=names, source=ctx.source) as fleet:
                wait_for(lambda: done_count(conn, names) > 0, 120, "the first completion", fleet, every=0.05)
                cpu = _CpuMeter(ctx, conn, fleet, names)
                start = time.time()   # 90% done, or a minute: a cliff is measured, not waited out
                wait_for(lambda: done_count(conn, names) >= per * count * 0.9 or time.time() - start > 60,
                         120, "90% done or a minute", fleet, every=0.25)
                cpu.record(count, rep, "", done_count(conn, names))
            ctx.record(count, "no-op drain", drain_rate(conn, names, since)["jobs_per_s"], rep, "jobs/s")
        conn.close()


def payloads(ctx: Any, sizes: List[int]) -> None:
    """Jobs whose args carry `size` characters and whose result returns them
    (1 supervisor x 2 children); peak RSS read from /proc before stopping."""
    for size in sizes:
        n = max(50, min(20_000, (30_000_000 if ctx.small else 300_000_000) // size))
        ctx.fresh()
        conn = ctx.connect()
        for rep in range(1, ctx.reps + 1):
            build.clear_live(conn)
            build.clear_done(conn)
            build.add_blobs(conn, Q, n, size)
            build.vacuum(conn, "awa.jobs_hot")
            since = time.time()
            with Fleet(ctx.dsn, supervisors=1, workers=2, queues=[Q], source=ctx.source) as fleet:
                wait_for(lambda: done_count(conn, [Q], kind="echo") >= n, 1800, f"{n} jobs done", fleet)
                pids = fleet.pids()
                sup = max(peak_rss(p) for p in pids["supervisors"])
                child = max((peak_rss(p) for p in pids["children"]), default=0)
            rate = drain_rate(conn, [Q], since, kind="echo")["jobs_per_s"]
            ctx.record(size, "jobs", rate, rep, "jobs/s")
            ctx.record(size, "payload in and out", rate * size * 2 / 1e6, rep, "MB/s")
            ctx.record(size, "peak RSS supervisor", sup / 2**20, rep, "MiB")
            ctx.record(size, "peak RSS child (max)", child / 2**20, rep, "MiB")
            ctx.record(size, "jobs per measurement", n, rep, "jobs")
        conn.close()


def supervisors(ctx: Any, counts: List[int]) -> None:
    """k supervisors with one child each drain one queue's backlog."""
    depth = 60_000 if ctx.small else 400_000
    ctx.fresh()
    conn = ctx.connect()
    build.add_available(conn, Q, depth)
    build.vacuum(conn, "awa.jobs_hot")
    for k in counts:
        for rep in range(1, ctx.reps + 1):
            since = time.time()
            with Fleet(ctx.dsn, supervisors=k, workers=1, queues=[Q], source=ctx.source) as fleet:
                _drain_window(ctx, conn, fleet, [Q], min(depth, DRAIN_CAP // 2))
            ctx.record(k, "drain", drain_rate(conn, [Q], since)["jobs_per_s"], rep, "jobs/s")
            left = build.count(conn, "SELECT count(*) FROM awa.jobs_hot WHERE queue = %s", (Q,))
            build.add_available(conn, Q, depth - left, first=10_000_000 * k + rep * depth)
            build.clear_done(conn)
            build.vacuum(conn, "awa.jobs_hot")
    conn.close()
