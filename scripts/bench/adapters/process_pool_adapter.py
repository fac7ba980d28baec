"""Limit row for W6: the same job bodies with no queue at all.

`concurrent.futures.ProcessPoolExecutor(2)` maps `benchlib.handle` over the
list of W6 payloads (`executor.map`, default chunksize 1, processes forked
on this 2-core machine): what CPU-bound Python can do here when nothing is
claimed, stored or acknowledged. Nothing is durable and nothing survives a
crash: it is the ceiling, not a peer.

The driver calls `run_direct(payloads)` instead of enqueueing and starting
workers; it returns how many bodies the executor reports as returned, which
stands in for a queue's completed count. The handler's per-execution records
give the exactly-once check and the timed window (first body start to the
last result), as for every queue. run.py runs this row for W6 only.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import platform

import benchlib

PROCESSES = 2


def version() -> str:
    return f"Python {platform.python_version()} concurrent.futures"


def prepare(dsn: str) -> None:
    """Nothing to install: no database is used."""


def count_jobs(conn, queues) -> dict:
    return {"completed": 0, "queued": 0, "failed": 0}


def worker_config(workload: str) -> dict:
    return {"processes": 0, "executor_processes": PROCESSES}


def run_direct(payloads: list, cfg: dict) -> dict:
    """Map the job body over the payloads; counts of what came back."""
    n = int(cfg.get("executor_processes", PROCESSES))
    done = 0
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=ctx) as pool:
        for _ in pool.map(benchlib.handle, payloads):
            done += 1
    return {"completed": done, "queued": len(payloads) - done, "failed": 0}


def run_worker(dsn: str, queues: list, cfg: dict) -> None:
    raise RuntimeError("process_pool is a limit row run by the driver itself (W6): it has no worker")
