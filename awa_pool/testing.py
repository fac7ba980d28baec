"""Run handlers inline, without processes, through the same outcome code as
the pool: for unit-testing handlers.

    result = awa_pool.testing.run_job(resize.job(path="a.png", width=64))
    assert result.outcome == "completed" and result.value == {"bytes": 1234}

    awa_pool.testing.drain(conn)   # run every available job, in this process
    runs = awa_pool.testing.run_jobs(conn)   # the same, with what each job did

`drain` and `run_jobs` claim and settle jobs with the real SQL in the
caller's transaction (they never commit), so a test can roll everything
back. `Enqueued(conn)` asserts what a test enqueued. The pytest plugin
(awa_pool.pytest_plugin) builds its fixtures on these.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .core.config import DEFAULT_AGING_S
from .api.drivers import cursor_for
from .core.errors import AwaError
from .worker.execute import run
from .worker.fetcher import claim
from .testkit.enqueued import Enqueued
from .core.job import DEFAULT_QUEUE, Job, JobState
from .worker.outcome_params import settle_entry
from .worker.protocol import ClaimedJob, Outcome
from .ops.stats import queue_depth
from .worker.requests import answer as answer_request
from .core.sql import QUERIES
from .core.tasks import all_tasks, apply_task_defaults
from .core.version import __version__


@dataclass(frozen=True)
class RunResult:
    """What one inline run of a handler produced."""

    outcome: str                  # completed, failed, fatal, retry, snooze, cancel, wait
    value: Any = None             # the handler's return value (decoded JSON)
    error: Optional[str] = None
    traceback: Optional[str] = None
    delay: Optional[float] = None
    progress: Optional[Dict[str, Any]] = None


class _InlineChannel:
    """JobContext calls, answered in-process (and in the database for drain)."""

    def __init__(self, cur: Any = None) -> None:
        self.cur = cur
        self.progress_log: List[Tuple[int, str]] = []
        self.cancelled: set = set()

    def progress(self, job_id: int, lease: int, progress_json: str) -> None:
        self.progress_log.append((job_id, progress_json))
        if self.cur is not None:
            self.cur.execute(QUERIES["write_progress"], {
                "ids": [job_id], "leases": [lease], "progress": [progress_json]})

    def request(self, job_id: int, lease: int, method: str, payload: Any) -> Any:
        if self.cur is None:  # run_job: no database behind this run
            if method == "register_callback":
                return f"inline-callback-{job_id}"
            if method == "batch_results":
                return []
            raise AwaError(f"unknown request {method!r}")
        return answer_request(self.cur, job_id, lease, method, payload)

    def cancel_requested(self, job_id: int) -> bool:
        return job_id in self.cancelled


def _to_result(outcome: Outcome) -> RunResult:
    return RunResult(outcome=outcome.outcome,
                     value=json.loads(outcome.result) if outcome.result is not None else None,
                     error=outcome.error, traceback=outcome.traceback, delay=outcome.delay_s,
                     progress=json.loads(outcome.progress) if outcome.progress else None)


def run_job(job: Job, *, attempt: int = 1) -> RunResult:
    """Run one job's handler in this process (no database) and report how it ended."""
    if not isinstance(job, Job):
        raise TypeError(f"expected an awa_pool.Job, got {type(job).__name__}")
    job = apply_task_defaults(job)
    now = time.time()
    spec = ClaimedJob(id=0, kind=job.kind, queue=job.queue, args=job.args_json, priority=job.priority,
                   attempt=attempt, max_attempts=job.max_attempts, lease=1, timeout_s=job.timeout,
                   tags=list(job.tags), metadata=job.metadata_json, created_at=now, run_at=now,
                   progress=None, callback_result=None, batch_id=None)
    return _to_result(run(spec, _InlineChannel()))


def drain(conn: Any, queue: Optional[str] = None, *, max_jobs: int = 10_000) -> List[Tuple[int, str]]:
    """Run available jobs inline until none is left (or max_jobs ran), in the
    caller's transaction. Serves `queue`, or every queue the registered tasks
    name. Returns [(job id, new state)] in run order. Scheduled and
    retryable jobs wait for their time, as in a real pool."""
    queues = [queue] if queue else sorted({task.queue for task in all_tasks().values()} or {DEFAULT_QUEUE})
    runs = _run_inline(conn, lambda cur: queues, max_jobs=max_jobs, promote_due=False)
    return [(job_run.id, job_run.state.value) for job_run in runs]


