"""awa_pool adapter (psycopg2, pre-fork process pool).

Producer: awa_pool.enqueue(conn, Job) + COMMIT per job (default durability,
synchronous_commit untouched) and awa_pool.enqueue_many(conn, jobs) + COMMIT
per chunk.
Worker: one awa_pool.Pool (a supervisor plus `workers` forked children) per
harness process; the supervisor drains on SIGTERM by itself (its children
ignore SIGTERM, so the harness's group-wide SIGTERM is harmless).

Counting reads awa's own tables directly:
  completed / failed / cancelled   awa.jobs_done (partitioned; its
                                   (queue, state, finalized_at) index)
  queued                           awa.jobs_hot (available + running) plus
                                   awa.jobs_deferred (scheduled + retryable)

Worker settings (cfg keys, all optional except processes):
  processes     harness processes, each running its own Pool (supervisor)
  workers       children per supervisor
  queue_specs   list of CLI queue specs; default: the harness's queue names
  weights       {queue: weight}, turned into "name=weight" specs
  pool_options  extra keyword arguments for awa_pool.Pool (e.g. poll_interval)
  profile       path prefix: run the supervisor under cProfile and dump its
                stats to PREFIX.<pid> (diagnosis only; slows it down)
  log_level     logging level of the worker process (default WARNING)
"""
from __future__ import annotations

import logging
import os
import subprocess

import psycopg2

import awa_pool
import benchlib

KIND = "bench"


def version() -> str:
    v = awa_pool.__version__
    # Record which source was measured (the package is installed editable,
    # from the checkout or from bench.sh's AWA_POOL_REF snapshot).
    root = os.path.dirname(os.path.dirname(os.path.abspath(awa_pool.__file__)))
    marker = os.path.join(root, "BENCH_SOURCE")
    if os.path.exists(marker):
        with open(marker) as f:
            return f"{v}+g{f.read().strip()[:7]}"
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain",
                                "--", "awa_pool", "schema"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        if rev:
            v += f"+g{rev}" + (".dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return v


def prepare(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        awa_pool.migrate(conn)  # commits by itself
    finally:
        conn.close()


def count_jobs(conn, queues) -> dict:
    qs = list(queues)
    with conn.cursor() as cur:
        # jobs_done is list-partitioned by segment; the (queue, state, finalized_at)
        # index on every partition answers this without touching other queues.
        cur.execute("SELECT state::text, count(*) FROM awa.jobs_done "
                    "WHERE queue = ANY(%s) GROUP BY 1", (qs,))
        done = dict(cur.fetchall())
        cur.execute("SELECT state::text, count(*) FROM awa.jobs_hot "
                    "WHERE queue = ANY(%s) GROUP BY 1", (qs,))
        hot = dict(cur.fetchall())
        cur.execute("SELECT state::text, count(*) FROM awa.jobs_deferred "
                    "WHERE queue = ANY(%s) AND state IN ('scheduled', 'retryable') GROUP BY 1",
                    (qs,))
        deferred = dict(cur.fetchall())
    raw = {**done, **hot, **deferred}
    return {"completed": done.get("completed", 0),
            "queued": sum(hot.values()) + sum(deferred.values()),
            "failed": done.get("failed", 0) + done.get("cancelled", 0),
            "raw": raw}


def final_counts(conn, queues) -> dict:
    """Post-run cross-check: the cheap counts plus a check that no job id sits
    in two of awa's tables at once, and the attempts the completed jobs used."""
    counts = count_jobs(conn, queues)
    qs = list(queues)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) - count(DISTINCT id) FROM awa.jobs WHERE queue = ANY(%s)", (qs,))
        counts["ids_in_two_tables"] = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM awa.jobs WHERE queue = ANY(%s) "
                    "AND state = 'waiting_external'", (qs,))
        counts["waiting_external"] = cur.fetchone()[0]
        cur.execute("SELECT attempt, count(*) FROM awa.jobs_done "
                    "WHERE queue = ANY(%s) AND state = 'completed' GROUP BY 1", (qs,))
        counts["completed_by_attempt"] = {str(a): n for a, n in cur.fetchall()}
    return counts


def worker_config(workload: str) -> dict:
    # Chosen by measurement on the 2-core machine (docs/benchmarks.md says
    # why). Override with run.py --cfg 'awa_pool={...}'.
    if workload == "W2":    # no-op drain: two supervisors with one child each overlap
        return {"processes": 2, "workers": 1}  # one's SQL with the other's child work
    if workload == "W3":    # CPU-bound: one child per core
        return {"processes": 1, "workers": 2}
    if workload == "W4":    # latency: one idle supervisor on LISTEN, small pool
        return {"processes": 1, "workers": 2}
    if workload == "W5":    # 20 ms sleep jobs, weights 2:1; 15 children -> 10 hi / 5 lo
        return {"processes": 1, "workers": 15, "weights": {"hi": 2, "lo": 1}}
    return {"processes": 1, "workers": 2}  # W1a/W1b start no worker


def _job(payload: dict, queue: str) -> awa_pool.Job:
    return awa_pool.Job(KIND, payload, queue=queue)


class Producer:
    """One connection in autocommit: each enqueue call is its own transaction,
    committed (durably, default synchronous_commit) by the statement itself,
    as the peers' adapters do; a bulk chunk is one statement, so one
    transaction too."""

    def open(self, dsn: str) -> None:
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True

    def enqueue(self, payload: dict, queue: str) -> None:
        awa_pool.enqueue(self.conn, _job(payload, queue))

    def enqueue_batch(self, payloads: list, queue: str) -> None:
        awa_pool.enqueue_many(self.conn, [_job(p, queue) for p in payloads])

    def close(self) -> None:
        self.conn.close()


def _queue_specs(queues: list, cfg: dict) -> list:
    if cfg.get("queue_specs"):
        return list(cfg["queue_specs"])
    weights = cfg.get("weights") or {}
    return [f"{q}={weights[q]}" if q in weights else q for q in queues]


def run_worker(dsn: str, queues: list, cfg: dict) -> None:
    logging.basicConfig(level=getattr(logging, str(cfg.get("log_level", "WARNING")).upper()),
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")

    # Registered in this (supervisor) process before Pool.run forks, so every
    # child inherits the handler. Args arrive as keyword arguments.
    @awa_pool.task(KIND)
    def bench(**args) -> None:
        benchlib.handle(args)

    pool = awa_pool.Pool(dsn, workers=int(cfg.get("workers", 2)),
                         queues=_queue_specs(queues, cfg), **(cfg.get("pool_options") or {}))
    profile_to = cfg.get("profile")  # optional: cProfile the supervisor into this file
    if not profile_to:
        pool.run()  # returns after SIGTERM: drain, then stop
        return
    import cProfile

    prof = cProfile.Profile()
    try:
        prof.runcall(pool.run)
    finally:
        prof.dump_stats(f"{profile_to}.{os.getpid()}")
