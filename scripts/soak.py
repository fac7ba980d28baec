#!/usr/bin/env python3
"""Sustained mixed load against real supervisors, sampled every few seconds.

A producer enqueues at a fixed rate, paced on real elapsed time (it catches
up after a slow commit instead of drifting), a mix of no-op jobs, short CPU
jobs, jobs that fail once and retry, and jobs scheduled a few seconds out.
Every --sample seconds the script records completion rate, pickup latency
(claim time - the moment the producer's commit returned, as the benchmark's
W4 counts it) p50/p99 of the jobs claimed in that window, queue
depth, the dead tuples and size of every awa table and index, the
producer's longest commit and longest gap between commits (a slow commit
releases its jobs together), and the machine's I/O wait and CPU stolen by
other guests of the hypervisor. It writes a CSV and,
when matplotlib is installed, a PNG plot; --trace-slow-ms also lists every
slow pickup with the clock time of its claim.

    python scripts/soak.py --minutes 10 --capacity-fraction 0.7 \\
        --retention 60s --out docs/soak

First, unless --rate is given, it measures the no-op capacity of the same
supervisors: by default with the producer flooding them with no-op jobs on
the same machine for --capacity-seconds (what the machine sustains when
production and consumption share its cores), with --capacity loaded-mix the
same flood made of the soak's own mix (its CPU jobs and retries cost more
than no-op jobs; --mix noop sends no-op jobs only), or with --capacity drain
by emptying a pre-filled backlog with the producer idle. Exit status 1 when
the soak misses its bars: rate held within 5%, p99 pickup under --max-p99-ms in
every window, dead tuples of the claim-path tables bounded (their highest
reading, taken every 0.5 s, in the second half no higher than --dead-growth
times the larger of the first half's and the leader's vacuum threshold), and total
size flat once history reached its retention age and jobs_hot had its first
vacuum (not judged in a run too short or slow to get there).

The producer process is in soak_producer.py, what the sampler reads in
soak_sampling.py, the plot in soak_plot.py; this file runs the soak and
judges its bars.
"""
from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import awa_pool  # noqa: E402
from awa_pool import Job  # noqa: E402
from awa_pool.worker.maintenance import VacuumQueueTables  # noqa: E402
from scriptdb import fresh_database  # noqa: E402
from soak_plot import plot  # noqa: E402
from soak_producer import CommitStats, MakeJob, Producer, job_mix, noop_only  # noqa: E402
from soak_sampling import (CLAIM_PATH_TABLES, DEAD_READ_EVERY_S, PICKUP_LAG_S,  # noqa: E402
                           PICKUP_SLICE_S, SAMPLE_SQL, STOLEN_PCT, CpuShares, Pickups)

APP = '''
import time, awa_pool

@awa_pool.task("soak_noop", queue="soak")
def noop(**_):
    pass

@awa_pool.task("soak_cpu", queue="soak")
def cpu(ms=0.2, **_):
    end = time.process_time() + ms / 1000.0
    while time.process_time() < end:
        pass

@awa_pool.task("soak_flaky", queue="soak", pass_context=True)
def flaky(ctx, **_):
    if ctx.attempt == 1:
        raise awa_pool.Retry(delay=0.5, reason="first attempt fails on purpose")
'''



def parse_seconds(text: str) -> float:
    from awa_pool.core.config import parse_duration

    return parse_duration(text, what="duration")