@dataclass(frozen=True)
class JobRun:
    """One job that run_jobs ran: which job, what its handler did (`run`)
    and the state the real outcome SQL gave it."""

    id: int
    kind: str
    queue: str
    args: Dict[str, Any]
    attempt: int
    state: JobState               # after the outcome: completed, retryable, failed, ...
    run: RunResult

    @property
    def outcome(self) -> str:
        return self.run.outcome

    @property
    def result(self) -> Any:
        return self.run.value

    @property
    def error(self) -> Optional[str]:
        return self.run.error


class TooManyJobs(AwaError):
    """run_jobs reached max_jobs while jobs were still due."""


def run_jobs(conn: Any, queue: Optional[str] = None, *, max_jobs: int = 1000) -> List[JobRun]:
    """Run every job that is due, inline, in the caller's transaction, and
    report each run in order: available jobs of `queue` (default: of every
    queue), then those that became due meanwhile, through the leader's own
    promotion (a batch's follow-up, a retry or snooze with no delay). Jobs
    due later (retry backoff, a delay) stay as they are. Raises TooManyJobs
    when max_jobs ran and jobs are still due (a handler that snoozes forever)."""
    if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1:
        raise ValueError(f"max_jobs must be an int >= 1, got {max_jobs!r}")

    def queues_with_work(cur: Any) -> Sequence[str]:
        if queue:
            return [queue]
        cur.execute(QUERIES["queues_with_available_jobs"])
        return [row[0] for row in cur.fetchall()]

    runs = _run_inline(conn, queues_with_work, max_jobs=max_jobs, promote_due=True)
    if len(runs) == max_jobs:
        with cursor_for(conn) as cur:
            cur.execute(QUERIES["promote_due"], {"limit": max_jobs})
        waiting = sum(depth.available for name, depth in queue_depth(conn).items()
                      if queue is None or name == queue)
        if waiting:
            raise TooManyJobs(f"ran max_jobs={max_jobs} jobs and {waiting} more are due "
                              "(a handler that snoozes or retries without delay forever?); "
                              "pass a larger max_jobs if the test means it")
    return runs


def _run_inline(conn: Any, queues: Callable[[Any], Sequence[str]], *, max_jobs: int,
                promote_due: bool) -> List[JobRun]:
    """Claim one job at a time from the first of `queues(cur)` that has one,
    run it in this process and settle its outcome, as a supervisor would."""
    ran: List[JobRun] = []
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["register_supervisor"], {
            "hostname": f"{socket.gethostname()} (awa_pool.testing)", "pid": os.getpid(),
            "version": __version__, "queues": list(queues(cur)), "workers": 1})
        supervisor_id = cur.fetchone()[0]
        channel = _InlineChannel(cur)
        while len(ran) < max_jobs:
            claimed = _claim_one(cur, queues(cur), supervisor_id)
            if not claimed and promote_due:
                cur.execute(QUERIES["promote_due"], {"limit": max_jobs})
                if cur.fetchone()[0]:
                    claimed = _claim_one(cur, queues(cur), supervisor_id)
            if not claimed:
                break
            job = claimed[0]
            outcome = run(job, channel)
            cur.execute(QUERIES["settle_jobs"], {"outcomes": json.dumps([settle_entry(outcome)]),
                                                 "max_crashes": 3})
            settled = cur.fetchall()
            ran.append(JobRun(id=job.id, kind=job.kind, queue=job.queue, args=json.loads(job.args),
                              attempt=job.attempt, state=JobState(settled[0][1]),
                              run=_to_result(outcome)))
        cur.execute(QUERIES["supervisor_stopped"], {"id": supervisor_id, "stats": "{}"})
    return ran


def _claim_one(cur: Any, queues: Sequence[str], supervisor_id: int) -> List[ClaimedJob]:
    for name in queues:
        claimed = claim(cur, queue=name, limit=1, supervisor_id=supervisor_id, aging_s=DEFAULT_AGING_S)
        if claimed:
            return claimed
    return []


__all__ = ["Enqueued", "JobRun", "RunResult", "TooManyJobs", "drain", "run_job", "run_jobs"]
