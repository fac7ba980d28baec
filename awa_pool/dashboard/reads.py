"""The dashboard's read model: what each page shows, read through the admin
and stats functions where they exist and the named queries of
schema/queries/dashboard.sql where the dashboard needs more (keyset pages,
batches). Throughput is in throughput.py, kind trends in kinds.py.

Every function takes a connection and runs in its transaction; none writes.
Filters arrive as request text and are checked here (BadFilter carries the
one-line reason the 400 page shows).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..api.admin import ALL_STATES, get_job
from ..core.config import parse_duration
from ..api.drivers import cursor_for
from ..core.errors import ConfigError
from ..core.job import TERMINAL_STATES, JobRecord, check_name
from ..api.periodic_admin import ScheduleInfo, list_schedules
from ..core.sql import QUERIES
from ..ops.stats import QueueStats, SupervisorInfo, live_supervisors, queue_stats
from .throughput import Throughput, ThroughputMinutes

PAGE_SIZE = 50                 # jobs per page of the jobs and DLQ lists
BATCH_MEMBERS_SHOWN = 100
AGE_SLACK_S = 600.0            # how far creation order may stray from id order (see jobs_page_params)
TERMINAL = {state.value for state in TERMINAL_STATES}


class BadFilter(ValueError):
    """A filter the dashboard cannot apply; the message says why (HTTP 400)."""


def _name(value: str, what: str) -> str:
    try:
        return check_name(value, what)
    except (TypeError, ValueError) as exc:
        raise BadFilter(str(exc)) from None


def _duration(value: str, what: str) -> float:
    try:
        return parse_duration(value, what=what)
    except ConfigError as exc:
        raise BadFilter(str(exc)) from None


def parse_id(value: Any, what: str = "job id") -> int:
    """A positive integer id from request text."""
    text = str(value).strip().lstrip("#")
    if not text.isdigit() or len(text) > 18:
        raise BadFilter(f"{what} must be a positive whole number, got {str(value)[:40]!r}")
    return int(text)


@dataclass(frozen=True)
class JobFilter:
    """The jobs list's filters, as typed in the form (text) and checked."""

    state: Optional[str] = None
    queue: Optional[str] = None
    kind: Optional[str] = None
    tag: Optional[str] = None
    older_than: Optional[str] = None
    newer_than: Optional[str] = None
    before: Optional[int] = None

    FIELDS = ("state", "queue", "kind", "tag", "older_than", "newer_than")

    @classmethod
    def from_args(cls, args: Mapping[str, str]) -> "JobFilter":
        values: Dict[str, Any] = {}
        for name in cls.FIELDS:
            text = (args.get(name) or "").strip()
            if text:
                values[name] = text
        state = values.get("state")
        if state is not None and state not in ALL_STATES:
            raise BadFilter(f"unknown state {state[:40]!r}: use one of {', '.join(ALL_STATES)}")
        for name in ("queue", "kind", "tag"):
            if name in values:
                _name(values[name], name)
        for name in ("older_than", "newer_than"):
            if name in values:
                _duration(values[name], name.replace("_", " "))
        before = (args.get("before") or "").strip()
        if before:
            values["before"] = parse_id(before, "the page cursor (before)")
        return cls(**values)

    def params(self) -> Dict[str, Any]:
        return {
            "state": self.state, "queue": self.queue, "kind": self.kind, "tag": self.tag,
            "older_than_s": _duration(self.older_than, "older than") if self.older_than else None,
            "newer_than_s": _duration(self.newer_than, "newer than") if self.newer_than else None,
        }

    def query_args(self, **changes: Any) -> Dict[str, Any]:
        """The filter as URL query arguments (unset ones left out)."""
        chosen = replace(self, **changes) if changes else self
        found = {name: getattr(chosen, name) for name in self.FIELDS + ("before",)}
        return {name: value for name, value in found.items() if value not in (None, "")}

    @property
    def active(self) -> bool:
        return any(getattr(self, name) for name in self.FIELDS)

    @property
    def selects_live_jobs(self) -> bool:
        """False when the state filter names a terminal state (nothing to cancel)."""
        return self.state is None or self.state not in TERMINAL


