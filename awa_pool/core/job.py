"""Value objects: Job (what producers enqueue), Unique, JobState, JobRecord.

Everything here validates on construction, before any SQL can run, and uses
only the standard library (child processes import it).
"""
from __future__ import annotations

import enum
import itertools
import operator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from .errors import Seconds, to_seconds
# check_json, decode_json_for_record and UNDECODABLE are imported from here
# by the modules that read records and results
from .jsonvalue import UNDECODABLE, _encode, _quote, check_json, decode_json_for_record, json_object  # noqa: F401
from .retry import RetryPolicy, check_retry

MAX_NAME_LEN = 200
MAX_TAGS = 20
MAX_PRIORITY = 4
MAX_ATTEMPTS_LIMIT = 1000


class JobState(str, enum.Enum):
    """Where a job is in its life. A str, so `record.state == "completed"` holds."""

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    RETRYABLE = "retryable"
    WAITING_EXTERNAL = "waiting_external"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

DEFAULT_UNIQUE_STATES: FrozenSet[JobState] = frozenset({
    JobState.SCHEDULED, JobState.AVAILABLE, JobState.RUNNING,
    JobState.RETRYABLE, JobState.WAITING_EXTERNAL, JobState.COMPLETED,
})


def check_name(value: Any, what: str) -> str:
    """A kind, queue or similar name: non-empty text of at most 200 characters."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > MAX_NAME_LEN:
        raise ValueError(f"{what} must be at most {MAX_NAME_LEN} characters, got {len(value)}")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} contains a lone surrogate, which is not valid UTF-8") from None
    return value


def check_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an int from 1 to {MAX_PRIORITY}, not {type(value).__name__}")
    if not 1 <= value <= MAX_PRIORITY:
        raise ValueError(f"priority must be from 1 (highest) to {MAX_PRIORITY} (lowest), got {value}")
    return value


def check_max_attempts(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_attempts must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"max_attempts must be from 1 to {MAX_ATTEMPTS_LIMIT}, got {value}")
    return value


@dataclass(frozen=True)
class Unique:
    """Deduplication: while a job with the same key is in one of `states`,
    enqueueing another returns the existing job's id and inserts nothing.

    The key is kind (+ queue when by_queue) (+ canonical args when by_args)
    (+ the `period`-second time bucket), computed in SQL.
    """

    by_args: bool = True
    by_queue: bool = False
    period: Optional[Seconds] = None
    states: FrozenSet[JobState] = DEFAULT_UNIQUE_STATES

    def __post_init__(self) -> None:
        for name in ("by_args", "by_queue"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Unique.{name} must be a bool")
        period = to_seconds(self.period, "Unique period", allow_zero=False)
        object.__setattr__(self, "period", period)
        if isinstance(self.states, (str, bytes)) or not isinstance(self.states, Iterable):
            raise TypeError("Unique.states must be a collection of job states")
        try:
            states = frozenset(JobState(s) for s in self.states)
        except ValueError as exc:
            raise ValueError(f"Unique.states: {exc}") from None
        if not states:
            raise ValueError("Unique.states must name at least one state")
        object.__setattr__(self, "states", states)

    def as_sql_options(self) -> Dict[str, Any]:
        options: Dict[str, Any] = {"by_args": self.by_args, "by_queue": self.by_queue,
                                   "states": sorted(s.value for s in self.states)}
        if self.period is not None:
            options["period"] = self.period
        return options


_UNSET: Any = object()
# The fields a task's declaration can fill in for a Job that left them unset.
TASK_FIELDS = ("queue", "priority", "max_attempts", "timeout", "retry", "expires_in")
# Which of them a Job set itself, for every combination (a lookup is
# cheaper than building the set per job).
_EXPLICIT: Dict[Tuple[bool, ...], FrozenSet[str]] = {
    flags: frozenset(name for name, given in zip(TASK_FIELDS, flags) if given)
    for flags in itertools.product((False, True), repeat=len(TASK_FIELDS))}
# The defaults of a field neither a Job nor its task sets. The only place
# they are decided in Python; awa.insert_job's SQL defaults for raw SQL
# producers are the same (tests/test_job.py checks).
DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 2
DEFAULT_MAX_ATTEMPTS = 25
JOB_DEFAULTS = {"queue": DEFAULT_QUEUE, "priority": DEFAULT_PRIORITY, "max_attempts": DEFAULT_MAX_ATTEMPTS,
                "timeout": None, "retry": None, "expires_in": None}


def _read_only(slot: str) -> Any:
    """A public, read-only view of one of Job's private slots."""
    return property(operator.attrgetter(slot))


