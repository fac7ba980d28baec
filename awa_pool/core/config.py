"""Pool and queue configuration: defaults, validation, and the parsers for
`--queue NAME[=WEIGHT][,min=N][,max=N][,rate=R/s][,aging=S][,dlq]`,
durations (`30s`, `24h`, `7d`) and sizes (`512MB`).

Pure: no I/O. Every bad value raises ConfigError with one clear line.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Union

from .errors import ConfigError
from .job import MAX_NAME_LEN, check_name

DEFAULT_AGING_S = 60.0
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 30.0
DEFAULT_MAX_CRASHES = 3
DEFAULT_RETENTION_COMPLETED_S = 24 * 3600.0
DEFAULT_RETENTION_FAILED_S = 7 * 24 * 3600.0
DEFAULT_CANCEL_GRACE_S = 10.0
DEFAULT_DEADLINE_GRACE_S = 30.0


@dataclass(frozen=True)
class QueueConfig:
    """How a supervisor serves one queue.

    weight: share of spare children; min: children guaranteed when the queue
    has work; max: cap on children; rate: job starts per second across all
    supervisors; aging: seconds per priority level of aging (0 disables);
    dlq: exhausted jobs go to the dead-letter queue.
    """

    weight: float = 1.0
    min: int = 0
    max: Optional[int] = None
    rate: Optional[float] = None
    aging: float = DEFAULT_AGING_S
    dlq: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.aging, timedelta):
            object.__setattr__(self, "aging", self.aging.total_seconds())
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not self.weight > 0:
            raise ConfigError(f"queue weight must be a number > 0, got {self.weight!r}")
        if isinstance(self.min, bool) or not isinstance(self.min, int) or self.min < 0:
            raise ConfigError(f"queue min must be an int >= 0, got {self.min!r}")
        if self.max is not None and (isinstance(self.max, bool) or not isinstance(self.max, int) or self.max < 1):
            raise ConfigError(f"queue max must be an int >= 1, got {self.max!r}")
        if self.max is not None and self.max < self.min:
            raise ConfigError(f"queue max ({self.max}) is below its min ({self.min})")
        if self.rate is not None and (isinstance(self.rate, bool) or not isinstance(self.rate, (int, float))
                                      or not self.rate > 0):
            raise ConfigError(f"queue rate must be > 0 jobs/s, got {self.rate!r}")
        if isinstance(self.aging, bool) or not isinstance(self.aging, (int, float)) or self.aging < 0:
            raise ConfigError(f"queue aging must be seconds >= 0, got {self.aging!r}")


def parse_queue_spec(spec: str) -> "tuple[str, QueueConfig]":
    """`images=3,min=2,max=6,rate=10/s,aging=30,dlq` -> ("images", QueueConfig(...))."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("empty --queue spec: expected NAME[=WEIGHT][,min=N][,max=N][,rate=R/s][,aging=S][,dlq]")
    parts = [part.strip() for part in spec.split(",")]
    head, options = parts[0], parts[1:]
    name, _, weight_text = head.partition("=")
    name = name.strip()
    if not name:
        raise ConfigError(f"--queue {spec!r}: the queue name is missing")
    if len(name) > MAX_NAME_LEN:
        raise ConfigError(f"--queue {spec[:40]!r}...: queue names are at most {MAX_NAME_LEN} characters")
    try:
        check_name(name, "the queue name")
    except ValueError as exc:
        raise ConfigError(f"--queue {spec!r}: {exc}") from None
    values: Dict[str, object] = {}
    if weight_text.strip():
        values["weight"] = _number(weight_text, spec, "weight")
    elif "=" in head:
        raise ConfigError(f"--queue {spec!r}: '=' must be followed by a weight")
    for option in options:
        if not option:
            raise ConfigError(f"--queue {spec!r}: empty option between commas")
        key, has_value, value = option.partition("=")
        key = key.strip().lower()
        if key == "dlq" and not has_value:
            values["dlq"] = True
        elif key in ("min", "max"):
            if not has_value:
                raise ConfigError(f"--queue {spec!r}: {key} needs a value, like {key}=2")
            values[key] = _int(value, spec, key)
        elif key == "rate":
            values["rate"] = _rate(value, spec)
        elif key == "aging":
            values["aging"] = parse_duration(value, what=f"--queue {spec!r} aging")
        elif key == "weight":
            values["weight"] = _number(value, spec, "weight")
        else:
            raise ConfigError(f"--queue {spec!r}: unknown option {key!r} "
                              "(known: min, max, rate, aging, dlq, weight)")
    try:
        return name, QueueConfig(**values)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(f"--queue {spec!r}: {exc}") from None


