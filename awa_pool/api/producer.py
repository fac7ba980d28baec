"""Producing jobs: enqueue, enqueue_many, enqueue_batch.

All three run in the caller's current transaction and never commit or roll
back: the jobs exist exactly when the caller's own writes do. Ready jobs
wake idle supervisors at commit through a NOTIFY sent by the database.

Each is a plan (see plan.py) built here, the one place that validates the
jobs and chooses the statements and their parameters; the functions below
run it on a synchronous connection, awa_pool.aio awaits the same plan.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .drivers import adapt
from .plan import Plan, Query, Steps
from ..core.job import Job
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


# -- plans ----------------------------------------------------------------------
# Each validates its input when called (before any connection is looked at)
# and returns a Plan whose steps send the statements. Ids only come back, so
# no column decoder is needed (loads=None).

def enqueue_plan(job: Job) -> Plan[int]:
    return Plan(_enqueue_steps(_check_job(job)), loads=None, writes=True)


def _enqueue_steps(job: Job) -> Steps[int]:
    params = _single_params(job)
    scheduled = job.run_at is not None or job.delay is not None
    rows = yield Query("insert_job", params) if scheduled else Query("insert_job_now", params)
    return rows.values[0][0]


def enqueue_many_plan(jobs: Iterable[Job]) -> Plan[List[int]]:
    return Plan(_insert_many([_check_job(job) for job in jobs], batch_id=None), loads=None, writes=True)


def _insert_many(jobs: Sequence[Job], batch_id: Optional[int]) -> Steps[List[int]]:
    ids: List[int] = []
    for start in range(0, len(jobs), MANY_CHUNK):
        chunk = jobs[start:start + MANY_CHUNK]
        shapes = {job.bulk_shape() for job in chunk}
        if len(shapes) == 1 and None not in shapes:
            kind, queue, priority, max_attempts, timeout, tags, metadata_json, retry_json, expires_in = shapes.pop()
            rows = yield Query("insert_uniform_jobs", {
                "kind": kind, "queue": queue, "priority": priority, "max_attempts": max_attempts,
                "timeout_s": timeout, "batch_id": batch_id, "tags": list(tags), "metadata": metadata_json,
                "expires_in_s": expires_in, "retry_policy": retry_json,
                "args": "[" + ",".join([job.args_json for job in chunk]) + "]"})
            ids.extend(sorted(row[0] for row in rows.values))
            continue
        params = {"jobs": "[" + ",".join([job.insert_element() for job in chunk]) + "]", "batch_id": batch_id}
        if all(job.ready_and_plain() for job in chunk):
            rows = yield Query("insert_ready_jobs", params)
            ids.extend(sorted(row[0] for row in rows.values))
        else:
            rows = yield Query("insert_jobs", params)
            by_position = {row[0]: row[1] for row in rows.values}
            ids.extend(by_position[position] for position in range(1, len(chunk) + 1))
    return ids


def enqueue_batch_plan(jobs: Iterable[Job], then: Optional[Job] = None) -> Plan[Batch]:
    members = [_check_job(job) for job in jobs]
    for job in members:
        if job.unique is not None:
            raise ValueError("batch members cannot be unique jobs: a duplicate would never "
                             "report to this batch")
    then_job = _check_job(then) if then is not None else None
    if then_job is not None and then_job.unique is not None:
        raise ValueError("a batch follow-up cannot be a unique job")
    return Plan(_batch_steps(members, then_job), loads=None, writes=True)


def _batch_steps(members: List[Job], then_job: Optional[Job]) -> Steps[Batch]:
    rows = yield Query("insert_batch", {"total": len(members)})
    batch_id = rows.values[0][0]
    then_id = None
    if then_job is not None:
        metadata = dict(then_job.metadata, **{THEN_OF_KEY: batch_id})
        rows = yield Query("insert_job", _single_params(
            then_job, hold=bool(members), metadata_json=json.dumps(metadata)))
        then_id = rows.values[0][0]
        yield Query("set_batch_then", {"then_id": then_id, "batch_id": batch_id})
    ids = yield from _insert_many(members, batch_id=batch_id)
    yield Query("seal_batch", {"batch_id": batch_id})
    return Batch(batch_id, tuple(ids), then_id)


# -- the synchronous API ----------------------------------------------------------

@producer_span("enqueue")
def enqueue(conn: Any, job: Job) -> int:
    """Insert one job in the connection's current transaction; returns its id.

    With `job.unique`, a duplicate returns the existing job's id and inserts
    nothing. `conn` is a psycopg2 or psycopg 3 connection or cursor, Django's
    connection or an SQLAlchemy Connection or Session (see drivers.py).
    """
    plan = enqueue_plan(job)  # bad jobs fail before the connection is looked at
    return adapt(conn).run(plan)


@producer_span("enqueue_many")
def enqueue_many(conn: Any, jobs: Iterable[Job]) -> List[int]:
    """Insert many jobs in one round trip per 5,000; ids come back in input order."""
    plan = enqueue_many_plan(jobs)
    return adapt(conn).run(plan)


@producer_span("enqueue_batch")
def enqueue_batch(conn: Any, jobs: Iterable[Job], then: Optional[Job] = None) -> Batch:
    """Insert a batch of jobs and, with `then`, a follow-up job that becomes
    available exactly once, after every member reached a terminal state.

    In the follow-up, `ctx.batch_results()` returns the members' records.
    Members may not use `unique` (a deduplicated member would belong to
    another batch, and the follow-up could never fire).
    """
    plan = enqueue_batch_plan(jobs, then)
    return adapt(conn).run(plan)
