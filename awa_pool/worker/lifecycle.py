"""A supervisor's life: starting, running, and the way down. A stop
request (SIGTERM, SIGINT, Supervisor.request_shutdown) drains: no new
jobs, the running ones may finish within shutdown_timeout. A second signal,
that timeout, or a fatal error stops: children are interrupted, and those
still there after STOP_GRACE_S are killed (their jobs go back as
available). Then the supervisor writes what its children reported and
marks itself stopped."""
from __future__ import annotations

import logging
import signal
import time
from typing import Callable, Iterable, Optional, Tuple

from .children import ChildHandle, Children

log = logging.getLogger(__name__)

from .states import DRAINING, RUNNING, STARTING, STOPPED, STOPPING  # noqa: F401  (their names here too)
STOP_GRACE_S = 5.0   # interrupted children that have not exited by then are killed


class Lifecycle:
    def __init__(self, children: Children, shutdown_timeout: float, on_drain: Callable[[str], None],
                 on_killed: Callable[[ChildHandle], None], on_stopped: Callable[[], None]) -> None:
        self.children = children
        self.shutdown_timeout = shutdown_timeout
        self.on_drain = on_drain        # give back the jobs not started yet (and say why)
        self.on_killed = on_killed      # a child killed at the end: reap it, record its outcomes
        self.on_stopped = on_stopped    # the final flush, before the state is STOPPED
        self.state = STARTING
        self.drain_deadline: Optional[float] = None
        self.stop_deadline: Optional[float] = None

    @property
    def winding_down(self) -> bool:
        return self.state in (DRAINING, STOPPING)

    def on_signals(self, taken: Iterable[Tuple[int, Optional[str]]]) -> None:
        """Act on the signals the relay took (name None: a stop request)."""
        for signum, name in taken:
            if signum == signal.SIGHUP:
                log.info("SIGHUP ignored (restart the supervisor to reload the app)")
            elif self.state == RUNNING:
                log.info("%s: draining (no new jobs; waiting up to %gs for running ones)",
                         name or "stop requested", self.shutdown_timeout)
                self.begin_drain(name or "stop requested")
            elif self.state == DRAINING and name is not None:  # a repeated stop() does not escalate
                log.warning("second %s: stopping now; running jobs go back to the queue", name)
                self.begin_stop()

    def begin_drain(self, reason: str) -> None:
        self.state = DRAINING
        self.drain_deadline = time.monotonic() + self.shutdown_timeout
        self.on_drain(reason)

    def begin_stop(self) -> None:
        """Interrupt whatever still runs; its jobs go back as available."""
        self.state = STOPPING
        self.stop_deadline = time.monotonic() + STOP_GRACE_S
        self.children.interrupt()

    def advance(self, now: float) -> None:
        """One step down, as far as the children allow now."""
        if self.state == DRAINING:
            if self.children.any_busy():
                if self.drain_deadline is not None and now >= self.drain_deadline:
                    log.warning("shutdown timeout reached; killing the children still running jobs")
                    self.begin_stop()
                return
            self.begin_stop()
        if self.state == STOPPING:
            self.children.stop_idle()
            if self.children.all() and now < (self.stop_deadline or now):
                return
            for child in self.children.all():  # did not exit in time
                self.children.kill(child, "interrupted", "interrupted by supervisor shutdown")
                child.process.join(timeout=2)
                self.on_killed(child)
            self.on_stopped()
            self.state = STOPPED
