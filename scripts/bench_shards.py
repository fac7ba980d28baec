#!/usr/bin/env python3
"""What queue shards buy: several supervisors drain one hot queue of no-op
jobs, with the queue split into 1 lane and into N lanes, interleaved.

    python scripts/bench_shards.py --jobs 40000 --supervisors 4 --shards 1,4 --reps 3

Prints jobs/s per setting (median of the reps), and claim contention seen
in pg_stat_activity (how often a claim was waiting on a lock). The script
creates and drops its own database (awa_bench_shards) on the server given
by --database-url (default: the local server).
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import awa_pool  # noqa: E402
from awa_pool import Job  # noqa: E402
from scriptdb import fresh_database  # noqa: E402

APP = '''
import awa_pool

@awa_pool.task("shard_noop", queue="hot")
def noop(**_):
    pass
'''


def run_once(server: str, jobs: int, supervisors: int, workers: int, shards: int, app_dir: Path) -> dict:
    dsn = fresh_database(server, "awa_bench_shards")
    conn = psycopg2.connect(dsn)
    awa_pool.set_queue_shards(conn, "hot", shards)
    for start in range(0, jobs, 5000):
        awa_pool.enqueue_many(conn, [Job("shard_noop", {"i": i}, queue="hot")
                                     for i in range(start, min(jobs, start + 5000))])
    conn.commit()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("ANALYZE")
    env = dict(os.environ, PYTHONPATH=f"{app_dir}{os.pathsep}{ROOT}")
    procs = [subprocess.Popen([sys.executable, "-m", "awa_pool", "start", "--app", "shard_app",
                               "-w", str(workers), "--queue", "hot", "--database-url", dsn,
                               "--log-level", "warning"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True) for _ in range(supervisors)]
    waits = {"samples": 0, "lock_waits": 0}
    stop = threading.Event()

    def sample_waits() -> None:
        probe = psycopg2.connect(dsn)
        probe.autocommit = True
        with probe.cursor() as cur:
            while not stop.is_set():
                cur.execute("SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) "
                            "FROM pg_stat_activity WHERE datname = current_database() "
                            "AND query LIKE '%awa.claim(%' AND state = 'active'")
                locked, active = cur.fetchone()
                waits["samples"] += active
                waits["lock_waits"] += locked
                time.sleep(0.01)
        probe.close()

    sampler = threading.Thread(target=sample_waits, daemon=True)
    try:
        with conn.cursor() as cur:
            started = None
            while True:
                cur.execute("SELECT count(*) FROM awa.jobs_done")
                done = cur.fetchone()[0]
                if started is None and done > 0:
                    started, first = time.monotonic(), done
                    sampler.start()
                if done >= jobs:
                    break
                time.sleep(0.02)
            elapsed = time.monotonic() - started
    finally:
        stop.set()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        conn.close()
    return {"jobs_per_s": (jobs - first) / elapsed,
            "claims_waiting_on_locks": waits["lock_waits"] / max(1, waits["samples"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--jobs", type=int, default=40000)
    parser.add_argument("--supervisors", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1, help="children per supervisor")
    parser.add_argument("--shards", default="1,4", help="comma-separated shard counts to compare")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    app_dir = Path(tempfile.mkdtemp(prefix="awa-shards-"))
    (app_dir / "shard_app.py").write_text(APP)
    settings = [int(s) for s in args.shards.split(",")]
    results = {s: [] for s in settings}
    for rep in range(args.reps):
        for shards in settings[rep % len(settings):] + settings[:rep % len(settings)]:
            result = run_once(args.database_url, args.jobs, args.supervisors, args.workers, shards, app_dir)
            results[shards].append(result)
            print(f"rep {rep + 1} shards={shards}: {result['jobs_per_s']:,.0f} jobs/s, "
                  f"{result['claims_waiting_on_locks']:.0%} of active claims waiting on a lock", flush=True)
    print(f"\n{args.supervisors} supervisors x {args.workers} children, {args.jobs:,} no-op jobs, "
          f"median of {args.reps}:")
    for shards in settings:
        rates = [r["jobs_per_s"] for r in results[shards]]
        waits = [r["claims_waiting_on_locks"] for r in results[shards]]
        print(f"  shards={shards}: {statistics.median(rates):,.0f} jobs/s "
              f"(range {min(rates):,.0f}-{max(rates):,.0f}), "
              f"claims waiting on locks {statistics.median(waits):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