def _number(text: str, spec: str, what: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(f"--queue {spec!r}: {what} must be a number, got {text.strip()!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"--queue {spec!r}: {what} must be > 0, got {text.strip()!r}")
    return value


def _int(text: str, spec: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ConfigError(f"--queue {spec!r}: {what} must be an integer, got {text.strip()!r}") from None


def _rate(text: str, spec: str) -> float:
    try:
        return parse_rate(text)
    except ConfigError as exc:
        raise ConfigError(f"--queue {spec!r}: {exc}") from None


_RATE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(?:/\s*(s|sec|second|m|min|minute|h|hour))?\s*")
_RATE_PER = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def parse_rate(value: Union[str, int, float], what: str = "rate") -> float:
    """Jobs per second from `10/s`, `30/m`, `100/h` or a number per second."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"{what} must be a number per second or text like 10/s, not {type(value).__name__}")
    if isinstance(value, str):
        match = _RATE.fullmatch(value)
        if not match:
            raise ConfigError(f"{what} must look like 10/s, 30/m or 100/h, got {value.strip()[:40]!r}")
        per_s = float(match.group(1)) / _RATE_PER[match.group(2) or "s"]
    else:
        per_s = float(value)
    if not per_s > 0 or per_s == float("inf"):
        raise ConfigError(f"{what} must be > 0, got {value!r}")
    return per_s


_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|sec|m|min|h|d|w)?\s*", re.I)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: Union[str, int, float, timedelta], *, what: str = "duration") -> float:
    """`30s`, `5m`, `24h`, `7d`, a plain number of seconds, or a timedelta -> seconds."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ConfigError(f"{what} must be a duration like 30s, 5m, 24h or 7d")
    elif isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(str(value))
        if not match:
            raise ConfigError(f"{what} must be a duration like 30s, 5m, 24h or 7d, got {value!r}")
        seconds = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
    if seconds < 0 or seconds != seconds:
        raise ConfigError(f"{what} must not be negative")
    return seconds


_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b?|b)?\s*", re.I)


def parse_size(value: Union[str, int, float], *, what: str = "size") -> int:
    """`512MB`, `2GB`, `300` (plain numbers are MB) -> bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a size like 512MB or 2GB")
    if isinstance(value, (int, float)):
        number, unit = float(value), "m"
    else:
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise ConfigError(f"{what} must be a size like 512MB or 2GB, got {value!r}")
        number, unit = float(match.group(1)), (match.group(2) or "m").lower()
    factor = {"b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}[unit[0]]
    size = int(number * factor)
    if size <= 0:
        raise ConfigError(f"{what} must be > 0")
    return size


QueuesArg = Union[None, Sequence[str], Mapping[str, Union[QueueConfig, Mapping[str, object]]]]


def parse_queues(queues: QueuesArg) -> Dict[str, QueueConfig]:
    """A list of CLI specs or a dict of name -> QueueConfig (or its kwargs)."""
    if queues is None:
        return {}
    result: Dict[str, QueueConfig] = {}
    if isinstance(queues, Mapping):
        for name, value in queues.items():
            try:
                check_name(name, "queue name")
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"invalid queue name {name!r}: {exc}") from None
            if isinstance(value, QueueConfig):
                result[name] = value
            elif isinstance(value, Mapping):
                result[name] = QueueConfig(**value)  # type: ignore[arg-type]
            else:
                raise ConfigError(f"queue {name!r}: expected a QueueConfig, got {type(value).__name__}")
        return result
    if isinstance(queues, str):
        queues = [queues]
    for spec in queues:
        name, config = parse_queue_spec(spec)
        if name in result:
            raise ConfigError(f"queue {name!r} is given twice")
        result[name] = config
    return result


DURATION_OPTIONS = ("shutdown_timeout", "connect_timeout", "retention_completed", "retention_failed",
                    "cancel_grace", "heartbeat_interval", "heartbeat_staleness", "deadline_grace",
                    "poll_interval")


@dataclass(frozen=True)
class PoolConfig:
    """Everything a supervisor needs; built by the CLI or awa_pool.Pool."""

    dsn: str
    # A direct URL for what needs a session (LISTEN, the leader lock, the
    # liveness lock) when `dsn` points at a transaction-mode pooler.
    session_dsn: Optional[str] = None
    app: Optional[str] = None
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    queues: Dict[str, QueueConfig] = field(default_factory=dict)
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    max_tasks_per_child: Optional[int] = None
    max_memory_per_child: Optional[int] = None
    max_crashes: int = DEFAULT_MAX_CRASHES
    retention_completed: float = DEFAULT_RETENTION_COMPLETED_S
    retention_failed: float = DEFAULT_RETENTION_FAILED_S
    cancel_grace: float = DEFAULT_CANCEL_GRACE_S
    metrics_port: Optional[int] = None
    health_port: Optional[int] = None     # /livez and /readyz (ops/health.py)
    health_host: str = "0.0.0.0"
    heartbeat_interval: float = 2.0
    heartbeat_staleness: float = 10.0
    deadline_grace: float = DEFAULT_DEADLINE_GRACE_S  # the leader's backstop, past a job's deadline
    poll_interval: float = 1.0
    leader: bool = True
    max_batch_per_child: int = 64
    result_max_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"workers must be an int >= 1, got {self.workers!r}")
        for name in DURATION_OPTIONS:
            value = getattr(self, name)
            if isinstance(value, timedelta):  # every duration: seconds or a timedelta
                value = value.total_seconds()
                object.__setattr__(self, name, value)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{name} must be seconds >= 0 or a timedelta, got {value!r}")
        if self.max_tasks_per_child is not None and (
                isinstance(self.max_tasks_per_child, bool) or not isinstance(self.max_tasks_per_child, int)
                or self.max_tasks_per_child < 1):
            raise ConfigError(f"max_tasks_per_child must be an int >= 1, got {self.max_tasks_per_child!r}")
        if self.max_memory_per_child is not None and (
                not isinstance(self.max_memory_per_child, int) or self.max_memory_per_child <= 0):
            raise ConfigError(f"max_memory_per_child must be bytes > 0, got {self.max_memory_per_child!r}")
        if isinstance(self.max_crashes, bool) or not isinstance(self.max_crashes, int) or self.max_crashes < 1:
            raise ConfigError(f"max_crashes must be an int >= 1, got {self.max_crashes!r}")
        if self.metrics_port is not None and not (0 <= self.metrics_port <= 65535):
            raise ConfigError(f"metrics port must be 0-65535, got {self.metrics_port}")
        if self.health_port is not None and (isinstance(self.health_port, bool) or not isinstance(
                self.health_port, int) or not 0 <= self.health_port <= 65535):
            raise ConfigError(f"health port must be an int 0-65535, got {self.health_port!r}")
        if not isinstance(self.health_host, str) or not self.health_host:
            raise ConfigError(f"health host must be an address to bind, got {self.health_host!r}")
        minimums = sum(q.min for q in self.queues.values())
        if minimums > self.workers:
            raise ConfigError(f"queue minimums add up to {minimums}, more than the {self.workers} workers")

    def with_queues(self, names: Iterable[str]) -> "PoolConfig":
        """Add default configs for queues not configured explicitly."""
        queues = dict(self.queues)
        for name in names:
            queues.setdefault(name, QueueConfig())
        return replace(self, queues=queues)

    def queue_names(self) -> List[str]:
        return sorted(self.queues)
