#!/usr/bin/env python3
"""Per-job cost of awa_pool.enqueue in a loop vs awa_pool.enqueue_many.

    python scripts/bench_enqueue.py                       # local server, own database
    python scripts/bench_enqueue.py --n 20000 --repeats 5 --check
    python scripts/bench_enqueue.py --database-url postgresql://user@host/db

SPEC §1 asks enqueue_many to be at least 10x faster per job than a loop of
enqueue calls. Both sides insert the same N jobs (kind "bench_enqueue", args
{"i": i}) into a queue of their own, each in ONE transaction committed at the
end, so the figure compares the per-call cost, not commit durability. The Job
objects are built before the clock starts for both sides.

Without --database-url the script creates a database on 127.0.0.1:5432
(user postgres) and drops it at the end. With --database-url it migrates that
database (idempotent) and deletes the rows it inserted after each measurement.
The sides alternate (loop, many, loop, many, ...); medians are reported.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import psycopg2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

import awa_pool  # noqa: E402
from scriptdb import drop_database, fresh_database  # noqa: E402

KIND = "bench_enqueue"


def cleanup(url: str, queue: str) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for table in ("awa.jobs_hot", "awa.jobs_deferred", "awa.jobs_done"):
                cur.execute(f"DELETE FROM {table} WHERE queue = %s", (queue,))
            cur.execute("VACUUM awa.jobs_hot")
    finally:
        conn.close()


def time_loop(conn, jobs) -> float:
    t = time.perf_counter()
    for job in jobs:
        awa_pool.enqueue(conn, job)
    conn.commit()
    return time.perf_counter() - t


def time_many(conn, jobs) -> float:
    t = time.perf_counter()
    ids = awa_pool.enqueue_many(conn, jobs)
    conn.commit()
    elapsed = time.perf_counter() - t
    if len(ids) != len(jobs) or len(set(ids)) != len(jobs):
        raise SystemExit(f"enqueue_many returned {len(ids)} ids ({len(set(ids))} distinct) "
                         f"for {len(jobs)} jobs")
    return elapsed


def count_queued(url: str, queue: str) -> int:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM awa.jobs_hot WHERE queue = %s", (queue,))
            return cur.fetchone()[0]
    finally:
        conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", default=None,
                    help="database to use (default: a fresh database on postgresql://postgres@127.0.0.1:5432, "
                         "dropped afterwards)")
    ap.add_argument("--n", type=int, default=20000, help="jobs per measurement (default 20000)")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per side (default 3)")
    ap.add_argument("--check", action="store_true", help="exit 1 if enqueue_many is < 10x faster per job")
    args = ap.parse_args()

    own_db = args.database_url is None
    if own_db:
        server = "postgresql://postgres@127.0.0.1:5432/postgres"
        dbname = f"awa_bench_enqueue_{os.getpid()}"
        url = fresh_database(server, dbname, migrate=False)  # migrated below, as a given database is
    else:
        url = args.database_url
    try:
        conn = psycopg2.connect(url)
        awa_pool.migrate(conn)
        queues = {"loop": f"bench-enqueue-loop-{os.getpid()}", "many": f"bench-enqueue-many-{os.getpid()}"}
        timers = {"loop": time_loop, "many": time_many}
        # warm-up: plans, caches, the queue rows
        for side in ("loop", "many"):
            timers[side](conn, [awa_pool.Job(KIND, {"i": i}, queue=queues[side]) for i in range(500)])
            cleanup(url, queues[side])
        results = {"loop": [], "many": []}
        for rep in range(args.repeats):
            for side in ("loop", "many"):
                jobs = [awa_pool.Job(KIND, {"i": i}, queue=queues[side]) for i in range(args.n)]
                elapsed = timers[side](conn, jobs)
                got = count_queued(url, queues[side])
                if got != args.n:
                    raise SystemExit(f"{side}: expected {args.n} jobs in awa.jobs_hot, found {got}")
                results[side].append(elapsed)
                print(f"rep {rep + 1} {side:4s}: {args.n} jobs in {elapsed:.3f}s = "
                      f"{1e6 * elapsed / args.n:.1f} us/job ({args.n / elapsed:,.0f} jobs/s)", flush=True)
                cleanup(url, queues[side])
        conn.close()
    finally:
        if own_db:
            drop_database(server, dbname)

    loop_us = 1e6 * statistics.median(results["loop"]) / args.n
    many_us = 1e6 * statistics.median(results["many"]) / args.n
    ratio = loop_us / many_us
    print(f"\nawa_pool {awa_pool.__version__} from {os.path.dirname(awa_pool.__file__)}, "
          f"N={args.n}, median of {args.repeats}:")
    print(f"  enqueue loop (1 tx): {loop_us:8.1f} us/job  ({1e6 / loop_us:>10,.0f} jobs/s)")
    print(f"  enqueue_many (1 tx): {many_us:8.1f} us/job  ({1e6 / many_us:>10,.0f} jobs/s)")
    verdict = "meets" if ratio >= 10 else "does NOT meet"
    print(f"  ratio: enqueue_many is {ratio:.1f}x faster per job ({verdict} the >= 10x requirement)")
    return 1 if args.check and ratio < 10 else 0


if __name__ == "__main__":
    sys.exit(main())