class Supervisors:
    def __init__(self, dsn: str, count: int, workers: int, retention: str, app_dir: Path) -> None:
        self.procs = []
        env = dict(os.environ, PYTHONPATH=f"{app_dir}{os.pathsep}{ROOT}")
        for i in range(count):
            log = open(app_dir / f"supervisor-{i}.log", "wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "awa_pool", "start", "--app", "soak_app", "-w", str(workers),
                 "--queue", "soak", "--database-url", dsn, "--retention-completed", retention,
                 "--retention-failed", retention, "--log-level", "warning"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def count_done(cur) -> int:
    cur.execute("SELECT count(*) FROM awa.jobs_done")
    return cur.fetchone()[0]


def drain_capacity(dsn: str, jobs: int) -> float:
    """No-op jobs/s of the running supervisors draining a pre-filled backlog,
    with nothing else running."""
    conn = psycopg2.connect(dsn)
    with conn:
        for start in range(0, jobs, 1000):
            awa_pool.enqueue_many(conn, [Job("soak_noop", {"i": i}, queue="soak")
                                         for i in range(start, min(jobs, start + 1000))])
    conn.autocommit = True
    cur = conn.cursor()
    before = count_done(cur)
    started = None
    while True:
        done = count_done(cur) - before
        if started is None and done > 0:
            started, first = time.monotonic(), done
        if done >= jobs:
            break
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    conn.close()
    return (jobs - first) / elapsed


def loaded_capacity(dsn: str, seconds: float, make_job: "MakeJob") -> float:
    """Jobs/s the supervisors finish while the producer floods them with
    make_job's jobs on the same machine: what the machine can sustain when
    production and consumption share its cores. Completions are counted over
    the second half of the window (the first fills the backlog); the backlog
    is drained before returning."""
    stats = CommitStats()
    flood = Producer(dsn, None, stats, make_job)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    try:
        time.sleep(seconds / 2)
        before, started = count_done(cur), time.monotonic()
        time.sleep(seconds / 2)
        capacity = (count_done(cur) - before) / (time.monotonic() - started)
    finally:
        flood.stop(30)
    if stats.error:
        raise SystemExit(f"soak: the capacity run's producer failed: {stats.error}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        cur.execute(SAMPLE_SQL["depth"])
        available, running, deferred = cur.fetchone()
        if available + running + deferred == 0:
            break
        time.sleep(0.2)
    else:
        raise SystemExit("soak: the capacity run's backlog did not drain within 300 s")
    conn.close()
    return capacity


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL",
                                                                  "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="server to use; the script creates (dropping it first) --database-name on it")
    parser.add_argument("--database-name", default="awa_soak")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, help="jobs/s (default: capacity x --capacity-fraction)")
    parser.add_argument("--capacity-fraction", type=float, default=0.7)
    parser.add_argument("--capacity", choices=("loaded", "loaded-mix", "drain"), default="loaded",
                        help="how the capacity is measured: 'loaded' (default) with the producer "
                             "flooding the same machine with no-op jobs for --capacity-seconds, "
                             "'loaded-mix' the same with the soak's own mix, 'drain' emptying "
                             "--calibrate-jobs pre-filled no-op jobs with the producer idle")
    parser.add_argument("--mix", choices=("standard", "noop"), default="standard",
                        help="what the producer sends: 'standard' (default) the mix above, "
                             "'noop' no-op jobs only")
    parser.add_argument("--capacity-seconds", type=float, default=30.0)
    parser.add_argument("--producer-commit", choices=("durable", "async"), default="durable",
                        help="'async' commits the soak's jobs without waiting for their WAL flush "
                             "(synchronous_commit off): a diagnostic that shows pickup without the "
                             "bursts a slow flush releases (the capacity run stays durable)")
    parser.add_argument("--calibrate-jobs", type=int, default=20000)
    parser.add_argument("--supervisors", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--retention", default="60s", help="completed and failed retention")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--max-p99-ms", type=float, default=50.0)
    parser.add_argument("--dead-growth", type=float, default=1.5)
    parser.add_argument("--out", default="soak", help="output prefix for .csv and .png")
    parser.add_argument("--trace-slow-ms", type=float,
                        help="also write OUT-slow.csv: every first-attempt pickup slower than this, "
                             "with the wall-clock time of its claim (to line stalls up with server logs)")
    args = parser.parse_args()

    dsn = fresh_database(args.database_url, args.database_name)

    app_dir = Path(tempfile.mkdtemp(prefix="awa-soak-"))
    (app_dir / "soak_app.py").write_text(APP)
    sys.path.insert(0, str(app_dir))
    import soak_app  # noqa: F401  (registers the kinds so producers apply their defaults)

    # SIGTERM (and SIGINT, which a background job ignores) ends the soak
    # through the finally below, so the supervisors are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("soak: terminated"))
    supervisors = Supervisors(dsn, args.supervisors, args.workers, args.retention, app_dir)
    producer: Optional[Producer] = None
    stats = CommitStats()
    rows = []
    failed_bars = []
    make_job = job_mix if args.mix == "standard" else noop_only
    try:
        rate = args.rate
        if rate is None:
            if args.capacity == "drain":
                capacity = drain_capacity(dsn, args.calibrate_jobs)
            else:
                capacity = loaded_capacity(dsn, args.capacity_seconds,
                                           make_job if args.capacity == "loaded-mix" else noop_only)
            rate = capacity * args.capacity_fraction
            what = "mixed-load" if args.capacity == "loaded-mix" and args.mix == "standard" else "no-op"
            print(f"{what} capacity ({args.capacity}) {capacity:,.0f} jobs/s; soaking at {rate:,.0f} jobs/s "
                  f"({args.capacity_fraction:.0%})", flush=True)
        started = time.monotonic()
        producer = Producer(dsn, rate, stats, make_job, durable=args.producer_commit == "durable")
        sample_conn = psycopg2.connect(dsn)
        sample_conn.autocommit = True
        cur = sample_conn.cursor()
        end = started + args.minutes * 60
        next_sample = started + args.sample
        header_printed = False
        previous_trips = None
        cpu_shares = CpuShares()
        pickups = Pickups(cur, time.time() - PICKUP_LAG_S, stats,
                          None if args.trace_slow_ms is None else args.trace_slow_ms / 1000)
        while time.monotonic() < end:
            if stats.error:
                raise SystemExit(f"soak: the producer failed: {stats.error}")
            dead_peaks = {table: 0 for table in CLAIM_PATH_TABLES}
            next_dead_read = time.monotonic()
            while True:
                if time.monotonic() >= next_dead_read:
                    next_dead_read += DEAD_READ_EVERY_S
                    cur.execute(SAMPLE_SQL["claim_path_dead"], (list(CLAIM_PATH_TABLES),))
                    for name, dead in cur.fetchall():
                        dead_peaks[name] = max(dead_peaks[name], dead)
                pickups.read_if_due()
                if time.monotonic() >= next_sample:
                    break
                time.sleep(max(0.0, min(PICKUP_SLICE_S, next_sample - time.monotonic())))
            now = time.monotonic()
            next_sample += args.sample
            completed_window, p50, p99, p99_from_run_at, scheduled_p99 = pickups.take()
            cur.execute(SAMPLE_SQL["depth"])
            available, running, deferred = cur.fetchone()
            cur.execute(SAMPLE_SQL["tables"])
            tables = {name: (dead, live, size) for name, dead, live, size in cur.fetchall()}
            cur.execute(SAMPLE_SQL["indexes"])
            indexes = dict(cur.fetchall())
            cur.execute(SAMPLE_SQL["round_trips"])
            trips = cur.fetchone()
            claims, empty, claimed, flushes = (
                [now_ - before for now_, before in zip(trips, previous_trips)] if previous_trips else [0, 0, 0, 0])
            previous_trips = trips
            commit_max, gap_max = stats.take()
            row = {
                "t": round(now - started, 1), "sent": stats.sent,
                "completed_per_s": round(completed_window / args.sample, 1),
                "pickup_p50_ms": round((p50 or 0) * 1000, 2), "pickup_p99_ms": round((p99 or 0) * 1000, 2),
                "pickup_from_run_at_p99_ms": round((p99_from_run_at or 0) * 1000, 2),
                "scheduled_late_p99_ms": round((scheduled_p99 or 0) * 1000, 2),
                "available": available, "running": running, "deferred": deferred,
                "total_bytes": sum(size for _, _, size in tables.values()),
                "claims_per_s": round(claims / args.sample, 1),
                "empty_claims_per_s": round(empty / args.sample, 1),
                "jobs_per_claim": round(claimed / claims, 1) if claims else 0,
                "completion_flushes_per_s": round(flushes / args.sample, 1),
                # A slow producer commit (its WAL flush), or a long gap between
                # two commits, holds jobs back and then releases them together:
                # a burst the pool drains at its capacity.
                "producer_commit_max_ms": round(commit_max * 1000, 1),
                "producer_gap_max_ms": round(gap_max * 1000, 1),
            }
            row["iowait_pct"], row["steal_pct"] = cpu_shares.take()
            for name, (dead, live, size) in sorted(tables.items()):
                row[f"{name}.dead"] = dead
                row[f"{name}.live"] = live
                row[f"{name}.bytes"] = size
            for name, size in sorted(indexes.items()):
                row[f"idx.{name}.bytes"] = size
            for name, peak in dead_peaks.items():
                row[f"{name}.dead_peak"] = peak
            rows.append(row)
            if not header_printed:
                print("     t  rate/s  p50ms  p99ms  avail  hot.dead^  total MB  claims/s  jobs/claim  commit^ms  gap^ms  iowait%  steal%",
                      flush=True)
                header_printed = True
            print(f"{row['t']:6.0f} {row['completed_per_s']:7.0f} {row['pickup_p50_ms']:6.1f} "
                  f"{row['pickup_p99_ms']:6.1f} {available:6d} {row['jobs_hot.dead_peak']:9d} "
                  f"{row['total_bytes'] / 1e6:9.1f} {row['claims_per_s']:9.0f} {row['jobs_per_claim']:11.1f} "
                  f"{row['producer_commit_max_ms']:10.1f} {row['producer_gap_max_ms']:7.1f} "
                  f"{'-' if row['iowait_pct'] is None else row['iowait_pct']:>8} "
                  f"{'-' if row['steal_pct'] is None else row['steal_pct']:>7}",
                  flush=True)
        producer.stop()
        sample_conn.close()
    finally:
        if producer is not None:
            producer.stop()
        supervisors.stop()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    columns = sorted({key for row in rows for key in row}, key=lambda k: (k not in rows[0], k))
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out.with_suffix('.csv')}")
    if args.trace_slow_ms is not None:
        slow_path = out.with_name(out.name + "-slow.csv")
        with open(slow_path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["claimed_at_utc", "pickup_ms"])
            for claimed_at, pickup in sorted(pickups.slow):
                stamp = datetime.fromtimestamp(claimed_at, timezone.utc).strftime("%H:%M:%S.%f")[:12]
                writer.writerow([stamp, round(pickup * 1000, 1)])
        print(f"wrote {slow_path} ({len(pickups.slow)} pickups over {args.trace_slow_ms:g} ms)")

    # -- the bars -------------------------------------------------------------------
    warm = [r for r in rows if r["t"] > 2 * args.sample]
    achieved = sum(r["completed_per_s"] for r in warm) / max(1, len(warm))
    if achieved < 0.95 * rate:
        failed_bars.append(f"rate: {achieved:,.0f} jobs/s finished on average, below 95% of {rate:,.0f}")
    worst = max((r["pickup_p99_ms"] for r in warm), default=0.0)
    over = [r for r in warm if r["pickup_p99_ms"] >= args.max_p99_ms]
    if over:
        stolen = sum(1 for r in over if (r["steal_pct"] or 0) >= STOLEN_PCT)
        failed_bars.append(f"pickup p99 reached {worst:.1f} ms (bar {args.max_p99_ms:g} ms) in {len(over)} "
                           f"of {len(warm)} windows, {stolen} of them with {STOLEN_PCT:g} % or more of the "
                           f"CPU stolen by other guests")
    half = len(warm) // 2
    for table in CLAIM_PATH_TABLES:
        first = max((r[f"{table}.dead_peak"] for r in warm[:half]), default=0)
        second = max((r[f"{table}.dead_peak"] for r in warm[half:]), default=0)
        # Below the leader's vacuum threshold they are bounded by design (a
        # slow load may not reach it within half a run).
        if second > args.dead_growth * max(first, VacuumQueueTables().dead_threshold):
            failed_bars.append(f"{table} dead tuples grew: peak {first} then {second}")
    retention_s = parse_seconds(args.retention)
    # Size is steady once history reached its age limit and jobs_hot went
    # through one vacuum (its dead tuples, and so its pages, grow until the
    # leader's first vacuum at its threshold: a short, slow run never gets there).
    first_vacuum = next((i for i in range(1, len(rows))
                         if rows[i]["jobs_hot.dead_peak"] < rows[i - 1]["jobs_hot.dead_peak"]), None)
    settled = [] if first_vacuum is None else [
        r for r in rows[first_vacuum:] if r["t"] > max(retention_s, args.sample) * 2]
    if len(settled) < 4:
        print("size: not judged (fewer than 4 samples after both the retention age and the "
              "first vacuum of jobs_hot)")
    else:
        quarter = max(1, len(settled) // 4)
        early = max(r["total_bytes"] for r in settled[:quarter])
        late = max(r["total_bytes"] for r in settled[-quarter:])
        if late > early * 1.25:
            failed_bars.append(f"total size kept growing after retention: {early / 1e6:.1f} MB "
                               f"-> {late / 1e6:.1f} MB")
    print(f"summary: target {rate:,.0f} jobs/s, achieved {achieved:,.0f} jobs/s, worst pickup p99 "
          f"{worst:.1f} ms, samples {len(rows)}")

    try:
        plot(rows, out.with_suffix(".png"), rate, retention_s, args.max_p99_ms)
        print(f"wrote {out.with_suffix('.png')}")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")

    for bar in failed_bars:
        print(f"FAILED: {bar}")
    return 1 if failed_bars else 0


if __name__ == "__main__":
    sys.exit(main())
