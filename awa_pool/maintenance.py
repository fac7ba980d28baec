"""Leader-only maintenance services. Each has its own interval, works in
bounded batches and exposes `tick(cur)`, so tests can drive one service
step by step without a running supervisor.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Sequence

from .sql import QUERIES

log = logging.getLogger(__name__)

BATCH = 1000
MAX_BATCHES_PER_TICK = 20


class Service:
    """One maintenance duty. Subclasses set `name` and `interval` and
    implement `tick(cur) -> int` (how many rows it handled)."""

    name = "service"
    interval = 1.0

    def tick(self, cur: Any) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


class PromoteDue(Service):
    """Scheduled and retryable jobs whose time has come become available
    (and their queues are woken by the hot table's NOTIFY trigger)."""

    name = "promote"
    interval = 0.25

    def tick(self, cur: Any) -> int:
        total = 0
        for _ in range(MAX_BATCHES_PER_TICK):
            cur.execute(QUERIES["promote_due"], {"limit": BATCH})
            moved = cur.fetchone()[0]
            total += moved
            if moved < BATCH:
                break
        return total


class RescueLost(Service):
    """Running jobs of supervisors that stopped heartbeating go back to the queue."""

    name = "rescue_lost"
    interval = 1.0

    def __init__(self, stale_s: float) -> None:
        self.stale_s = stale_s

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["rescue_lost"], {"stale_s": self.stale_s, "limit": 500})
        rows = cur.fetchall()
        for job_id, state in rows:
            log.warning("rescued job %d from a lost supervisor (now %s)", job_id, state)
        return len(rows)


class RescueDeadlines(Service):
    """Backstop: attempts long past their deadline whose supervisor is alive
    but did not stop them."""

    name = "rescue_deadlines"
    interval = 5.0

    def __init__(self, grace_s: float = 30.0) -> None:
        self.grace_s = grace_s

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["rescue_deadlines"], {"grace_s": self.grace_s, "limit": 500})
        rows = cur.fetchall()
        for job_id, state in rows:
            log.warning("rescued job %d past its deadline (now %s)", job_id, state)
        return len(rows)


class ExpireCallbacks(Service):
    """Jobs waiting on a callback past its timeout count a failed attempt."""

    name = "expire_callbacks"
    interval = 1.0

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["expire_callbacks"], {"limit": 500})
        rows = cur.fetchall()
        for job_id, state in rows:
            log.info("callback of job %d timed out (now %s)", job_id, state)
        return len(rows)


class ForgetSupervisors(Service):
    """Drop registrations of supervisors gone for long."""

    name = "forget_supervisors"
    interval = 60.0

    def __init__(self, after_s: float = 3600.0) -> None:
        self.after_s = after_s

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["forget_supervisors"], {"after_s": self.after_s})
        return cur.rowcount


class Maintenance:
    """Runs the services that are due. Not thread-safe: one runner per leader."""

    def __init__(self, services: Sequence[Service]) -> None:
        self.services: List[Service] = list(services)
        self.next_run: Dict[str, float] = {}
        self.last_error: Optional[str] = None

    def reset(self) -> None:
        """Run every service on the next pass (after becoming leader)."""
        self.next_run.clear()

    def run_due(self, cur: Any, now: Optional[float] = None) -> float:
        """Run due services; returns seconds until the next one is due."""
        now = time.monotonic() if now is None else now
        for service in self.services:
            if self.next_run.get(service.name, 0.0) <= now:
                service.tick(cur)
                self.next_run[service.name] = time.monotonic() + service.interval
        return max(0.0, min(self.next_run.values(), default=now + 1.0) - time.monotonic())

    def get(self, name: str) -> Service:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)


def default_services(*, heartbeat_staleness: float, deadline_grace: float = 30.0) -> List[Service]:
    return [PromoteDue(), RescueLost(heartbeat_staleness), RescueDeadlines(deadline_grace),
            ExpireCallbacks(), ForgetSupervisors()]
