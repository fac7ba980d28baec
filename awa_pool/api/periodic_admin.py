"""Periodic jobs in the database: registration when a pool starts, and the
admin calls behind `awa-pool cron list/pause/resume/trigger`.

Like the other admin functions these run in the caller's transaction and
never commit (a supervisor's autocommit connection commits each one). No
printing here; the CLI formats the results.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .drivers import cursor_for
from ..core.errors import AwaError, ConfigError
from ..core.job import check_name
from ..core.periodic import Schedule, declared, next_fire_time, schedules_json
from ..core.sql import QUERIES
from ..core.tasks import registered

log = logging.getLogger(__name__)


class UnknownSchedule(AwaError, LookupError):
    """No periodic job has this name in the database."""


@dataclass(frozen=True)
class ScheduleInfo:
    """A stored schedule, as `cron list` shows it. next_fire_at is computed
    here with croniter (None when the stored expression is not valid for this
    version, with the reason in `error`)."""

    name: str
    expression: str
    timezone: str
    kind: str
    queue: str
    args: Dict[str, Any]
    priority: int
    max_attempts: int
    tags: Tuple[str, ...]
    metadata: Dict[str, Any]
    missed_fire_policy: str
    paused: bool
    last_fire_at: Optional[datetime]
    next_fire_at: Optional[datetime]
    last_job_id: Optional[int]
    created_at: datetime
    updated_at: datetime
    error: Optional[str] = None


def register_schedules(conn: Any, schedules: Optional[Iterable[Schedule]] = None) -> int:
    """Upsert the declared schedules (or the given ones); returns how many
    rows were inserted or changed. Never deletes other schedules and keeps
    `paused` and `last_fire_at` of existing ones."""
    chosen = list(declared() if schedules is None else schedules)
    if not chosen:
        return 0
    for schedule in chosen:
        if registered(schedule.kind) is None:
            log.info("periodic job %r enqueues kind %r, which this app does not handle",
                     schedule.name, schedule.kind)
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["register_cron"], {"schedules": schedules_json(chosen)})
        changed = cur.fetchone()[0]
    log.info("registered %d periodic job(s) (%d new or changed)", len(chosen), changed)
    return changed


def list_schedules(conn: Any, name: Optional[str] = None) -> List[ScheduleInfo]:
    """Every stored schedule (or the one named), by name, with its next fire time."""
    if name is not None:
        check_name(name, "periodic job name")
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["list_cron"], {"name": name})
        names = [d.name for d in cur.description]
        rows = [dict(zip(names, row)) for row in cur.fetchall()]
    return [_info(row) for row in rows]


def _info(row: Dict[str, Any]) -> ScheduleInfo:
    error = None
    next_at = None
    # A paused schedule resumes from now on (resume skips missed ticks); a
    # running one fires the first tick after its last fire (a past time means due now).
    base = row["last_fire_at"] or row["created_at"]
    if row["paused"]:
        base = max(base, row["db_now"])
    try:
        next_at = next_fire_time(row["expression"], row["timezone"], base, hash_id=row["name"])
    except (ConfigError, ValueError, KeyError) as exc:
        error = str(exc) or type(exc).__name__
    return ScheduleInfo(
        name=row["name"], expression=row["expression"], timezone=row["timezone"], kind=row["kind"],
        queue=row["queue"], args=row["args"] or {}, priority=row["priority"],
        max_attempts=row["max_attempts"], tags=tuple(row["tags"] or ()),
        metadata=row["metadata"] or {}, missed_fire_policy=row["missed_fire_policy"],
        paused=row["paused"], last_fire_at=row["last_fire_at"], next_fire_at=next_at,
        last_job_id=row["last_job_id"] or None, created_at=row["created_at"],
        updated_at=row["updated_at"], error=error)


def pause_schedule(conn: Any, name: str) -> None:
    """Stop firing a schedule (a manual trigger still works)."""
    _update(conn, QUERIES["pause_cron"], name)


def resume_schedule(conn: Any, name: str) -> None:
    """Fire a paused schedule again from its next tick; ticks missed while
    paused are skipped, whatever its missed_fire_policy."""
    _update(conn, QUERIES["resume_cron"], name)


def _update(conn: Any, statement: str, name: str) -> None:
    check_name(name, "periodic job name")
    with cursor_for(conn) as cur:
        cur.execute(statement, {"name": name})
        if cur.fetchone() is None:
            raise UnknownSchedule(f"no periodic job named {name!r}")


def trigger_schedule(conn: Any, name: str) -> int:
    """Enqueue the schedule's job now, even when paused; returns the job id.
    The job's metadata says `"awa:trigger": "manual"`; the schedule's own
    ticks are not affected."""
    check_name(name, "periodic job name")
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["trigger_cron"], {"name": name})
        job_id = cur.fetchone()[0]
    if job_id is None:
        raise UnknownSchedule(f"no periodic job named {name!r}")
    return job_id
