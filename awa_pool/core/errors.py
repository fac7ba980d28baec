"""Exceptions: the AwaError tree and the handler control-flow signals.

Only the standard library here: child processes import this module.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Optional, Union

Seconds = Union[int, float, timedelta]


class AwaError(Exception):
    """Base class of every error awa_pool raises on purpose."""


class ConfigError(AwaError, ValueError):
    """A setting, option or declaration is invalid (bad queue spec, cron...)."""


class DatabaseUnavailable(AwaError):
    """The database could not be reached within the allowed time."""


class SchemaMissing(AwaError):
    """The database has no awa schema, or an older one than this code needs."""


class UnknownCallback(AwaError, LookupError):
    """A callback id is unknown, or the job it belonged to has moved on."""


class UnknownJob(AwaError, LookupError):
    """No job has this id."""


class PayloadTooLarge(AwaError, ValueError):
    """A result or progress payload exceeds the size limit."""


def to_seconds(value: Optional[Seconds], name: str, *, allow_zero: bool = True) -> Optional[float]:
    """Normalize a delay/timeout/period given as seconds or timedelta."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, not bool")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        seconds = float(value)
    else:
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, not {type(value).__name__}")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number of seconds")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, got {seconds:g}")
    return seconds


class Retry(Exception):
    """Raise in a handler to retry the job (counts as an attempt).

    With `delay` the next attempt runs after that many seconds; without it,
    the standard backoff applies.
    """

    def __init__(self, delay: Optional[Seconds] = None, reason: Optional[str] = None) -> None:
        self.delay = to_seconds(delay, "Retry delay")
        self.reason = reason
        super().__init__(reason or "retry requested")


class Snooze(Exception):
    """Raise in a handler to run the job again after `delay`, attempt not counted."""

    def __init__(self, delay: Seconds) -> None:
        self.delay = to_seconds(delay, "Snooze delay")
        super().__init__(f"snoozed for {self.delay:g}s")


class Cancel(Exception):
    """Raise in a handler to cancel the job for good (never retried)."""

    def __init__(self, reason: str = "cancelled by handler") -> None:
        self.reason = reason
        super().__init__(reason)
