"""Producing jobs: enqueue, enqueue_many, enqueue_batch.

All three run in the caller's current transaction and never commit or roll
back: the jobs exist exactly when the caller's own writes do. Ready jobs
wake idle supervisors at commit through a NOTIFY sent by the database.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .drivers import cursor_for
from ..core.job import Job
from ..core.sql import QUERIES
from ..core.tasks import apply_task_defaults
from ..core.tracing import producer_span, stamp

# Jobs per insert_jobs statement: large enough to amortize the round trip,
# small enough to keep one statement's memory modest.
MANY_CHUNK = 5000
THEN_OF_KEY = "awa:then_of"


@dataclass(frozen=True)
class Batch:
    """What enqueue_batch created: the batch id, member ids in input order,
    and the follow-up job's id (None without `then`)."""

    id: int
    ids: Tuple[int, ...]
    then_id: Optional[int]


def _check_job(job: Any) -> Job:
    if not isinstance(job, Job):
        raise TypeError(f"expected an awa_pool.Job, got {type(job).__name__}")
    return stamp(apply_task_defaults(job))  # the trace context, inside a traced enqueue


def _single_params(job: Job, *, batch_id: Optional[int] = None, hold: bool = False,
                   metadata_json: Optional[str] = None) -> Dict[str, Any]:
    return {
        "kind": job.kind, "args": job.args_json, "queue": job.queue,
        "priority": job.priority, "run_at": job.run_at, "delay_s": job.delay,
        "max_attempts": job.max_attempts, "timeout_s": job.timeout,
        "tags": list(job.tags), "metadata": metadata_json or job.metadata_json,
        "unique_opts": json.dumps(job.unique.as_sql_options()) if job.unique else None,
        "ordering_key": job.ordering_key, "batch_id": batch_id, "hold": hold,
        "expires_in_s": job.expires_in, "retry_policy": job.retry_json,
    }


@producer_span("enqueue")
def enqueue(conn: Any, job: Job) -> int:
    """Insert one job in the connection's current transaction; returns its id.

    With `job.unique`, a duplicate returns the existing job's id and inserts
    nothing. `conn` is a psycopg2 or psycopg 3 connection or cursor, Django's
    connection or an SQLAlchemy Connection or Session (see drivers.py).
    """
    job = _check_job(job)
    scheduled = job.run_at is not None or job.delay is not None
    statement = QUERIES["insert_job"] if scheduled else QUERIES["insert_job_now"]
    with cursor_for(conn, loads=None) as cur:  # ids only: no decoders
        cur.execute(statement, _single_params(job))
        return cur.fetchone()[0]


@producer_span("enqueue_many")
def enqueue_many(conn: Any, jobs: Iterable[Job]) -> List[int]:
    """Insert many jobs in one round trip per 5,000; ids come back in input order."""
    checked = [_check_job(job) for job in jobs]
    with cursor_for(conn, loads=None) as cur:  # ids only: no decoders
        return _insert_many(cur, checked, batch_id=None)


def _insert_many(cur: Any, jobs: Sequence[Job], batch_id: Optional[int]) -> List[int]:
    ids: List[int] = []
    for start in range(0, len(jobs), MANY_CHUNK):
        chunk = jobs[start:start + MANY_CHUNK]
        shapes = {job.bulk_shape() for job in chunk}
        if len(shapes) == 1 and None not in shapes:
            kind, queue, priority, max_attempts, timeout, tags, metadata_json, retry_json, expires_in = shapes.pop()
            cur.execute(QUERIES["insert_uniform_jobs"], {
                "kind": kind, "queue": queue, "priority": priority, "max_attempts": max_attempts,
                "timeout_s": timeout, "batch_id": batch_id, "tags": list(tags), "metadata": metadata_json,
                "expires_in_s": expires_in, "retry_policy": retry_json,
                "args": "[" + ",".join([job.args_json for job in chunk]) + "]"})
            ids.extend(sorted(row[0] for row in cur.fetchall()))
            continue
        payload = "[" + ",".join([job.insert_element() for job in chunk]) + "]"
        params = {"jobs": payload, "batch_id": batch_id}
        if all(job.ready_and_plain() for job in chunk):
            cur.execute(QUERIES["insert_ready_jobs"], params)
            ids.extend(sorted(row[0] for row in cur.fetchall()))
        else:
            cur.execute(QUERIES["insert_jobs"], params)
            by_position = dict(cur.fetchall())
            ids.extend(by_position[position] for position in range(1, len(chunk) + 1))
    return ids


@producer_span("enqueue_batch")
def enqueue_batch(conn: Any, jobs: Iterable[Job], then: Optional[Job] = None) -> Batch:
    """Insert a batch of jobs and, with `then`, a follow-up job that becomes
    available exactly once, after every member reached a terminal state.

    In the follow-up, `ctx.batch_results()` returns the members' records.
    Members may not use `unique` (a deduplicated member would belong to
    another batch, and the follow-up could never fire).
    """
    members = [_check_job(job) for job in jobs]
    for job in members:
        if job.unique is not None:
            raise ValueError("batch members cannot be unique jobs: a duplicate would never "
                             "report to this batch")
    then_job = _check_job(then) if then is not None else None
    if then_job is not None and then_job.unique is not None:
        raise ValueError("a batch follow-up cannot be a unique job")
    with cursor_for(conn, loads=None) as cur:  # ids only: no decoders
        cur.execute(QUERIES["insert_batch"], {"total": len(members)})
        batch_id = cur.fetchone()[0]
        then_id = None
        if then_job is not None:
            metadata = dict(then_job.metadata, **{THEN_OF_KEY: batch_id})
            cur.execute(QUERIES["insert_job"], _single_params(
                then_job, hold=bool(members), metadata_json=json.dumps(metadata)))
            then_id = cur.fetchone()[0]
            cur.execute(QUERIES["set_batch_then"], {"then_id": then_id, "batch_id": batch_id})
        ids = _insert_many(cur, members, batch_id=batch_id)
        cur.execute(QUERIES["seal_batch"], {"batch_id": batch_id})
    return Batch(batch_id, tuple(ids), then_id)
