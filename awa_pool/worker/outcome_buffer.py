"""The buffer of outcomes waiting to be written, and the statements that
write it: successes in one set-based `awa.complete_jobs`, everything else
in one `awa.settle_jobs` (or both in one statement), progress apart. Each
applies only while the job still runs under the same lease.

A flush that fails keeps every entry for the next try: both statements are
idempotent (a second application matches no row), so retrying after an
unknown commit outcome is safe. When the database refuses one value, the
others are settled one by one and only the job it refuses fails.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import psycopg2

from ..core.db import first_line, is_transient
from ..core.sql import QUERIES
from .outcome_params import array_literal, completion_params, extra_json, payload_bytes, settle_entry
from .outcomes import COMPLETED, FATAL
from .protocol import Outcome

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 1.0
# Results and progress are JSON text held until written. A flush writes
# them in statements of at most FLUSH_BYTES (one outcome at least), and the
# supervisor stops claiming while more than PENDING_BYTES_CAP wait, so a
# supervisor's memory does not grow with result size times throughput
# (issue 23: 1 MB results).
FLUSH_BYTES = 8 << 20
PENDING_BYTES_CAP = 32 << 20


class OutcomeBuffer:
    """Outcomes and progress not yet written, and how to write them."""

    def __init__(self, max_crashes: int) -> None:
        self.max_crashes = max_crashes
        self.completed: List[Outcome] = []
        self.others: List[Outcome] = []
        self.progress: Dict[int, Tuple[int, str]] = {}
        self.first_pending_at: Optional[float] = None
        self.progress_due_at: Optional[float] = None
        self.stats: Dict[str, int] = {}

    def add(self, outcome: Outcome) -> None:
        latest = self.progress.pop(outcome.job_id, None)
        if outcome.progress is None and latest is not None and latest[0] == outcome.lease:
            # A child that died or was killed sent no final progress: its
            # last checkpoint rides on the outcome instead of being dropped.
            outcome = outcome._replace(progress=latest[1])
        if outcome.outcome == COMPLETED:
            self.completed.append(outcome)
        else:
            self.others.append(outcome)
        if self.first_pending_at is None:
            self.first_pending_at = time.monotonic()

    def add_progress(self, job_id: int, lease: int, progress_json: str) -> None:
        self.progress[job_id] = (lease, progress_json)
        if self.progress_due_at is None:
            self.progress_due_at = time.monotonic() + PROGRESS_INTERVAL_S

    @property
    def pending(self) -> int:
        return len(self.completed) + len(self.others)

    def flush(self, cur: Any) -> List[Tuple[int, str]]:
        """Write everything pending; returns [(job id, new state)] actually
        applied (stale outcomes are silently dropped by the lease guard)."""
        applied: List[Tuple[int, str]] = []
        big = sum(payload_bytes(o) for o in self.completed + self.others) > FLUSH_BYTES
        if self.completed and self.others and not big:
            applied += self._flush_both(cur)
        while self.completed:  # in statements of at most FLUSH_BYTES of results
            size, count = 0, 0
            for o in self.completed:
                size += payload_bytes(o)
                if count and size > FLUSH_BYTES:
                    break
                count += 1
            chunk, rest = self.completed[:count], self.completed[count:]
            self.completed = chunk
            try:
                applied += self._flush_completed(cur)
            except BaseException:
                self.completed = chunk + rest  # nothing unwritten is dropped
                raise
            self.completed = rest
        if self.others:
            applied += self._flush_others(cur)
        if self.progress:
            self._flush_progress(cur)
        self.first_pending_at = None
        for _, state in applied:
            self.stats[state] = self.stats.get(state, 0) + 1
        return applied

    def _flush_completed(self, cur: Any) -> List[Tuple[int, str]]:
        batch = self.completed
        if len(batch) == 1:
            o = batch[0]
            statement = QUERIES["complete_job"]
            params = {"id": o.job_id, "lease": o.lease, "wall": round(o.wall_s, 6),
                      "cpu": round(o.cpu_s, 6), "rss": o.peak_rss, "extra": extra_json(o)}
        else:
            statement = QUERIES["complete_jobs"]
            params = completion_params(batch)
        try:
            cur.execute(statement, params)
        except psycopg2.Error as exc:
            if is_transient(exc):  # retried whole, with backoff
                raise
            # One value the database refuses must not block the others:
            # settle them one by one, failing only the job it refuses.
            log.warning("batch completion refused (%s); settling %d outcomes one by one",
                        first_line(exc), len(batch))
            self.completed = []
            applied = []
            for outcome in batch:
                applied += self._settle_one(cur, outcome)
            return applied
        self.completed = []
        return [(row[0], COMPLETED) for row in cur.fetchall()]

    def _flush_both(self, cur: Any) -> List[Tuple[int, str]]:
        """Successes and other outcomes in one statement; if the database
        refuses it, both lists stay for their own paths (and fallbacks)."""
        params = completion_params(self.completed)
        params.update(self._settle_params(self.others))
        try:
            cur.execute(QUERIES["complete_and_settle"], params)
        except psycopg2.Error as exc:
            if is_transient(exc):
                raise
            log.warning("combined flush refused (%s); writing its two parts apart", first_line(exc))
            return []
        self.completed, self.others = [], []
        return [(row[0], row[1]) for row in cur.fetchall()]

    def _flush_others(self, cur: Any) -> List[Tuple[int, str]]:
        batch = self.others
        try:
            applied = self._settle(cur, batch)
        except psycopg2.Error as exc:
            if is_transient(exc):
                raise
            log.warning("batch settle refused (%s); settling %d outcomes one by one",
                        first_line(exc), len(batch))
            applied = []
            for outcome in batch:
                applied += self._settle_one(cur, outcome)
        self.others = []
        return applied

    def _settle_params(self, outcomes: List[Outcome]) -> Dict[str, Any]:
        return {"outcomes": json.dumps([settle_entry(o) for o in outcomes], ensure_ascii=False),
                "max_crashes": self.max_crashes}

    def _settle(self, cur: Any, outcomes: List[Outcome]) -> List[Tuple[int, str]]:
        cur.execute(QUERIES["settle_jobs"], self._settle_params(outcomes))
        return [(row[0], row[1]) for row in cur.fetchall()]

    def _settle_one(self, cur: Any, outcome: Outcome) -> List[Tuple[int, str]]:
        try:
            return self._settle(cur, [outcome])
        except psycopg2.Error as exc:
            if is_transient(exc):
                raise
            reason = first_line(exc)
        log.warning("job %d: the database refused its outcome (%s); failing it", outcome.job_id, reason)
        refused = outcome._replace(outcome=FATAL, result=None, progress=None,
                                   error=f"the database refused this job's outcome: {reason}")
        try:
            return self._settle(cur, [refused])
        except psycopg2.Error as exc:
            if is_transient(exc):
                raise
            log.error("job %d: could not record its outcome (%s); it will be released",
                      outcome.job_id, first_line(exc))
            return []

    def _flush_progress(self, cur: Any) -> None:
        items = list(self.progress.items())
        cur.execute(QUERIES["write_progress"], {
            "ids": array_literal(job_id for job_id, _ in items),
            "leases": array_literal(lease for _, (lease, _) in items),
            "progress": [text for _, (_, text) in items],
        })
        self.progress = {}
        self.progress_due_at = None



def merge(older: OutcomeBuffer, newer: OutcomeBuffer) -> OutcomeBuffer:
    """Put a failed batch back in front of what arrived meanwhile."""
    merged = OutcomeBuffer(older.max_crashes)
    merged.completed = older.completed + newer.completed
    merged.others = older.others + newer.others
    merged.progress = {**older.progress, **newer.progress}
    merged.first_pending_at = older.first_pending_at or newer.first_pending_at
    dues = [t for t in (older.progress_due_at, newer.progress_due_at) if t is not None]
    merged.progress_due_at = min(dues) if dues else None
    return merged