class Job:
    """A job to enqueue: a plain, validated, immutable value.

    Bad values raise TypeError/ValueError here, before any SQL runs. A
    task's declared queue, priority, max_attempts, timeout, retry and
    expires_in apply to the fields this Job does not set itself.

    `retry` (a RetryPolicy) sets how this job's failed attempts back off;
    which exceptions give up at once is the task's (its own retry_on and
    give_up_on). `expires_in` (seconds from the enqueue, on the database's
    clock): a job not started by then is cancelled as "expired", never run.
    """

    # Fields live in private slots behind read-only properties: a plain store
    # costs a tenth of object.__setattr__ (what a __setattr__-guarded class
    # needs), and a bulk enqueue builds a Job per row.
    __slots__ = ("_kind", "_args", "_queue", "_priority", "_run_at", "_delay", "_max_attempts",
                 "_timeout", "_unique", "_tags", "_metadata", "_ordering_key", "_retry", "_expires_in",
                 "_args_json", "_metadata_json", "_explicit")

    kind: str = _read_only("_kind")
    args: Dict[str, Any] = _read_only("_args")
    queue: str = _read_only("_queue")
    priority: int = _read_only("_priority")
    run_at: Optional[datetime] = _read_only("_run_at")
    delay: Optional[float] = _read_only("_delay")
    max_attempts: int = _read_only("_max_attempts")
    timeout: Optional[float] = _read_only("_timeout")
    unique: Optional[Unique] = _read_only("_unique")
    tags: Tuple[str, ...] = _read_only("_tags")
    metadata: Dict[str, Any] = _read_only("_metadata")
    ordering_key: Optional[str] = _read_only("_ordering_key")
    retry: Optional[RetryPolicy] = _read_only("_retry")
    expires_in: Optional[float] = _read_only("_expires_in")
    args_json: str = _read_only("_args_json")          # compact JSON text of args
    metadata_json: str = _read_only("_metadata_json")  # and of metadata

    def __init__(self, kind: str, args: Optional[Mapping[str, Any]] = None, *,
                 queue: str = _UNSET, priority: int = _UNSET,
                 run_at: Optional[datetime] = None, delay: Optional[Seconds] = None,
                 max_attempts: int = _UNSET, timeout: Optional[Seconds] = _UNSET,
                 unique: Optional[Unique] = None, tags: Iterable[str] = (),
                 metadata: Optional[Mapping[str, Any]] = None,
                 ordering_key: Optional[str] = None, retry: Optional[RetryPolicy] = _UNSET,
                 expires_in: Optional[Seconds] = _UNSET) -> None:
        self._explicit = _EXPLICIT[(queue is not _UNSET, priority is not _UNSET,
                                    max_attempts is not _UNSET, timeout is not _UNSET,
                                    retry is not _UNSET, expires_in is not _UNSET)]
        self._kind = check_name(kind, "kind")
        self._args, self._args_json = json_object(args, "args")
        self._queue = DEFAULT_QUEUE if queue is _UNSET else check_name(queue, "queue")
        self._priority = DEFAULT_PRIORITY if priority is _UNSET else check_priority(priority)
        self._max_attempts = DEFAULT_MAX_ATTEMPTS if max_attempts is _UNSET else check_max_attempts(max_attempts)
        self._timeout = None if timeout is _UNSET or timeout is None else to_seconds(
            timeout, "timeout", allow_zero=False)
        if run_at is not None:
            if delay is not None:
                raise ValueError("run_at and delay are mutually exclusive: give one or the other")
            if not isinstance(run_at, datetime):
                raise TypeError(f"run_at must be a datetime, not {type(run_at).__name__}")
            if run_at.tzinfo is None or run_at.tzinfo.utcoffset(run_at) is None:
                raise ValueError("run_at must be timezone-aware (for example datetime.now(timezone.utc))")
        self._run_at = run_at
        self._delay = None if delay is None else to_seconds(delay, "delay")
        if unique is not None and not isinstance(unique, Unique):
            raise TypeError(f"unique must be an awa_pool.Unique, not {type(unique).__name__}")
        self._unique = unique
        if type(tags) is tuple and not tags:
            self._tags: Tuple[str, ...] = ()
        else:
            self._tags = _check_tags(tags)
        if metadata is None:
            self._metadata, self._metadata_json = {}, "{}"
        else:
            self._metadata, self._metadata_json = json_object(metadata, "metadata")
        self._ordering_key = None if ordering_key is None else check_name(ordering_key, "ordering_key")
        self._retry = None if retry is _UNSET else check_retry(retry)
        if self._retry is not None and self._retry.filters_exceptions:
            raise ValueError("a Job's retry policy sets its backoff only: retry_on and give_up_on "
                             "belong to the task (@task(retry=...)), where the exception is raised")
        self._expires_in = None if expires_in is _UNSET or expires_in is None else to_seconds(
            expires_in, "expires_in", allow_zero=False)
        if self._expires_in is not None and self._delay is not None and self._delay >= self._expires_in:
            raise ValueError(f"the job would expire (expires_in={self._expires_in:g}s) before it is "
                             f"due (delay={self._delay:g}s)")

    def replace(self, **changes: Any) -> "Job":
        """A copy with some fields changed (validated again)."""
        fields: Dict[str, Any] = {
            "args": self._args, "run_at": self._run_at, "delay": self._delay,
            "unique": self._unique, "tags": self._tags, "metadata": self._metadata,
            "ordering_key": self._ordering_key,
        }
        for name in self._explicit:
            fields[name] = getattr(self, name)
        fields.update(changes)
        return Job(changes.get("kind", self._kind), **{k: v for k, v in fields.items() if k != "kind"})

    def with_defaults(self, defaults: Mapping[str, Any]) -> "Job":
        """Fill the fields this job left unset from a task's declared defaults
        (of a task's retry policy, the backoff: see Job)."""
        missing = {name: value for name, value in defaults.items()
                   if name not in self._explicit and value is not None}
        if missing.get("retry") is not None:
            missing["retry"] = missing["retry"].backoff_only()
        # a default equal to what the job holds changes nothing: no copy to revalidate
        missing = {name: value for name, value in missing.items() if getattr(self, name) != value}
        return self.replace(**missing) if missing else self

    def _key(self) -> tuple:
        return (self._kind, self._args_json, self._queue, self._priority, self._run_at, self._delay,
                self._max_attempts, self._timeout, self._unique, self._tags, self._metadata_json,
                self._ordering_key, self._retry, self._expires_in)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        extras = "".join(f", {name}={getattr(self, name)!r}" for name in (
            "queue", "priority", "run_at", "delay", "max_attempts", "timeout", "unique",
            "ordering_key", "retry", "expires_in") if getattr(self, name) not in (None, JOB_DEFAULTS.get(name)))
        return f"Job({self._kind!r}, {self._args!r}{extras})"

    def bulk_shape(self) -> Optional[tuple]:
        """What a chunk inserted args-only shares (awa.insert_uniform_jobs); None: unique, scheduled or ordered."""
        if not self.ready_and_plain() or self._ordering_key is not None:
            return None
        return (self._kind, self._queue, self._priority, self._max_attempts, self._timeout,
                self._tags, self._metadata_json, self.retry_json, self._expires_in)

    def with_checked_metadata(self, metadata: Dict[str, Any], metadata_json: str) -> "Job":
        """A copy with metadata already encoded by check_json; nothing else is checked again."""
        copy = object.__new__(Job)
        for name in Job.__slots__:
            setattr(copy, name, getattr(self, name))
        copy._metadata, copy._metadata_json = metadata, metadata_json
        return copy

    @property
    def retry_json(self) -> Optional[str]:
        """The stored form of this job's retry policy (None: the standard backoff)."""
        return self._retry.as_json() if self._retry is not None else None

    def ready_and_plain(self) -> bool:
        """Ready now, with no unique key: the bulk fast path can insert it."""
        return self._unique is None and self._run_at is None and not self._delay

    def insert_element(self) -> str:
        """This job as one element of the JSON array awa.insert_jobs and
        awa.insert_ready_jobs read, built as text so the already-validated
        args JSON is not encoded a second time."""
        parts = ['{"kind":', _quote(self._kind), ',"queue":', _quote(self._queue),
                 ',"args":', self._args_json, ',"priority":', str(self._priority),
                 ',"max_attempts":', str(self._max_attempts)]
        if self._run_at is not None:
            parts += [',"run_at":', _quote(self._run_at.isoformat())]
        elif self._delay:
            parts += [',"delay_s":', repr(self._delay)]
        if self._timeout is not None:
            parts += [',"timeout_s":', repr(self._timeout)]
        if self._tags:
            parts += [',"tags":', _encode(list(self._tags))]
        if self._metadata:
            parts += [',"metadata":', self._metadata_json]
        if self._unique is not None:
            parts += [',"unique_opts":', _encode(self._unique.as_sql_options())]
        if self._ordering_key is not None:
            parts += [',"ordering_key":', _quote(self._ordering_key)]
        if self._retry is not None:
            parts += [',"retry_policy":', self._retry.as_json()]
        if self._expires_in is not None:
            parts += [',"expires_in_s":', repr(self._expires_in)]
        parts.append("}")
        return "".join(parts)


