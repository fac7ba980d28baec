"""JobContext: what a running handler knows about its job, and the calls it
can make back to its supervisor (progress, callbacks, batch results).

Child side: no database code. The `Channel` is how the context reaches the
outside world: over the pipe in a child, directly to the database in
awa_pool.testing.
"""
from __future__ import annotations

import contextvars
import math
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional, Protocol

from ..core.errors import AwaError, Seconds, to_seconds
from ..core.job import JobRecord, check_json

_current: "contextvars.ContextVar[Optional[JobContext]]" = contextvars.ContextVar(
    "awa_pool_job_context", default=None)

PROGRESS_MAX_BYTES = 64 * 1024
# The follow-up of a batch carries its batch id in this metadata key (set
# by producer.enqueue_batch, which must use the same name).
THEN_OF_KEY = "awa:then_of"


class Channel(Protocol):
    def progress(self, job_id: int, lease: int, progress_json: str) -> None: ...

    def request(self, job_id: int, lease: int, method: str, payload: Any) -> Any: ...

    def cancel_requested(self, job_id: int) -> bool: ...


class WaitForCallback:
    """Return this from a handler to park the job in `waiting_external` until
    the outside world resolves `callback` (from ctx.register_callback)."""

    __slots__ = ("callback",)

    def __init__(self, callback: str) -> None:
        if not isinstance(callback, str) or not callback:
            raise TypeError("WaitForCallback needs the callback id returned by ctx.register_callback()")
        self.callback = callback

    def __repr__(self) -> str:
        return f"WaitForCallback({self.callback!r})"


def _epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, timezone.utc)


class JobContext:
    """The running job, as its handler sees it."""

    def __init__(self, *, id: int, kind: str, queue: str, args: Dict[str, Any], attempt: int,
                 max_attempts: int, priority: int, tags: tuple, metadata: Dict[str, Any],
                 created_at: float, run_at: float, lease: int, timeout_s: Optional[float],
                 progress: Optional[Dict[str, Any]],
                 callback_result: Any, batch_id: Optional[int], channel: Channel) -> None:
        self.id = id
        self.kind = kind
        self.queue = queue
        self.args = args
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.priority = priority
        self.tags = tags
        self.metadata = metadata
        self._created_at = created_at
        self._run_at = run_at
        self.lease = lease
        self.timeout = timeout_s
        self.deadline: Optional[datetime] = (
            datetime.now(timezone.utc) + timedelta(seconds=timeout_s) if timeout_s else None)
        self.progress = progress
        self.progress_dirty = False
        self.callback_result = callback_result
        self.batch_id = batch_id
        self._channel = channel
        self._callback_id: Optional[str] = None

    @property
    def created_at(self) -> datetime:
        return _epoch(self._created_at)

    @property
    def run_at(self) -> datetime:
        return _epoch(self._run_at)

    @property
    def cancel_requested(self) -> bool:
        """True once an operator asked to cancel this job; stop soon when it is."""
        return self._channel.cancel_requested(self.id)

    def set_progress(self, percent: float, message: Optional[str] = None, **metadata: Any) -> None:
        """Record progress (0-100) and a checkpoint; it survives retries, so a
        handler can resume from `ctx.progress["metadata"]`."""
        if isinstance(percent, bool) or not isinstance(percent, (int, float)) or math.isnan(percent):
            raise TypeError("percent must be a number from 0 to 100")
        if not 0 <= percent <= 100:
            raise ValueError(f"percent must be from 0 to 100, got {percent}")
        if message is not None and not isinstance(message, str):
            raise TypeError("message must be a string")
        check_json(metadata, "progress metadata")
        progress = {"percent": percent, "message": message, "metadata": metadata}
        text = check_json(progress, "progress")
        if len(text) > PROGRESS_MAX_BYTES:
            raise ValueError(f"progress is {len(text)} bytes of JSON; the limit is {PROGRESS_MAX_BYTES}")
        self.progress = progress
        self.progress_dirty = True
        self._channel.progress(self.id, self.lease, text)

    def register_callback(self, timeout: Seconds = 3600) -> str:
        """A callback id for an external system; return WaitForCallback(id) to
        park the job until someone calls complete/fail/retry/resume_external."""
        seconds = to_seconds(timeout, "callback timeout", allow_zero=False)
        callback_id = self._channel.request(self.id, self.lease, "register_callback", seconds)
        self._callback_id = callback_id
        return callback_id

    def batch_results(self) -> List[JobRecord]:
        """In a batch's follow-up job: the members' records, in input order
        (results, errors and final states, failed and cancelled included)."""
        batch_id = self.metadata.get(THEN_OF_KEY) if isinstance(self.metadata, dict) else None
        if isinstance(batch_id, bool) or not isinstance(batch_id, int):
            raise AwaError("batch_results() is only available in the follow-up job of a batch "
                           "(enqueue_batch(..., then=job))")
        return self._channel.request(self.id, self.lease, "batch_results", batch_id)


def current_context() -> Optional[JobContext]:
    """The JobContext of the handler running now, or None outside a handler."""
    return _current.get()


def set_current(ctx: Optional[JobContext]) -> "contextvars.Token":
    return _current.set(ctx)


def reset_current(token: "contextvars.Token") -> None:
    _current.reset(token)
