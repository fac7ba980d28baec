"""Lifecycle hooks of an embedded Pool (on_started, on_stopping,
on_outcome) and the events they receive (PoolInfo, OutcomeEvent).

They ride on the supervisor's internal hooks (on_event, on_outcome), as
the metrics do, so they run in the supervisor's loop: a hook must be quick
and must not block, since every job waits behind it. A hook that raises is
logged (with its traceback the first time, then a count at most once a
minute) and the loop goes on.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from .inflight import Finished
from .outcomes import KILLED, RELEASED

log = logging.getLogger(__name__)

HOOK_EVENTS = ("started", "stopping", "outcome")
REPEAT_LOG_S = 60.0


@dataclass(frozen=True)
class PoolInfo:
    """A running pool, as on_started and on_stopping see it."""

    supervisor_id: int
    pid: int
    hostname: str
    workers: int
    queues: Tuple[str, ...]
    reason: Optional[str] = None  # on_stopping: "SIGTERM", "SIGINT", "stop requested", or an error


@dataclass(frozen=True)
class OutcomeEvent:
    """How one attempt of a job ended, as on_outcome sees it.

    outcome: completed, failed, fatal, retry, snooze, cancel, wait, crash,
    timeout or interrupted (the SQL outcome names; a job handed back before
    it started is not reported). wall_seconds and cpu_seconds are None when
    the child died before it could measure them (crash, timeout,
    interrupted); peak_rss_bytes is the child's peak while running it.
    """

    job_id: int
    kind: str
    queue: str
    attempt: int
    outcome: str
    wall_seconds: Optional[float]
    cpu_seconds: Optional[float]
    error: Optional[str] = None
    peak_rss_bytes: Optional[int] = None


def chain(first: Optional[Callable[..., Any]], second: Callable[..., Any]) -> Callable[..., Any]:
    """One hook calling `first` (if any) then `second` with the same arguments."""
    if first is None:
        return second

    def both(*args: Any) -> None:
        first(*args)
        second(*args)

    return both


class PoolHooks:
    """The hooks registered on one Pool, attached to each supervisor it runs."""

    def __init__(self) -> None:
        self.hooks: Dict[str, List[Callable[[Any], Any]]] = {event: [] for event in HOOK_EVENTS}
        self.info: Optional[PoolInfo] = None  # set once started, for on_stopping
        self.stopping_told = False
        self.failures: Dict[int, Tuple[int, float]] = {}  # id(hook) -> (failures not yet logged, last log)
        self.supervisor: Any = None

    def add(self, event: str, hook: Callable[[Any], Any]) -> None:
        if not callable(hook):
            raise TypeError(f"the on_{event} hook must be callable, got {type(hook).__name__}")
        self.hooks[event].append(hook)

    def attach(self, supervisor: Any) -> None:
        """Chain this pool's hooks onto a supervisor about to run (outcome
        events only when someone listens: they cost an object per job)."""
        self.info, self.stopping_told = None, False
        self.supervisor = supervisor
        supervisor.on_event = chain(supervisor.on_event, self._on_event)
        if self.hooks["outcome"]:
            supervisor.on_outcome = chain(supervisor.on_outcome, self._on_outcome)

    def _on_event(self, name: str, fields: Dict[str, Any]) -> None:
        if name == "started":
            sup = self.supervisor
            self.info = PoolInfo(supervisor_id=sup.supervisor_id, pid=sup.pid, hostname=sup.hostname,
                                 workers=sup.config.workers, queues=tuple(sorted(sup.queues)))
            self._call("started", self.info)
        elif name in ("draining", "stopping"):
            self._tell_stopping(fields.get("reason") or "stopping")

    def _tell_stopping(self, reason: str) -> None:
        if self.info is not None and not self.stopping_told:
            self.stopping_told = True
            self._call("stopping", replace(self.info, reason=reason))

    def _on_outcome(self, finished: Finished) -> None:
        outcome, job = finished.outcome, finished.job
        if job is None or outcome.outcome == RELEASED:
            return
        measured = outcome.outcome not in KILLED
        self._call("outcome", OutcomeEvent(
            job_id=outcome.job_id, kind=job.kind, queue=job.queue, attempt=job.attempt,
            outcome=outcome.outcome, wall_seconds=outcome.wall_s if measured else None,
            cpu_seconds=outcome.cpu_s if measured else None, error=outcome.error,
            peak_rss_bytes=outcome.peak_rss))

    def stopped(self, error: Optional[BaseException]) -> None:
        """The supervisor's run ended: tell on_stopping if nothing did (the
        loop failed, or ended without a drain)."""
        self._tell_stopping(f"error: {type(error).__name__}: {error}" if error is not None else "stopped")

    def _call(self, event: str, value: Any) -> None:
        for hook in self.hooks[event]:
            try:
                hook(value)
            except Exception:
                self._log_failure(event, hook)

    def _log_failure(self, event: str, hook: Callable[[Any], Any]) -> None:
        name = getattr(hook, "__qualname__", repr(hook))
        unlogged, last = self.failures.get(id(hook), (0, None))
        now = time.monotonic()
        if last is None:
            log.exception("the on_%s hook %s raised (ignored; the pool goes on)", event, name)
            self.failures[id(hook)] = (0, now)
        elif now - last >= REPEAT_LOG_S:
            log.error("the on_%s hook %s raised %d more time(s) (ignored)", event, name, unlogged + 1)
            self.failures[id(hook)] = (0, now)
        else:
            self.failures[id(hook)] = (unlogged + 1, last)
