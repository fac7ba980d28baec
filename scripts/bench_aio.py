#!/usr/bin/env python3
"""Per-job cost of enqueueing from asyncio and from raw SQL, next to the sync API.

    python scripts/bench_aio.py                             # local server, own database
    python scripts/bench_aio.py --n 20000 --repeats 5 --check
    python scripts/bench_aio.py --database-url postgresql://user@host/db

Sides, measured in one run, interleaved (side after side, repeat after
repeat), medians reported:

  sync enqueue        awa_pool.enqueue in a loop, psycopg2
  sync enqueue_many   awa_pool.enqueue_many, psycopg2
  <driver> enqueue    awa_pool.aio.enqueue in a loop, awaited (psycopg 3 async, asyncpg)
  <driver> many       awa_pool.aio.enqueue_many
  raw INSERT          INSERT INTO awa.jobs (kind, args, queue) VALUES (...), (...) RETURNING id,
                      --raw-chunk rows a statement (1,000): with psycopg2's execute_values
                      (the rows as literals), and with asyncpg ($n parameters, three per
                      row, as a Node.js or Go producer sends them)
  raw INSERT unnest   INSERT INTO awa.jobs (kind, args, queue) SELECT * FROM unnest($1, $2, $3)
                      RETURNING id, asyncpg, three array parameters per statement
  bare VALUES         the asyncpg raw INSERT's statements into a plain temporary table
                      (kind, args, queue): what the statement form costs with no queue at all

Every side inserts the same jobs (kind "bench_aio", args {"i": i}, the Job
objects or the rows built before the clock starts) into a queue of its own,
in ONE transaction committed at the end, so the figures compare per-job
cost, not commit durability. The loops insert --loop-n jobs (they are ~30x
slower per job), the others --n.

SPEC §12's targets, checked with --check (exit 1 when missed):
aio.enqueue_many on each driver at >= 0.8x the rate of the sync
enqueue_many; the raw multi-row INSERT at >= 0.5x.

Without --database-url the script creates a database on 127.0.0.1:5432
(user postgres) and drops it at the end. With --database-url it migrates that
database (idempotent) and deletes the rows it inserted after each measurement.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import psycopg2
from psycopg2.extras import execute_values

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

import awa_pool  # noqa: E402
from awa_pool import aio  # noqa: E402
from scriptdb import drop_database, fresh_database  # noqa: E402

KIND = "bench_aio"
RAW_CHUNK = 1000   # rows per raw INSERT statement (--raw-chunk)
TARGETS = {"many": 0.8, "raw": 0.5}   # x the sync enqueue_many rate


def cleanup(url: str, queue: str) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for table in ("awa.jobs_hot", "awa.jobs_deferred", "awa.jobs_done"):
                cur.execute(f"DELETE FROM {table} WHERE queue = %s", (queue,))
            cur.execute("VACUUM awa.jobs_hot")
            cur.execute("VACUUM awa.jobs_inbox")
    finally:
        conn.close()


def count_queued(url: str, queue: str) -> int:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM awa.jobs_hot WHERE queue = %s", (queue,))
            return cur.fetchone()[0]
    finally:
        conn.close()


def jobs_for(queue: str, n: int) -> List[awa_pool.Job]:
    return [awa_pool.Job(KIND, {"i": i}, queue=queue) for i in range(n)]


# -- the sides: each returns (seconds, ids) for n jobs in one transaction ------------

def sync_loop(url: str, queue: str, n: int) -> tuple:
    jobs = jobs_for(queue, n)
    conn = psycopg2.connect(url)
    try:
        t = time.perf_counter()
        ids = [awa_pool.enqueue(conn, job) for job in jobs]
        conn.commit()
        return time.perf_counter() - t, ids
    finally:
        conn.close()


def sync_many(url: str, queue: str, n: int) -> tuple:
    jobs = jobs_for(queue, n)
    conn = psycopg2.connect(url)
    try:
        t = time.perf_counter()
        ids = awa_pool.enqueue_many(conn, jobs)
        conn.commit()
        return time.perf_counter() - t, ids
    finally:
        conn.close()


def raw_insert(url: str, queue: str, n: int) -> tuple:
    rows = [(KIND, f'{{"i": {i}}}', queue) for i in range(n)]
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            t = time.perf_counter()
            ids = execute_values(cur, "INSERT INTO awa.jobs (kind, args, queue) VALUES %s RETURNING id", rows,
                                 page_size=RAW_CHUNK, fetch=True)
            conn.commit()
            return time.perf_counter() - t, [row[0] for row in ids]
    finally:
        conn.close()


async def _psycopg_async(url: str, queue: str, n: int, many: bool) -> tuple:
    import psycopg

    jobs = jobs_for(queue, n)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        t = time.perf_counter()
        ids = await aio.enqueue_many(conn, jobs) if many else [await aio.enqueue(conn, job) for job in jobs]
        await conn.commit()
        return time.perf_counter() - t, ids


async def _asyncpg(url: str, queue: str, n: int, many: bool) -> tuple:
    import asyncpg

    jobs = jobs_for(queue, n)
    conn = await asyncpg.connect(url)
    try:
        t = time.perf_counter()
        async with conn.transaction():
            ids = await aio.enqueue_many(conn, jobs) if many else [await aio.enqueue(conn, job) for job in jobs]
        return time.perf_counter() - t, ids
    finally:
        await conn.close()


async def _raw_asyncpg(url: str, queue: str, n: int, target: str = "awa.jobs") -> tuple:
    import asyncpg

    chunks = []
    for start in range(0, n, RAW_CHUNK):
        size = min(RAW_CHUNK, n - start)
        values = ", ".join(f"(${3 * i + 1}, ${3 * i + 2}, ${3 * i + 3})" for i in range(size))
        params = [value for i in range(start, start + size) for value in (KIND, f'{{"i": {i}}}', queue)]
        chunks.append((f"INSERT INTO {target} (kind, args, queue) VALUES {values} RETURNING id", params))
    conn = await asyncpg.connect(url)
    try:
        if target != "awa.jobs":   # the floor: the same statements into a table of no queue
            await conn.execute(f"CREATE TEMP TABLE {target} (id bigserial, kind text, args jsonb, queue text)")
        t = time.perf_counter()
        ids = []
        async with conn.transaction():
            for statement, params in chunks:
                ids += [row[0] for row in await conn.fetch(statement, *params)]
        return time.perf_counter() - t, ids
    finally:
        await conn.close()


async def _raw_unnest(url: str, queue: str, n: int) -> tuple:
    import asyncpg

    statement = ("INSERT INTO awa.jobs (kind, args, queue) SELECT * FROM unnest($1::text[], $2::jsonb[], "
                 "$3::text[]) RETURNING id")
    chunks = [([KIND] * min(RAW_CHUNK, n - start), [f'{{"i": {i}}}' for i in range(start, min(start + RAW_CHUNK, n))],
               [queue] * min(RAW_CHUNK, n - start)) for start in range(0, n, RAW_CHUNK)]
    conn = await asyncpg.connect(url)
    try:
        t = time.perf_counter()
        ids = []
        async with conn.transaction():
            for kinds, args, queues in chunks:
                ids += [row[0] for row in await conn.fetch(statement, kinds, args, queues)]
        return time.perf_counter() - t, ids
    finally:
        await conn.close()


def on_loop(run: Callable, many: bool) -> Callable[[str, str, int], tuple]:
    return lambda url, queue, n: asyncio.run(run(url, queue, n, many))


SIDES: Dict[str, Callable[[str, str, int], tuple]] = {
    "sync enqueue": sync_loop,
    "sync enqueue_many": sync_many,
    "psycopg3-async enqueue": on_loop(_psycopg_async, many=False),
    "psycopg3-async many": on_loop(_psycopg_async, many=True),
    "asyncpg enqueue": on_loop(_asyncpg, many=False),
    "asyncpg many": on_loop(_asyncpg, many=True),
    "raw INSERT psycopg2": raw_insert,
    "raw INSERT asyncpg": lambda url, queue, n: asyncio.run(_raw_asyncpg(url, queue, n)),
    "raw INSERT unnest": lambda url, queue, n: asyncio.run(_raw_unnest(url, queue, n)),
    "bare VALUES": lambda url, queue, n: asyncio.run(_raw_asyncpg(url, queue, n, target="bench_plain")),
}


def main() -> int:
    global RAW_CHUNK
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", default=None,
                    help="database to use (default: a fresh database on postgresql://postgres@127.0.0.1:5432, "
                         "dropped afterwards)")
    ap.add_argument("--n", type=int, default=20000, help="jobs per bulk measurement (default 20000)")
    ap.add_argument("--loop-n", type=int, default=2000, help="jobs per loop measurement (default 2000)")
    ap.add_argument("--repeats", type=int, default=5, help="measurements per side (default 5)")
    ap.add_argument("--raw-chunk", type=int, default=RAW_CHUNK, help="rows per raw INSERT statement (default 1000)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target of SPEC §12 is missed")
    args = ap.parse_args()
    RAW_CHUNK = args.raw_chunk

    own_db = args.database_url is None
    server = "postgresql://postgres@127.0.0.1:5432/postgres"
    dbname = f"awa_bench_aio_{os.getpid()}"
    url = fresh_database(server, dbname, migrate=False) if own_db else args.database_url
    results: Dict[str, List[float]] = {side: [] for side in SIDES}
    try:
        conn = psycopg2.connect(url)
        awa_pool.migrate(conn)
        conn.commit()
        conn.close()
        queues = {side: f"bench-aio-{i}-{os.getpid()}" for i, side in enumerate(SIDES)}
        sizes = {side: args.loop_n if side.endswith(" enqueue") else args.n for side in SIDES}
        for side, run in SIDES.items():   # warm-up: plans, caches, the queue rows
            run(url, queues[side], 500)
            cleanup(url, queues[side])
        for rep in range(args.repeats):
            for side, run in SIDES.items():
                elapsed, ids = run(url, queues[side], sizes[side])
                if len(ids) != sizes[side] or len(set(ids)) != sizes[side] or ids != sorted(ids):
                    raise SystemExit(f"{side}: {len(ids)} ids ({len(set(ids))} distinct) for {sizes[side]} jobs")
                got = sizes[side] if side == "bare VALUES" else count_queued(url, queues[side])
                if got != sizes[side]:
                    raise SystemExit(f"{side}: expected {sizes[side]} jobs in awa.jobs_hot, found {got}")
                results[side].append(elapsed / sizes[side])
                print(f"rep {rep + 1} {side:24s} {sizes[side]:6d} jobs {1e6 * elapsed / sizes[side]:7.1f} us/job",
                      flush=True)
                cleanup(url, queues[side])
    finally:
        if own_db:
            drop_database(server, dbname)

    per_job = {side: statistics.median(values) for side, values in results.items()}
    best = {side: min(values) for side, values in results.items()}
    base, base_best = per_job["sync enqueue_many"], best["sync enqueue_many"]
    print(f"\nawa_pool {awa_pool.__version__}, Python {platform.python_version()}, "
          f"N={args.n} (loops {args.loop_n}, raw statements of {RAW_CHUNK} rows), {args.repeats} repeats:")
    print(f"  {'side':24s} {'us/job':>8s} {'jobs/s':>10s}  {'x sync many':>11s}   best: us/job  x sync many")
    missed = []
    for side, seconds in per_job.items():
        ratio, ratio_best = base / seconds, base_best / best[side]
        target = TARGETS["raw"] if side.startswith("raw") else TARGETS["many"] if side.endswith(" many") else None
        verdict = "" if target is None else f"   (target >= {target}x: {'met' if ratio >= target else 'MISSED'})"
        if target is not None and ratio < target:
            missed.append(side)
        print(f"  {side:24s} {1e6 * seconds:8.1f} {1 / seconds:10,.0f}  {ratio:10.2f}x   "
              f"{1e6 * best[side]:12.1f} {ratio_best:10.2f}x{verdict}")
    print("  (median of the repeats; the target is judged on the medians; best = the fastest repeat)")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
