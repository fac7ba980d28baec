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
from typing import Any, Callable, Iterable, Optional, Tuple

from .children import Children
from ..core.sql import QUERIES

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
            if job_id not in self.children.inflight_leases():
                continue
            confirmed = self.db("confirming a cancel request", lambda cur: (
                cur.execute(QUERIES["job_cancelled"], {"id": job_id}), cur.fetchone()[0])[1])
            if not confirmed:
                if confirmed is not None:
                    log.warning("ignoring a cancel notification for job %d: the job is not cancelled",
                                job_id)
                continue
            self._relay(job_id, now)

    def sweep(self, now: float) -> None:
        """Ask the database which jobs held by children were cancelled. Runs
        at every heartbeat, after a reconnect, and at every poll when LISTEN
        does not work (behind a transaction-mode pooler)."""
        held = self.children.held_ids()
        if not held:
            return
        cancelled = self.db("looking for cancelled jobs", lambda cur: (cur.execute(
            QUERIES["cancelled_among"], {"ids": held}), [row[0] for row in cur.fetchall()])[1])
        for job_id in cancelled or ():
            self._relay(job_id, now)

    def _relay(self, job_id: int, now: float) -> None:
        for child in self.children.request_cancel(job_id, now + self.grace_s):
            log.info("cancel requested for job %d (child %d)", job_id, child.pid)
