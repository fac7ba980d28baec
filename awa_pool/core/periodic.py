"""Periodic jobs: `periodic()` declarations, their validation, and the pure
computation of which ticks are due.

Everything is checked when the schedule is declared (at import of the app
module), so a bad cron expression or time zone fails at deploy time, not at
2 a.m. No database code here: registration and firing live in
periodic_admin.py and maintenance.py.

Cron syntax is croniter's. Five fields are standard cron (minute first); six
fields add seconds in FRONT (`*/10 * * * * *` = every 10 seconds), the
convention of Quartz, Spring and robfig/cron. Ticks are computed in the
schedule's IANA time zone with aware datetimes, so daylight-saving changes
behave as croniter handles them (a skipped local time fires at the next
valid one; a repeated local time fires once per occurrence).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone as dt_timezone
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import ConfigError
from .job import JOB_DEFAULTS, MAX_TAGS, check_max_attempts, check_name, check_priority, json_object
from .tasks import registered

POLICIES = ("coalesce", "catch_up")
CATCH_UP_CAP = 100          # at most this many missed ticks are replayed (the newest ones)
_EPSILON = timedelta(microseconds=1)
_UTC = dt_timezone.utc


@dataclass(frozen=True)
class Schedule:
    """One declared periodic job. Unset queue/priority/max_attempts take the
    task's declared defaults at registration (see `resolved`)."""

    name: str
    expression: str
    kind: str
    args_json: str
    timezone: str = "UTC"
    queue: Optional[str] = None
    priority: Optional[int] = None
    max_attempts: Optional[int] = None
    tags: Tuple[str, ...] = ()
    metadata_json: str = "{}"
    missed_fire_policy: str = "coalesce"
    args: Dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    metadata: Dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def resolved(self) -> Dict[str, Any]:
        """The row to store: explicit values, else the task's, else the Job defaults."""
        task = registered(self.kind)
        defaults = task.defaults if task else JOB_DEFAULTS
        return {
            "name": self.name, "expression": self.expression, "timezone": self.timezone,
            "kind": self.kind, "args": self.args, "metadata": self.metadata, "tags": list(self.tags),
            "queue": self.queue or defaults["queue"],
            "priority": self.priority or defaults["priority"],
            "max_attempts": self.max_attempts or defaults["max_attempts"],
            "missed_fire_policy": self.missed_fire_policy,
        }

    def due(self, last_fire_at: Optional[datetime], now: datetime, cap: int = CATCH_UP_CAP) -> List[datetime]:
        return due_fire_times(self.expression, self.timezone, last_fire_at, now,
                              self.missed_fire_policy, cap=cap, hash_id=self.name)

    def next_after(self, after: datetime) -> datetime:
        return next_fire_time(self.expression, self.timezone, after, hash_id=self.name)


_registry: Dict[str, Schedule] = {}


def periodic(name: str, cron: str, kind: str, args: Optional[Mapping[str, Any]] = None, *,
             timezone: str = "UTC", queue: Optional[str] = None, priority: Optional[int] = None,
             max_attempts: Optional[int] = None, tags: Iterable[str] = (),
             metadata: Optional[Mapping[str, Any]] = None,
             missed_fire_policy: str = "coalesce") -> Schedule:
    """Declare a periodic job; it is registered in the database when a pool starts.

    `cron` is a 5-field expression, or 6 fields with seconds first.
    `missed_fire_policy`: "coalesce" fires once for any number of missed
    ticks; "catch_up" fires each missed tick, in order (the newest
    CATCH_UP_CAP of them). Raises ConfigError for anything invalid.
    """
    schedule = make_schedule(name, cron, kind, args, timezone=timezone, queue=queue,
                             priority=priority, max_attempts=max_attempts, tags=tags,
                             metadata=metadata, missed_fire_policy=missed_fire_policy)
    existing = _registry.get(name)
    if existing is not None and existing != schedule:
        raise ConfigError(f"periodic job {name!r} is already declared with a different schedule")
    _registry[name] = schedule
    return schedule


def make_schedule(name: str, cron: str, kind: str, args: Optional[Mapping[str, Any]] = None, *,
                  timezone: str = "UTC", queue: Optional[str] = None, priority: Optional[int] = None,
                  max_attempts: Optional[int] = None, tags: Iterable[str] = (),
                  metadata: Optional[Mapping[str, Any]] = None,
                  missed_fire_policy: str = "coalesce") -> Schedule:
    """A validated Schedule, without declaring it (for tests and tools)."""
    try:
        check_name(name, "periodic job name")
        check_name(kind, f"periodic job {name!r}: kind")
        if queue is not None:
            check_name(queue, f"periodic job {name!r}: queue")
        if priority is not None:
            check_priority(priority)
        if max_attempts is not None:
            check_max_attempts(max_attempts)
        args_value, args_json = json_object(args, f"periodic job {name!r}: args")
        metadata_value, metadata_json = json_object(metadata, f"periodic job {name!r}: metadata")
        if isinstance(tags, (str, bytes)):
            raise TypeError(f"periodic job {name!r}: tags must be a collection of strings, not a string")
        tag_tuple = tuple(tags)
        if len(tag_tuple) > MAX_TAGS:
            raise ValueError(f"periodic job {name!r}: at most {MAX_TAGS} tags")
        for tag in tag_tuple:
            check_name(tag, f"periodic job {name!r}: each tag")
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None
    if missed_fire_policy not in POLICIES:
        raise ConfigError(f"periodic job {name!r}: missed_fire_policy must be 'coalesce' or "
                          f"'catch_up', got {missed_fire_policy!r}")
    zone = check_timezone(timezone, f"periodic job {name!r}")
    expression = check_cron(cron, f"periodic job {name!r}", zone, hash_id=name)
    return Schedule(name=name, expression=expression, kind=kind, args_json=args_json,
                    timezone=timezone, queue=queue, priority=priority, max_attempts=max_attempts,
                    tags=tag_tuple, metadata_json=metadata_json,
                    missed_fire_policy=missed_fire_policy, args=args_value, metadata=metadata_value)


