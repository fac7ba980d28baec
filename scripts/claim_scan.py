"""What a claim costs as a backlog drains: from the front of the queue, or
from a cursor past the last claim (migration 0021).

Builds two equal backlogs (queues 'front' and 'cursor') in a fresh database
and drains them side by side in one session, 64 jobs a claim and a
completion after each, so both see the same autovacuum and the same load.
Prints the mean claim time every 50,000 jobs and at the end.

    python scripts/claim_scan.py                       # 1M jobs each, 300,000 drained
    python scripts/claim_scan.py --depth 200000 --drain 100000

Needs PostgreSQL (--server, default postgresql://postgres@127.0.0.1:5432/postgres);
creates and drops the database awa_claim_scan.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "bench")]

import psycopg2  # noqa: E402

import scale_build as build  # noqa: E402
import scriptdb  # noqa: E402
from awa_pool.worker.fetcher import advance, claim  # noqa: E402

BATCH = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=1_000_000, help="jobs in each backlog")
    parser.add_argument("--drain", type=int, default=300_000, help="jobs to drain from each")
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    dsn = scriptdb.fresh_database(args.server, "awa_claim_scan")
    conn = psycopg2.connect(dsn, options="-c jit=off")
    try:
        build.add_available(conn, "front", args.depth)
        build.add_available(conn, "cursor", args.depth, first=args.depth)
        build.vacuum(conn, "awa.jobs_hot")
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("INSERT INTO awa.supervisors (hostname, pid, version, queues, workers) "
                    "VALUES ('claim_scan', 1, '-', '{front,cursor}', 1) RETURNING id")
        supervisor = cur.fetchone()[0]
        times = {"front": [], "cursor": []}
        cursor, drained = None, 0
        while drained < args.drain:
            for queue in ("front", "cursor"):
                started = time.perf_counter()
                jobs = claim(cur, queue=queue, limit=BATCH, supervisor_id=supervisor, aging_s=0,
                             after=cursor if queue == "cursor" else None)
                times[queue].append(time.perf_counter() - started)
                if queue == "cursor":
                    cursor = advance(cursor, jobs)
                cur.execute("SELECT awa.complete_jobs(%s::bigint[], %s::bigint[], %s::real[], %s::real[], "
                            "%s::bigint[], '{}'::jsonb)",
                            ([j.id for j in jobs], [j.lease for j in jobs], [0.0] * len(jobs),
                             [0.0] * len(jobs), [0] * len(jobs)))
            drained += len(jobs)
            if drained % 50_000 < BATCH:
                print(f"  {drained:>9,} drained: last 100 claims from the front "
                      f"{1000 * statistics.mean(times['front'][-100:]):.2f} ms, with a cursor "
                      f"{1000 * statistics.mean(times['cursor'][-100:]):.2f} ms", flush=True)
        for queue, label in (("front", "from the front"), ("cursor", "with a cursor")):
            t = times[queue]
            print(f"depth {args.depth:,}, {drained:,} drained, claim of {BATCH} {label}: mean "
                  f"{1000 * statistics.mean(t):.2f} ms, median {1000 * statistics.median(t):.2f} ms, "
                  f"p99 {1000 * statistics.quantiles(t, n=100)[98]:.2f} ms")
    finally:
        conn.close()
        scriptdb.drop_database(args.server, "awa_claim_scan")


if __name__ == "__main__":
    main()
