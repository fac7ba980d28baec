#!/usr/bin/env python3
"""CPU each job costs, per process: supervisor, children, PostgreSQL.

    python scripts/cpu_per_job.py                         # 40,000 jobs, one child
    python scripts/cpu_per_job.py --jobs 80000 --workers 2 --repeats 3
    python scripts/cpu_per_job.py --source /path/to/other/checkout   # A/B two trees
    python scripts/cpu_per_job.py --jobs 800 --workers 2 --job-ms 25   # W3-like long jobs

Pre-enqueues --jobs no-op jobs (or jobs burning --job-ms of CPU each, to
see what long jobs cost outside the children), starts one supervisor (`awa_pool.Pool`) with
--workers children on them, and polls until every job is completed. The
CPU time (user + system, from /proc) of the supervisor process (all its
threads), of its children and of the PostgreSQL backends connected to the
database (its claim, completion, LISTEN and leader sessions) is read just
before the last job lands, and divided by the number of jobs; the part
spent before the first job started (start-up: imports, registration,
forking; a benchmark timed from the first handler's start does not pay it)
is also given. A rough
profile, Linux only: it needs /proc, and the backends must run on this
machine (a local server). It also reports the WAL each job wrote while
being enqueued and while being claimed and completed (the server's WAL
position before and after each phase, so anything else writing on the
server counts too; full-page images included).

--source runs the supervisor from another checkout (its awa_pool package
and schema), so two commits can be compared on the same machine, one run
after the other. The database is created on 127.0.0.1:5432 (user postgres)
unless --database-url names a server, and dropped at the end.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import psycopg2

HERE = Path(__file__).resolve().parent
# How often the progress query runs. It counts the finished jobs, about 2 ms
# of server CPU a time on a 2-vCPU VM (40 ms a second when it ran every
# 0.05 s, taken from the pool it measures). The CPU reading kept is taken
# at most this long after the last job finished.
POLL_S = 0.2


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wal_position(conn) -> str:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        return cur.fetchone()[0]


def wal_bytes(conn, start: str, end: str) -> float:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::float8", (end, start))
        return cur.fetchone()[0]


def children_of(pid: int) -> List[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


POOL = '''
import sys
sys.path.insert(0, sys.argv[4])
from scriptdb import use_checkout
use_checkout(sys.argv[3])
import awa_pool

@awa_pool.task("cpu_probe_noop")
def noop(**_):
    pass

@awa_pool.task("cpu_probe_burn")
def burn(ms, **_):
    import time
    end = time.process_time() + ms / 1000.0
    while time.process_time() < end:
        pass

awa_pool.Pool(sys.argv[1], workers=int(sys.argv[2]), queues=["cpu_probe"]).run()
'''


def one_run(url: str, source: str, jobs: int, workers: int, job_ms: float,
            timeout_s: float) -> Dict[str, float]:
    import awa_pool  # from --source: main() put it first on the path

    conn = psycopg2.connect(url)
    awa_pool.migrate(conn)
    enqueue_from = wal_position(conn)
    for start in range(0, jobs, 5000):
        awa_pool.enqueue_many(conn, [
            awa_pool.Job("cpu_probe_burn", {"i": i, "ms": job_ms}, queue="cpu_probe") if job_ms
            else awa_pool.Job("cpu_probe_noop", {"i": i}, queue="cpu_probe")
            for i in range(start, min(jobs, start + 5000))])
        conn.commit()
    conn.autocommit = True
    enqueue_to = wal_position(conn)
    cur = conn.cursor()
    cur.execute("VACUUM ANALYZE awa.jobs_hot")
    drain_from = wal_position(conn)
    cur.execute("SELECT current_database()")
    database = cur.fetchone()[0]

    pool = subprocess.Popen([sys.executable, "-c", POOL, url, str(workers), source, str(HERE)])
    roles: Dict[int, str] = {pool.pid: "supervisor"}
    last: Dict[int, float] = {}
    started_cpu: Dict[int, float] = {}   # the reading when the first job was seen started
    started = time.monotonic()
    try:
        while True:
            for pid in children_of(pool.pid):
                roles.setdefault(pid, "children")
            cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = "
                        "'client backend' AND pid <> pg_backend_pid()", (database,))
            for (pid,) in cur.fetchall():
                roles.setdefault(pid, "postgres")
            # Read every process before counting: the last reading before
            # the count reaches the total is the one that is kept.
            last = {pid: cpu_seconds(pid) for pid in roles}
            cur.execute("SELECT (SELECT count(*) FROM awa.jobs_done WHERE queue = 'cpu_probe'), "
                        "EXISTS (SELECT 1 FROM awa.jobs_hot WHERE queue = 'cpu_probe' AND state = 'running')")
            done, running = cur.fetchone()
            if not started_cpu and (done or running):
                started_cpu = dict(last)
            if done >= jobs:
                drain_to = wal_position(conn)
                break
            if pool.poll() is not None:
                raise SystemExit(f"the pool exited with status {pool.returncode}")
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"the pool did not complete {jobs} jobs within {timeout_s:.0f} s")
            time.sleep(POLL_S)
        elapsed = time.monotonic() - started
    finally:
        pool.terminate()
        pool.wait(timeout=60)
    per_job = {"supervisor": 0.0, "children": 0.0, "postgres": 0.0}
    for pid, seconds in last.items():
        per_job[roles[pid]] += seconds * 1e6 / jobs
    per_job["total"] = sum(per_job.values())
    # What start-up cost (imports, registration, forking, connecting) before
    # the first job ran: a benchmark timed from the first handler's start
    # (scripts/bench/driver.py timing) does not pay it.
    per_job["startup_outside"] = sum(seconds for pid, seconds in started_cpu.items()
                                     if roles[pid] != "children") * 1e6 / jobs
    per_job["outside_children"] = per_job["supervisor"] + per_job["postgres"]
    per_job["jobs_per_s"] = jobs / elapsed
    per_job["wal_enqueue"] = wal_bytes(conn, enqueue_from, enqueue_to) / jobs
    per_job["wal_drain"] = wal_bytes(conn, drain_from, drain_to) / jobs
    conn.close()
    return per_job


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=40_000)
    ap.add_argument("--workers", type=int, default=1, help="children of the one supervisor")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--job-ms", type=float, default=0.0,
                    help="each job burns this much CPU (default 0: no-op jobs)")
    ap.add_argument("--source", default=str(HERE.parent), help="checkout whose awa_pool runs")
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
                    help="server to create the scratch database on")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    if args.jobs < 1 or args.workers < 1 or args.repeats < 1:
        ap.error("--jobs, --workers and --repeats must be at least 1")
    if args.job_ms < 0:
        ap.error("--job-ms must be 0 or more")

    sys.path.insert(0, str(HERE))
    from scriptdb import measure_repeatedly, use_checkout

    use_checkout(args.source)  # before anything imports awa_pool
    measure_repeatedly(
        args.database_url, f"awa_cpu_probe_{os.getpid()}", args.repeats,
        lambda url: one_run(url, args.source, args.jobs, args.workers, args.job_ms, args.timeout),
        lambda r: (f"{r['jobs_per_s']:,.0f} jobs/s (from the pool's start); CPU per job: supervisor "
                   f"{r['supervisor']:.1f} us, children {r['children']:.1f} us, PostgreSQL "
                   f"{r['postgres']:.1f} us, total {r['total']:.1f} us; outside the children "
                   f"{r['outside_children']:.1f} us ({r['startup_outside']:.1f} us of it before the first "
                   f"job started); WAL per job: enqueue {r['wal_enqueue']:,.0f} B, "
                   f"claim and completion {r['wal_drain']:,.0f} B"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