def _rows(cur: Any) -> List[Dict[str, Any]]:
    names = [d.name for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


# -- overview ----------------------------------------------------------------------

def queue_rows(conn: Any) -> List[QueueStats]:
    """Every known queue's counts, pause flag, lag and recent throughput: the
    dashboard's one call into the queue read model."""
    return queue_stats(conn)


@dataclass(frozen=True)
class Overview:
    queues: List[QueueStats]
    supervisors: List[SupervisorInfo]
    throughput: Dict[str, Throughput]

    @property
    def total_throughput(self) -> Throughput:
        return Throughput.summed(list(self.throughput.values()))


def overview(conn: Any, minutes: ThroughputMinutes) -> Overview:
    queues = queue_rows(conn)
    return Overview(queues=queues, supervisors=live_supervisors(conn),
                    throughput=minutes.read(conn, [q.queue for q in queues]))


# -- jobs --------------------------------------------------------------------------

def first_id_younger_than(cur: Any, age_s: float) -> Optional[int]:
    """The smallest id whose job is younger than age_s seconds (None when
    every job is older): dash_first_younger's binary search on the ids."""
    cur.execute(QUERIES["dash_first_younger"], {"age_s": age_s})
    row = cur.fetchone()
    return row[0] if row else None


def queue_names(conn: Any) -> List[str]:
    """Queues with a settings row or terminal history (cheap: index probes)."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_queue_names"])
        return [row[0] for row in cur.fetchall()]


def jobs_page_params(cur: Any, filt: JobFilter, known_queues: Sequence[str], limit: int) -> Dict[str, Any]:
    """The parameters of dash_jobs_page for a filter (shared with the EXPLAIN test).
    known_queues must include every queue with terminal history (queue_names)."""
    params = filt.params()
    params.update(before=filt.before, limit=limit + 1, id_below=None, id_from=None)
    # a terminal state without a queue: name the queues, so a rare state can
    # use the (queue, state, ...) index of the history (see the query)
    params["queues"] = list(known_queues) if filt.state in TERMINAL and not filt.queue and known_queues else None
    # An age filter becomes an id range too, so the id index stops where the
    # ages stop instead of walking every newer job. The range is widened by
    # AGE_SLACK_S (ids are taken at insert time, created_at is the start of
    # the inserting transaction); the exact age test still applies inside.
    if params["older_than_s"] is not None:
        params["id_below"] = first_id_younger_than(cur, max(0.0, params["older_than_s"] - AGE_SLACK_S))
    if params["newer_than_s"] is not None:
        params["id_from"] = first_id_younger_than(cur, params["newer_than_s"] + AGE_SLACK_S)
        if params["id_from"] is None:
            params["id_from"] = 2 ** 62   # every job is older: nothing to list
    return params


def jobs_page(conn: Any, filt: JobFilter, known_queues: Sequence[str],
              limit: int = PAGE_SIZE) -> Tuple[List[Dict[str, Any]], Optional[int]]:
    """One page of jobs (newest first) and the cursor of the next page."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_jobs_page"], jobs_page_params(cur, filt, known_queues, limit))
        rows = _rows(cur)
    next_before = rows[limit - 1]["id"] if len(rows) > limit else None
    return rows[:limit], next_before


def live_matching(conn: Any, filt: JobFilter) -> Tuple[int, Optional[int]]:
    """How many not-yet-terminal jobs the filter selects, and their highest id."""
    params = dict(filt.params(), max_id=None, cancel=False, reason=None)
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_live_matching"], params)
        n, max_id, _ = cur.fetchone()
    return int(n), max_id


def cancel_matching(conn: Any, filt: JobFilter, max_id: int, reason: str) -> int:
    """Cancel every not-yet-terminal job the filter selects with id <= max_id;
    returns how many were cancelled."""
    params = dict(filt.params(), max_id=max_id, cancel=True, reason=reason)
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_live_matching"], params)
        return int(cur.fetchone()[2])


@dataclass(frozen=True)
class BatchInfo:
    id: int
    total: int
    remaining: int
    then_id: Optional[int]
    created_at: datetime
    done_at: Optional[datetime]
    members: List[Dict[str, Any]]          # finished or deferred members, by id (capped)

    @property
    def finished(self) -> int:
        return self.total - self.remaining


@dataclass(frozen=True)
class JobPage:
    record: JobRecord
    extra: Dict[str, Any]
    batch: Optional[BatchInfo] = None
    follow_up_of: Optional[int] = None     # the batch this job is the follow-up of
    last_traceback: Optional[str] = None


def _batch(conn: Any, batch_id: int) -> Optional[BatchInfo]:
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_batch"], {"batch_id": batch_id})
        found = _rows(cur)
        if not found:
            return None
        cur.execute(QUERIES["dash_batch_members"], {"batch_id": batch_id, "limit": BATCH_MEMBERS_SHOWN})
        members = _rows(cur)
    return BatchInfo(members=members, **found[0])


def job_page(conn: Any, job_id: int) -> Optional[JobPage]:
    """Everything the job page shows, or None for an unknown id."""
    record = get_job(conn, job_id)
    if record is None:
        return None
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_job_extra"], {"id": job_id})
        extra = _rows(cur)
    then_of = record.metadata.get("awa:then_of") if isinstance(record.metadata, dict) else None
    batch_id = record.batch_id or (then_of if isinstance(then_of, int) else None)
    batch = _batch(conn, batch_id) if batch_id is not None else None
    traceback = next((e.get("traceback") for e in reversed(record.errors)
                      if isinstance(e, dict) and e.get("traceback")), None)
    return JobPage(record=record, extra=extra[0] if extra else {}, batch=batch,
                   follow_up_of=batch_id if record.batch_id is None and batch is not None else None,
                   last_traceback=traceback)


# -- cron and dead letters ---------------------------------------------------------

def schedules(conn: Any) -> List[ScheduleInfo]:
    return list_schedules(conn)


def dlq_page(conn: Any, queue: Optional[str], kind: Optional[str], before: Optional[int],
             limit: int = PAGE_SIZE) -> Tuple[List[Dict[str, Any]], Optional[int]]:
    params = {"queue": _name(queue, "queue") if queue else None,
              "kind": _name(kind, "kind") if kind else None,
              "before": before, "limit": limit + 1}
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_dlq_page"], params)
        rows = _rows(cur)
    next_before = rows[limit - 1]["id"] if len(rows) > limit else None
    return rows[:limit], next_before


def dlq_count(conn: Any, queue: Optional[str], kind: Optional[str]) -> int:
    params = {"queue": _name(queue, "queue") if queue else None, "kind": _name(kind, "kind") if kind else None}
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_dlq_count"], params)
        return int(cur.fetchone()[0])


def job_state(conn: Any, job_id: int) -> Optional[str]:
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["dash_job_state"], {"id": job_id})
        row = cur.fetchone()
    return row[0] if row else None
