#!/usr/bin/env python3
"""Where a bulk-enqueued job's time goes (the benchmark's W1b, in pieces).

    python scripts/enqueue_parts.py                  # 20,000 jobs, 5 repetitions
    python scripts/enqueue_parts.py --jobs 50000 --repeats 3

Per job, median of the repetitions: building the `Job` (W1b's payload
{"seq": i, "loops": 0}); the JSON `enqueue_many` sends for it, as an
element of the array of whole jobs and as an element of the array of args
alone; and four ways to put 1,000 jobs into awa.jobs_hot in one autocommit
statement each: `awa.insert_uniform_jobs` (what enqueue_many runs for a
chunk of one shape, such as W1b's), `awa.insert_ready_jobs` (its path for
ready jobs of several shapes), a bare `INSERT ... SELECT FROM
jsonb_to_recordset` of the same columns, and a `COPY`. The last two are
floors for comparison, not paths awa_pool offers: a producer role may not
write the table directly. The
database is created on 127.0.0.1:5432 (user postgres) unless
--database-url names another server, and dropped at the end.
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

import psycopg2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

from awa_pool import Job  # noqa: E402
from awa_pool.core.sql import QUERIES  # noqa: E402
from scriptdb import drop_database, fresh_database  # noqa: E402

CHUNK = 1000
BARE_INSERT = """
    INSERT INTO awa.jobs_hot (kind, queue, args, state, priority, max_attempts, timeout_s, tags,
                              metadata, lane, ordering_key, batch_id)
    SELECT x.kind, coalesce(x.queue, 'default'), coalesce(x.args, '{}'), 'available',
           coalesce(x.priority, 2), coalesce(x.max_attempts, 25), x.timeout_s,
           coalesce(x.tags, '{}'), coalesce(x.metadata, '{}'), 0, x.ordering_key, NULL
      FROM jsonb_to_recordset(%(jobs)s::jsonb) AS x(
               kind text, args jsonb, queue text, priority integer, max_attempts integer,
               timeout_s double precision, tags text[], metadata jsonb, ordering_key text)
    RETURNING id"""


def per_job_us(started: float, jobs: int) -> float:
    return (time.perf_counter() - started) / jobs * 1e6


def one_repetition(cur, jobs: int) -> dict:
    result = {}
    started = time.perf_counter()
    built = [Job("bench_noop", {"seq": i, "loops": 0}, queue="bench") for i in range(jobs)]
    result["Job()"] = per_job_us(started, jobs)
    started = time.perf_counter()
    chunks = ["[" + ",".join([job.insert_element() for job in built[i:i + CHUNK]]) + "]"
              for i in range(0, jobs, CHUNK)]
    result["JSON element"] = per_job_us(started, jobs)
    started = time.perf_counter()
    args_chunks = ["[" + ",".join([job.args_json for job in built[i:i + CHUNK]]) + "]"
                   for i in range(0, jobs, CHUNK)]
    result["JSON args only"] = per_job_us(started, jobs)

    def statement(sql: str, params: dict) -> None:
        cur.execute(sql, params)
        cur.fetchall()

    def copy(start: int) -> None:
        rows = "".join(f"bench_noop\tbench\t{job.args_json}\n" for job in built[start:start + CHUNK])
        cur.copy_expert("COPY awa.jobs_hot (kind, queue, args) FROM STDIN", io.StringIO(rows))

    ways = {
        "insert_uniform_jobs": lambda i: statement(QUERIES["insert_uniform_jobs"], {
            "kind": "bench_noop", "queue": "bench", "priority": 2, "max_attempts": 25,
            "timeout_s": None, "args": args_chunks[i // CHUNK], "batch_id": None}),
        "insert_ready_jobs": lambda i: statement(QUERIES["insert_ready_jobs"],
                                                 {"jobs": chunks[i // CHUNK], "batch_id": None}),
        "bare INSERT": lambda i: statement(BARE_INSERT, {"jobs": chunks[i // CHUNK]}),
        "COPY": copy,
    }
    for name, write in ways.items():
        started = time.perf_counter()
        for i in range(0, jobs, CHUNK):
            write(i)
        result[name] = per_job_us(started, jobs)
        cur.execute("TRUNCATE awa.jobs_hot")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    name = f"awa_enqueue_parts_{os.getpid()}"
    url = fresh_database(args.database_url, name)
    try:
        conn = psycopg2.connect(url)
        conn.autocommit = True
        with conn.cursor() as cur:
            runs = [one_repetition(cur, args.jobs) for _ in range(args.repeats)]
        conn.close()
    finally:
        drop_database(args.database_url, name)
    for key in runs[0]:
        values = [run[key] for run in runs]
        print(f"{key:20s} {statistics.median(values):6.2f} us per job "
              f"({min(values):.2f}-{max(values):.2f})")
    for json_part, insert in (("JSON args only", "insert_uniform_jobs"), ("JSON element", "insert_ready_jobs")):
        per_job = statistics.median(r["Job()"] + r[json_part] + r[insert] for r in runs)
        print(f"Job() + {json_part} + {insert}: {1e6 / per_job:,.0f} jobs/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