def _check_tags(tags: Any) -> Tuple[str, ...]:
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
        raise TypeError("tags must be a collection of strings, not a single string")
    tag_tuple = tuple(tags)
    if len(tag_tuple) > MAX_TAGS:
        raise ValueError(f"a job may have at most {MAX_TAGS} tags, got {len(tag_tuple)}")
    for tag in tag_tuple:
        check_name(tag, "each tag")
    return tag_tuple


@dataclass(frozen=True)
class JobRecord:
    """A job as stored, returned by get_job / list_jobs / wait."""

    id: int
    kind: str
    queue: str
    args: Dict[str, Any]
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    run_at: Optional[datetime]
    created_at: datetime
    finalized_at: Optional[datetime]
    tags: Tuple[str, ...]
    metadata: Dict[str, Any]
    result: Any
    progress: Optional[Dict[str, Any]]
    errors: List[Dict[str, Any]]
    attempts: List[Dict[str, Any]]
    timeout: Optional[float] = None
    crashes: int = 0
    dead_lettered: bool = False
    batch_id: Optional[int] = None
    ordering_key: Optional[str] = None
    callback_id: Optional[str] = None
    attempted_at: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    retry_policy: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "JobRecord":
        state = JobState(row["state"])
        attempts = list(row.get("attempt_log") or [])
        if state in TERMINAL_STATES and row.get("attempted_at") is not None and row.get("wall_s") is not None:
            attempts.append({
                "attempt": row["attempt"],
                "started_at": row["attempted_at"],
                "finished_at": row.get("finalized_at"),
                "outcome": state.value,
                "wall_seconds": row.get("wall_s"),
                "cpu_seconds": row.get("cpu_s"),
                "peak_rss_bytes": row.get("peak_rss"),
            })
        for entry in attempts:
            for key in ("wall_seconds", "cpu_seconds", "peak_rss_bytes"):
                entry.setdefault(key, None)
        callback_id = row.get("callback_id")
        return cls(
            id=row["id"], kind=row["kind"], queue=row["queue"], args=row["args"] or {},
            state=state, priority=row["priority"], attempt=row["attempt"],
            max_attempts=row["max_attempts"], run_at=row.get("run_at"),
            created_at=row["created_at"], finalized_at=row.get("finalized_at"),
            tags=tuple(row.get("tags") or ()), metadata=row.get("metadata") or {},
            result=row.get("result"), progress=row.get("progress"),
            errors=list(row.get("errors") or []), attempts=attempts,
            timeout=row.get("timeout_s"), crashes=row.get("crashes") or 0,
            dead_lettered=bool(row.get("dead_lettered")), batch_id=row.get("batch_id"),
            ordering_key=row.get("ordering_key"),
            callback_id=str(callback_id) if callback_id is not None else None,
            attempted_at=row.get("attempted_at"), expires_at=row.get("expires_at"),
            retry_policy=row.get("retry_policy"),
        )
