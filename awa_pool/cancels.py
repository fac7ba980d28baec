"""Cancel requests for running jobs, relayed from the database to the
children that hold them.

Two roads lead here: a NOTIFY on awa_cancel (fast, but only a hint: any role
that can connect may send one, so the database must confirm it) and a sweep
that asks the database which held jobs were cancelled (the backstop for a
NOTIFY no LISTEN session heard). A handler that does not stop within the
grace period loses its child.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, List, Optional, Tuple

from .children import ChildHandle, Children
from .sql import QUERIES

log = logging.getLogger(__name__)

# The supervisor's "run fn(cursor), or log and return None" (Supervisor._db).
Db = Callable[[str, Callable[[Any], Any]], Any]


class CancelRelay:
    def __init__(self, children: Children, grace_s: float, db: Db) -> None:
        self.children = children
        self.grace_s = grace_s
        self.db = db

    def on_notified(self, cancels: Iterable[Tuple[int, Optional[int]]], now: float) -> None:
        """Relay the cancels named by NOTIFY that the database confirms."""
        for job_id, _lease in cancels:
            holders = self._holders(job_id)
            if not holders:
                continue
            confirmed = self.db("confirming a cancel request", lambda cur: (
                cur.execute(QUERIES["job_cancelled"], {"id": job_id}), cur.fetchone()[0])[1])
            if not confirmed:
                if confirmed is not None:
                    log.warning("ignoring a cancel notification for job %d: the job is not cancelled",
                                job_id)
                continue
            self._relay(job_id, holders, now)

    def sweep(self, now: float) -> None:
        """Ask the database which jobs held by children were cancelled. Runs
        at every heartbeat, after a reconnect, and at every poll when LISTEN
        does not work (behind a transaction-mode pooler)."""
        held = [job.id for child in self.children.all() for job in child.inflight]
        if not held:
            return
        cancelled = self.db("looking for cancelled jobs", lambda cur: (cur.execute(
            QUERIES["cancelled_among"], {"ids": held}), [row[0] for row in cur.fetchall()])[1])
        for job_id in cancelled or ():
            self._relay(job_id, self._holders(job_id), now)

    def enforce_grace(self, child: ChildHandle, running_id: int, now: float) -> None:
        """Kill a child whose cancelled handler outlived the grace period."""
        if child.cancel_deadline is None or now < child.cancel_deadline:
            return
        if running_id and child.status.cancel_requested_for(running_id):
            self.children.kill(child, "released", "cancelled: the handler did not stop "
                                                  "within the grace period")
        child.cancel_deadline = None

    def _holders(self, job_id: int) -> List[ChildHandle]:
        return [child for child in self.children.all() if any(job.id == job_id for job in child.inflight)]

    def _relay(self, job_id: int, holders: List[ChildHandle], now: float) -> None:
        for child in holders:
            if child.status.cancel_requested_for(job_id):
                continue  # already told
            child.status.request_cancel(job_id)
            child.cancel_deadline = now + self.grace_s
            log.info("cancel requested for job %d (child %d)", job_id, child.pid)
