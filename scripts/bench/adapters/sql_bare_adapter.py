"""Limit row for W1a and W1b: enqueueing with no queue library at all.

Not a job queue: the floor a Postgres queue's producer cannot go below on
this machine. The table `bare.jobs_hot` is awa_pool's hot table as
schema/current.sql defines it (read from that file at prepare time: the
same columns, defaults, checks, indexes and storage options), so every row
costs the same heap and index writes as one of awa_pool's enqueued jobs. What is left out is what a queue
adds: the function call, the NOTIFY that wakes a worker, unique keys,
shards, batches.

* W1a, `enqueue`: `INSERT INTO bare.jobs_hot (kind, queue, args) VALUES (...)
  RETURNING id` then `COMMIT`, one psycopg2 round trip each (default
  durability: synchronous_commit untouched), the shape of awa_pool.enqueue
  (one job, its id back, committed).
* W1b, `enqueue_batch`: one multi-row `INSERT ... VALUES (...), (...), ...
  RETURNING id` of the whole chunk (1,000 rows), then `COMMIT`.

`count_jobs` counts the table's rows (all `available`: nothing claims them).
There is no worker: run.py runs this row for W1a and W1b only.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re

import psycopg2
import psycopg2.extras

CURRENT_SQL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "schema",
                           "current.sql")


def hot_table_ddl(path: str = CURRENT_SQL) -> str:
    """awa.jobs_hot as schema/current.sql builds it (its state type, id
    sequence, table with checks and storage options, and indexes), moved to
    schema `bare`: read from the file, so the limit row keeps the shape of
    the table awa_pool really writes."""
    with open(path) as f:
        text = f.read()
    parts = [re.search(r"CREATE TYPE awa\.job_state AS ENUM \(.*?\);", text, re.S),
             re.search(r"CREATE SEQUENCE awa\.job_id_seq;", text),
             re.search(r"CREATE TABLE awa\.jobs_hot \(.*?\n\) WITH \(.*?\n\);", text, re.S)]
    parts += list(re.finditer(r"CREATE INDEX \w+ ON awa\.jobs_hot .*?;", text, re.S))
    if not all(parts) or len(parts) < 4:
        raise RuntimeError(f"cannot find awa.jobs_hot's definition in {path}")
    return "CREATE SCHEMA bare;\n" + "\n".join(m.group(0) for m in parts).replace("awa.", "bare.")


KIND = "bench"


def version() -> str:
    return f"psycopg2 {importlib.metadata.version('psycopg2-binary')}"


def prepare(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(hot_table_ddl())
    finally:
        conn.close()


def count_jobs(conn, queues) -> dict:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM bare.jobs_hot WHERE queue = ANY(%s)", (list(queues),))
        queued = cur.fetchone()[0]
    return {"completed": 0, "queued": queued, "failed": 0}


def worker_config(workload: str) -> dict:
    return {"processes": 0}  # enqueue only


class Producer:
    def open(self, dsn: str) -> None:
        self.conn = psycopg2.connect(dsn)
        self.cur = self.conn.cursor()

    def enqueue(self, payload: dict, queue: str) -> None:
        self.cur.execute("INSERT INTO bare.jobs_hot (kind, queue, args) VALUES (%s, %s, %s) RETURNING id",
                         (KIND, queue, json.dumps(payload)))
        self.cur.fetchone()
        self.conn.commit()

    def enqueue_batch(self, payloads: list, queue: str) -> None:
        psycopg2.extras.execute_values(
            self.cur, "INSERT INTO bare.jobs_hot (kind, queue, args) VALUES %s RETURNING id",
            [(KIND, queue, json.dumps(p)) for p in payloads], template="(%s, %s, %s::jsonb)",
            page_size=len(payloads), fetch=True)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def run_worker(dsn: str, queues: list, cfg: dict) -> None:
    raise RuntimeError("sql_bare is an enqueue-only limit row (W1a, W1b): it has no worker")
