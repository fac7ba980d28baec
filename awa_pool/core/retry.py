"""RetryPolicy: how a task's failed attempts back off, and which exceptions
are not worth another attempt.

The backoff part (backoff, base, max_delay, jitter) is stored with each job
and the database computes the delay from it (awa.backoff_s), so every
supervisor and every path that retries (a failure, a crash, a timeout, a
callback that timed out, a rescue) agrees. Which exceptions give up at once
(retry_on, give_up_on) is decided in the child, where the exception is, and
comes from the task's declaration. Standard library only: children import it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Optional, Tuple, Type, Union

from .errors import Seconds, to_seconds

BACKOFFS = ("exponential", "linear", "constant")
MAX_DELAY_LIMIT_S = 366 * 86400.0   # awa.check_retry_policy's bound too

ExceptionTypes = Union[Type[BaseException], Tuple[Type[BaseException], ...]]


def _exception_types(value: Any, what: str) -> Tuple[Type[BaseException], ...]:
    items = value if isinstance(value, (tuple, list, frozenset, set)) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"RetryPolicy {what} must be exception classes (like ValueError), "
                            f"got {item!r} ({type(item).__name__})")
    return tuple(items)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"RetryPolicy {what} must be a number, not {type(value).__name__}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"RetryPolicy {what} must be a finite number")
    return float(value)


@dataclass(frozen=True)
class RetryPolicy:
    """How failed attempts are retried.

    The delay after attempt n (1-based) is `base ** n` seconds
    (exponential), `base * n` (linear) or `base` (constant), plus up to
    `jitter` of it at random, and at most `max_delay`. The default is the
    standard backoff: 2^n seconds plus up to 25 %, capped at a day.

    An exception that is an instance of `give_up_on`, or an `Exception`
    that is not an instance of `retry_on`, fails the job at once (outcome
    `fatal`, the reason in its error). A handler's `raise Retry(delay=...)`
    is never filtered and its delay wins over the backoff.
    """

    backoff: str = "exponential"
    base: float = 2.0
    max_delay: Seconds = 86400.0
    jitter: float = 0.25
    retry_on: ExceptionTypes = (Exception,)
    give_up_on: ExceptionTypes = field(default=())

    def __post_init__(self) -> None:
        if self.backoff not in BACKOFFS:
            raise ValueError(f"RetryPolicy backoff must be 'exponential', 'linear' or 'constant', "
                             f"got {self.backoff!r}")
        base = _number(self.base, "base")
        if base < 0:
            raise ValueError(f"RetryPolicy base must be >= 0 seconds, got {base:g}")
        if self.backoff == "exponential" and base < 1:
            raise ValueError(f"RetryPolicy base must be >= 1 for an exponential backoff (the delay is "
                             f"base ** attempt seconds), got {base:g}")
        max_delay = to_seconds(self.max_delay, "RetryPolicy max_delay", allow_zero=False)
        assert max_delay is not None
        if max_delay > MAX_DELAY_LIMIT_S:
            raise ValueError(f"RetryPolicy max_delay must be at most 366 days, got {max_delay:g} s")
        jitter = _number(self.jitter, "jitter")
        if not 0 <= jitter <= 1:
            raise ValueError(f"RetryPolicy jitter must be from 0 to 1 (a fraction of the delay "
                             f"added at random), got {jitter:g}")
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "max_delay", max_delay)
        object.__setattr__(self, "jitter", jitter)
        object.__setattr__(self, "retry_on", _exception_types(self.retry_on, "retry_on"))
        object.__setattr__(self, "give_up_on", _exception_types(self.give_up_on, "give_up_on"))

    @property
    def filters_exceptions(self) -> bool:
        """Whether retry_on or give_up_on differ from retrying every Exception."""
        return self.retry_on != (Exception,) or bool(self.give_up_on)

    def backoff_only(self) -> "RetryPolicy":
        """The same delays, retrying every exception: what a Job stores."""
        return replace(self, retry_on=(Exception,), give_up_on=()) if self.filters_exceptions else self

    def as_sql(self) -> Dict[str, Any]:
        """What the database stores and awa.backoff_s reads."""
        return {"backoff": self.backoff, "base": self.base, "max_delay": self.max_delay,
                "jitter": self.jitter}

    def as_json(self) -> str:
        return json.dumps(self.as_sql(), separators=(",", ":"))

    def gives_up(self, exc: BaseException) -> Optional[str]:
        """Why `exc` is not retried (None: retry it as usual)."""
        if isinstance(exc, self.give_up_on):
            return f"{type(exc).__name__} is in the task's give_up_on"
        if isinstance(exc, Exception) and not isinstance(exc, self.retry_on):
            return f"{type(exc).__name__} is not in the task's retry_on"
        return None


def check_retry(value: Any, what: str = "retry") -> Optional[RetryPolicy]:
    if value is not None and not isinstance(value, RetryPolicy):
        raise TypeError(f"{what} must be an awa_pool.RetryPolicy, not {type(value).__name__}")
    return value
