"""Run handlers inline, without processes, through the same outcome code as
the pool: for unit-testing handlers.

    result = awa_pool.testing.run_job(resize.job(path="a.png", width=64))
    assert result.outcome == "completed" and result.value == {"bytes": 1234}

    awa_pool.testing.drain(conn)   # run every available job, in this process

`drain` claims and settles jobs with the real SQL in the caller's
transaction (it never commits), so a test can roll everything back.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .completer import settle_entry
from .config import DEFAULT_AGING_S
from .drivers import cursor_for
from .errors import AwaError
from .execute import run
from .fetcher import claim
from .job import DEFAULT_QUEUE, Job
from .protocol import ClaimedJob, Outcome
from .requests import answer as answer_request
from .sql import QUERIES
from .tasks import all_tasks, apply_task_defaults
from .version import __version__


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
    ran: List[Tuple[int, str]] = []
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["register_supervisor"], {
            "hostname": f"{socket.gethostname()} (awa_pool.testing)", "pid": os.getpid(),
            "version": __version__, "queues": queues, "workers": 1})
        supervisor_id = cur.fetchone()[0]
        channel = _InlineChannel(cur)
        while len(ran) < max_jobs:
            claimed = []
            for name in queues:
                claimed = claim(cur, queue=name, limit=1, supervisor_id=supervisor_id,
                                aging_s=DEFAULT_AGING_S)
                if claimed:
                    break
            if not claimed:
                break
            outcome = run(claimed[0], channel)
            cur.execute(QUERIES["settle_jobs"], {"outcomes": json.dumps([settle_entry(outcome)]),
                                                 "max_crashes": 3})
            ran.extend((row[0], row[1]) for row in cur.fetchall())
        cur.execute(QUERIES["supervisor_stopped"], {"id": supervisor_id, "stats": "{}"})
    return ran
