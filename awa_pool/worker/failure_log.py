"""One log line per failed attempt, crash, timeout and poison verdict
(SPEC §13), so logging integrations (Sentry, Datadog, GCP) see what the
database records.

A line is written once the completer has settled the outcome: only then
is it known whether the job will be retried (WARNING) or failed for good
(ERROR), and an outcome the lease guard dropped (the job was rescued
elsewhere) is not logged as if it had counted. The loop notes the job of
each failure (`note`); the completer thread reports what its settle
statement did (`settled`). Successes are neither noted nor looked up, and
nothing here runs a statement.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, Iterable, List, Optional, Tuple

from .inflight import Finished, InFlight
from .outcomes import CRASH, FAILED, FATAL, RETRY, TIMEOUT
from .protocol import Outcome

log = logging.getLogger("awa_pool.failures")

# Outcomes that are failures of the attempt. A handler's Retry is its own
# choice: logged only when it ends the job (out of attempts).
NOTED = frozenset({FAILED, FATAL, CRASH, TIMEOUT, RETRY})
FINAL_STATE = "failed"

_WHAT = {FAILED: "failed", FATAL: "failed", CRASH: "crashed", TIMEOUT: "timed out", RETRY: "asked to retry"}


def verdict(outcome: Outcome, job: InFlight, state: str, max_crashes: int) -> Optional[str]:
    """How the line names what became of the job, None for no line."""
    if state != FINAL_STATE:
        return None if outcome.outcome == RETRY else "will retry"
    if outcome.outcome == FATAL:
        return "failed for good (not retried)"
    if outcome.outcome == CRASH and job.attempt < job.max_attempts:
        # attempts remained, so the crash limit failed it (awa.apply_outcome)
        return f"failed for good (poison: it crashed its child {max_crashes} times)"
    return "failed for good (out of attempts)"


def line_fields(outcome: Outcome, job: InFlight, final: bool) -> Dict[str, object]:
    """The structured fields of a line (the JSON format writes them)."""
    return {"kind": job.kind, "job_id": job.id, "queue": job.queue, "attempt": job.attempt,
            "max_attempts": job.max_attempts, "outcome": outcome.outcome, "final": final,
            "error": outcome.error}


class FailureLog:
    def __init__(self, max_crashes: int) -> None:
        self.max_crashes = max_crashes
        self.lock = threading.Lock()
        self.jobs: Dict[Tuple[int, int], InFlight] = {}

    def note(self, outcomes: Iterable[Finished]) -> None:
        """The loop's side: remember the job of each failure until settled."""
        for finished in outcomes:
            if finished.job is not None and finished.outcome.outcome in NOTED:
                with self.lock:
                    self.jobs[(finished.outcome.job_id, finished.outcome.lease)] = finished.job

    def settled(self, outcomes: List[Outcome], applied: List[Tuple[int, str]]) -> None:
        """The completer's side, after a settle statement committed:
        `outcomes` went into it, `applied` is what it changed."""
        with self.lock:
            if not self.jobs:
                return
            noted = [(o, self.jobs.pop((o.job_id, o.lease), None)) for o in outcomes]
        states = dict(applied)
        for outcome, job in noted:
            state = states.get(outcome.job_id)
            if job is not None and state is not None:
                self._write(outcome, job, state)

    def _write(self, outcome: Outcome, job: InFlight, state: str) -> None:
        said = verdict(outcome, job, state, self.max_crashes)
        final = state == FINAL_STATE
        level = logging.ERROR if final else logging.WARNING
        if said is None or not log.isEnabledFor(level):
            return
        # No exc_info here: the traceback is the child's text. It goes in
        # exc_text, which the formatters print after the line (text) or as
        # its "exception" field (JSON, ops/logs.py).
        record = log.makeRecord(log.name, level, __file__, 0,
                                "job %d (kind %s, queue %s) %s on attempt %d/%d, %s: %s",
                                (job.id, job.kind, job.queue, _WHAT[outcome.outcome], job.attempt,
                                 job.max_attempts, said, outcome.error or "no error text"),
                                None, func="settled", extra={"awa_fields": line_fields(outcome, job, final)})
        if outcome.traceback:
            record.exc_text = outcome.traceback.rstrip("\n")
        log.handle(record)
