"""Limit row for W1a and W1b: enqueueing with no queue library at all.

Not a job queue: the floor a Postgres queue's producer cannot go below on
this machine. The table `bare.jobs` has awa_pool's hot table's shape
(schema/current.sql, awa.jobs_hot: the same columns, defaults, checks,
indexes and storage options), so every row costs the same heap and index
writes as one of awa_pool's enqueued jobs. What is left out is what a queue
adds: the function call, the NOTIFY that wakes a worker, unique keys,
shards, batches.

* W1a, `enqueue`: `INSERT INTO bare.jobs (kind, queue, args) VALUES (...)
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

import psycopg2
import psycopg2.extras

# awa.jobs_hot as schema/current.sql builds it, under another name.
SCHEMA = """
CREATE SCHEMA bare;
CREATE TYPE bare.job_state AS ENUM (
    'scheduled', 'available', 'running', 'retryable', 'waiting_external',
    'completed', 'failed', 'cancelled');
CREATE SEQUENCE bare.job_id_seq;
CREATE TABLE bare.jobs (
    id                  bigint      NOT NULL DEFAULT nextval('bare.job_id_seq'),
    kind                text        NOT NULL,
    queue               text        NOT NULL DEFAULT 'default',
    args                jsonb       NOT NULL DEFAULT '{}',
    state               bare.job_state NOT NULL DEFAULT 'available',
    priority            smallint    NOT NULL DEFAULT 2,
    run_at              timestamptz NOT NULL DEFAULT now(),
    created_at          timestamptz NOT NULL DEFAULT now(),
    attempt             integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL DEFAULT 25,
    lease               bigint      NOT NULL DEFAULT 0,
    timeout_s           double precision,
    tags                text[]      NOT NULL DEFAULT '{}',
    metadata            jsonb       NOT NULL DEFAULT '{}',
    unique_key          bytea,
    lane                smallint    NOT NULL DEFAULT 0,
    ordering_key        text,
    batch_id            bigint,
    supervisor_id       bigint,
    attempted_at        timestamptz,
    deadline            timestamptz,
    finalized_at        timestamptz,
    crashes             integer     NOT NULL DEFAULT 0,
    errors              jsonb,
    attempt_log         jsonb,
    wall_s              real,
    cpu_s               real,
    peak_rss            bigint,
    progress            jsonb,
    result              jsonb,
    callback_id         uuid,
    callback_timeout_at timestamptz,
    callback_result     jsonb,
    dead_lettered       boolean     NOT NULL DEFAULT false,
    CONSTRAINT jobs_kind_len CHECK (length(kind) BETWEEN 1 AND 200),
    CONSTRAINT jobs_queue_len CHECK (length(queue) BETWEEN 1 AND 200),
    CONSTRAINT jobs_priority CHECK (priority BETWEEN 1 AND 4),
    CONSTRAINT jobs_max_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT jobs_args_object CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT jobs_metadata_object CHECK (jsonb_typeof(metadata) = 'object'),
    CONSTRAINT jobs_pkey PRIMARY KEY (id),
    CONSTRAINT jobs_state CHECK (state IN ('available', 'running'))
) WITH (
    fillfactor = 85,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);
CREATE INDEX jobs_claim ON bare.jobs (queue, lane, priority, run_at, id) WHERE state = 'available';
CREATE INDEX jobs_running ON bare.jobs (supervisor_id) WHERE state = 'running';
CREATE INDEX jobs_callback ON bare.jobs (callback_id) WHERE callback_id IS NOT NULL;
"""

KIND = "bench"


def version() -> str:
    return f"psycopg2 {importlib.metadata.version('psycopg2-binary')}"


def prepare(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(SCHEMA)
    finally:
        conn.close()


def count_jobs(conn, queues) -> dict:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM bare.jobs WHERE queue = ANY(%s)", (list(queues),))
        queued = cur.fetchone()[0]
    return {"completed": 0, "queued": queued, "failed": 0}


def worker_config(workload: str) -> dict:
    return {"processes": 0}  # enqueue only


class Producer:
    def open(self, dsn: str) -> None:
        self.conn = psycopg2.connect(dsn)
        self.cur = self.conn.cursor()

    def enqueue(self, payload: dict, queue: str) -> None:
        self.cur.execute("INSERT INTO bare.jobs (kind, queue, args) VALUES (%s, %s, %s) RETURNING id",
                         (KIND, queue, json.dumps(payload)))
        self.cur.fetchone()
        self.conn.commit()

    def enqueue_batch(self, payloads: list, queue: str) -> None:
        psycopg2.extras.execute_values(
            self.cur, "INSERT INTO bare.jobs (kind, queue, args) VALUES %s RETURNING id",
            [(KIND, queue, json.dumps(p)) for p in payloads], template="(%s, %s, %s::jsonb)",
            page_size=len(payloads), fetch=True)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def run_worker(dsn: str, queues: list, cfg: dict) -> None:
    raise RuntimeError("sql_bare is an enqueue-only limit row (W1a, W1b): it has no worker")
