#!/usr/bin/env python3
"""PostgreSQL CPU per job of the claim and of the completion, by batch size.

    python scripts/pg_cost.py                       # claims of 20, flushes of 40
    python scripts/pg_cost.py --claim 1 --flush 1 --jobs 5000
    python scripts/pg_cost.py --claim 200 --flush 200 --repeats 3
    python scripts/pg_cost.py --source /path/to/other/checkout   # A/B two schemas

No supervisor and no Python handlers: one session claims --claim jobs at a
time with the supervisor's own claim statement, another completes them
--flush at a time with the completer's statements (complete_job for a flush
of one, complete_jobs otherwise, the same array literals), and a third
vacuums jobs_hot at the leader's threshold. Each session's backend CPU
(user + system, from /proc: a local server) is divided by the jobs done,
so the figure is what PostgreSQL spends per job at that batch size, the
cost that decides how a paced load (small batches) compares with a flood.
The database is created on 127.0.0.1:5432 (user postgres) unless
--database-url names another local server, and dropped at the end.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Dict

import psycopg2

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cpu_per_job import cpu_seconds  # noqa: E402


def session(url: str):
    conn = psycopg2.connect(url)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("SET synchronous_commit = off")  # as the supervisor's sessions run
    cur.execute("SELECT pg_backend_pid()")
    return conn, cur, cur.fetchone()[0]


def one_run(url: str, jobs: int, claim_size: int, flush_size: int) -> Dict[str, float]:
    import awa_pool
    from awa_pool.worker import fetcher
    from awa_pool.worker.completer import Completer
    from awa_pool.worker.maintenance import VacuumQueueTables
    from awa_pool.worker.protocol import Outcome
    from awa_pool.core.sql import QUERIES

    producer = psycopg2.connect(url)
    awa_pool.migrate(producer)
    for start in range(0, jobs, 5000):
        awa_pool.enqueue_many(producer, [awa_pool.Job("pg_cost", {"i": i}, queue="pg_cost")
                                         for i in range(start, min(jobs, start + 5000))])
        producer.commit()
    producer.autocommit = True
    producer.cursor().execute("VACUUM ANALYZE awa.jobs_hot")
    producer.close()

    claim_conn, claim_cur, claim_pid = session(url)
    done_conn, done_cur, done_pid = session(url)
    vacuum_conn, vacuum_cur, vacuum_pid = session(url)
    vacuum = VacuumQueueTables()
    completer = Completer(max_crashes=3)
    before = {pid: cpu_seconds(pid) for pid in (claim_pid, done_pid, vacuum_pid)}
    completed = claims = 0
    pending = []
    while True:
        rows = fetcher.claim(claim_cur, queue="pg_cost", limit=claim_size, supervisor_id=1, aging_s=60.0)
        claims += 1
        pending += [Outcome(job.id, job.lease, "completed", wall_s=0.000123, cpu_s=0.000101,
                            peak_rss=12_345_678) for job in rows]
        while len(pending) >= flush_size or (pending and not rows):
            for outcome in pending[:flush_size]:
                completer.add(outcome)
            del pending[:flush_size]
            completed += len(completer.flush(done_cur))
        if not rows:
            break
        if claims % 50 == 0:
            vacuum.tick(vacuum_cur)
    vacuum_cur.execute(QUERIES["vacuum_jobs_hot"])
    after = {pid: cpu_seconds(pid) for pid in before}
    for conn in (claim_conn, done_conn, vacuum_conn):
        conn.close()
    if completed != jobs:
        raise SystemExit(f"completed {completed} of {jobs} jobs")
    cost = {name: (after[pid] - before[pid]) * 1e6 / jobs
            for name, pid in (("claim", claim_pid), ("complete", done_pid), ("vacuum", vacuum_pid))}
    cost["total"] = sum(cost.values())
    return cost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=40_000)
    ap.add_argument("--claim", type=int, default=20, help="jobs per claim")
    ap.add_argument("--flush", type=int, default=40, help="jobs per completion flush")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--source", default=str(HERE.parent), help="checkout whose awa_pool and schema run")
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
                    help="server to create the scratch database on")
    args = ap.parse_args()
    if min(args.jobs, args.claim, args.flush, args.repeats) < 1:
        ap.error("--jobs, --claim, --flush and --repeats must be at least 1")
    from scriptdb import measure_repeatedly, use_checkout

    use_checkout(args.source)  # before anything imports awa_pool
    measure_repeatedly(
        args.database_url, f"awa_pg_cost_{os.getpid()}", args.repeats,
        lambda url: one_run(url, args.jobs, args.claim, args.flush),
        lambda c: (f"claims of {args.claim}, flushes of {args.flush}: PostgreSQL CPU per job: claim "
                   f"{c['claim']:.1f} us, completion {c['complete']:.1f} us, vacuum {c['vacuum']:.1f} us, "
                   f"total {c['total']:.1f} us"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