def declared() -> List[Schedule]:
    """Every schedule declared in this process, by name."""
    return [_registry[name] for name in sorted(_registry)]


def check_timezone(value: Any, what: str = "periodic job") -> ZoneInfo:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what}: timezone must be an IANA zone name like 'Europe/Paris', got {value!r}")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(f"{what}: unknown time zone {value!r} "
                          "(use an IANA name like 'UTC' or 'Europe/Paris')") from None


def check_cron(expression: Any, what: str = "periodic job", zone: Optional[ZoneInfo] = None,
               hash_id: Optional[str] = None) -> str:
    """The expression, normalized to single spaces, if croniter accepts it
    with 5 or 6 fields and it fires at least once."""
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigError(f"{what}: cron expression must be a non-empty string, got {expression!r}")
    normalized = " ".join(expression.split())
    fields = len(normalized.split(" "))
    if not normalized.startswith("@") and fields not in (5, 6):
        raise ConfigError(f"{what}: cron expression {expression!r} has {fields} field(s); "
                          "use 5 (minute hour day month weekday) or 6 (seconds first)")
    from croniter import CroniterBadDateError, CroniterError

    try:
        _iterator(normalized, datetime.now(zone or _UTC), hash_id).get_next()
    except CroniterBadDateError:
        raise ConfigError(f"{what}: cron expression {expression!r} never fires "
                          "(no date matches it)") from None
    except (CroniterError, ValueError, KeyError, TypeError, OverflowError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{what}: invalid cron expression {expression!r}: {detail}") from None
    return normalized


def _iterator(expression: str, start: datetime, hash_id: Optional[str]) -> Any:
    # croniter (and dateutil behind it) costs ~40 ms to import: only processes
    # that declare or fire schedules pay for it, not every producer.
    from croniter import croniter

    six = not expression.startswith("@") and len(expression.split(" ")) == 6
    return croniter(expression, start, ret_type=datetime, second_at_beginning=six,
                    hash_id=hash_id.encode("utf-8") if hash_id else None)


def _local(moment: datetime, zone: ZoneInfo) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("fire-time computations need timezone-aware datetimes")
    return moment.astimezone(zone)


def next_fire_time(expression: str, timezone: str, after: datetime,
                   hash_id: Optional[str] = None) -> datetime:
    """The first tick strictly after `after`, in UTC."""
    zone = ZoneInfo(timezone)
    return _iterator(expression, _local(after, zone), hash_id).get_next().astimezone(_UTC)


def due_fire_times(expression: str, timezone: str, last_fire_at: Optional[datetime], now: datetime,
                   policy: str, cap: int = CATCH_UP_CAP, hash_id: Optional[str] = None) -> List[datetime]:
    """Ticks to fire now, oldest first, in UTC: those after `last_fire_at` and
    at or before `now`.

    coalesce: only the latest of them. catch_up: each of them, but at most
    the newest `cap` (older missed ticks are skipped, so an outage of a
    frequent schedule cannot flood the queue). A schedule that never fired
    (last_fire_at None) fires only its latest due tick: no backfill.

    Comparisons are done in UTC: aware datetimes sharing a tzinfo compare by
    wall time, which is wrong across a DST fold.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown missed_fire_policy {policy!r}")
    if cap < 1:
        raise ValueError("cap must be >= 1")
    now_utc = now.astimezone(_UTC)
    last_utc = last_fire_at.astimezone(_UTC) if last_fire_at is not None else None
    zone = ZoneInfo(timezone)
    iterator = _iterator(expression, _local(now_utc + _EPSILON, zone), hash_id)
    limit = 1 if policy == "coalesce" or last_utc is None else cap
    found: List[datetime] = []
    while len(found) < limit:
        tick = iterator.get_prev().astimezone(_UTC)
        if last_utc is not None and tick <= last_utc:
            break
        if found and tick >= found[-1]:
            break  # defensive: croniter must move strictly backwards
        found.append(tick)
    found.reverse()
    return found


def schedule_from_row(row: Mapping[str, Any]) -> Schedule:
    """A Schedule for a stored awa.cron_jobs row (validated again: the row may
    come from another deployment)."""
    return make_schedule(row["name"], row["expression"], row["kind"], row.get("args") or {},
                         timezone=row.get("timezone") or "UTC", queue=row.get("queue"),
                         priority=row.get("priority"), max_attempts=row.get("max_attempts"),
                         tags=tuple(row.get("tags") or ()), metadata=row.get("metadata") or {},
                         missed_fire_policy=row.get("missed_fire_policy") or "coalesce")


def schedules_json(schedules: Iterable[Schedule]) -> str:
    """The JSON array awa.register_cron takes, sorted by name (a fixed lock order)."""
    return json.dumps([s.resolved() for s in sorted(schedules, key=lambda s: s.name)],
                      ensure_ascii=False, separators=(",", ":"))
