"""The liveness lock, and the leader's fast rescue of a supervisor that died.

Each supervisor holds a session-level advisory lock keyed by its id on its
LISTEN session for as long as it lives (`LivenessLock`). When its process
dies (kill -9, a crash, the OOM killer) the kernel closes its sockets, the
server ends its sessions and the lock is free at once. The leader looks at
every supervisor's lock four times a second (`DeadSupervisors`) and rescues
the running jobs of one whose lock it saw held and now finds free twice in
a row, through the same path as the heartbeat-staleness rescue.

A supervisor cut off by a network partition keeps its sessions on the
server, and with them its lock: only the heartbeat staleness rescues it.
After a server restart or a failover every lock is free until its owner
reconnects, so only a lock seen held on the leader's current connection
counts: the others wait for the heartbeat staleness.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Set

import psycopg2
import psycopg2.errors

from ..core.db import LOCK_CLASS_LIVENESS, first_line
from ..core.sql import QUERIES

log = logging.getLogger(__name__)

RESCUE_BATCH = 500


class LivenessLock:
    """A supervisor's own lock, on the connection it was taken on."""

    def __init__(self) -> None:
        self.conn: Optional[Any] = None

    def held_on(self, conn: Any) -> bool:
        return conn is not None and self.conn is conn and not conn.closed

    def take(self, conn: Any, supervisor_id: int) -> bool:
        """Take the lock on `conn` (an autocommit session). An older session
        of this supervisor that still holds it (its connection died in a
        partition; the server has not noticed) is ended first. True when
        held; False (retry later) when it could not be had within 2 s."""
        if self.held_on(conn):
            return True
        params = {"class": LOCK_CLASS_LIVENESS, "id": supervisor_id}
        self.conn = None
        try:
            with conn.cursor() as cur:
                cur.execute(QUERIES["take_liveness_lock"], params)
                got = bool(cur.fetchone()[0])
                if not got:
                    cur.execute(QUERIES["end_stale_liveness_session"], params)
                    if cur.fetchall():
                        log.info("ended an older session of this supervisor that still held its liveness lock")
                    cur.execute(QUERIES["wait_liveness_lock"], params)
                    got = True
        except (psycopg2.errors.LockNotAvailable, psycopg2.errors.InsufficientPrivilege) as exc:
            log.warning("cannot take the liveness lock yet (%s); the leader falls back to the heartbeat "
                        "to notice this supervisor's death", first_line(exc))
            return False
        self.conn = conn
        return got


class DeadSupervisors:
    """The leader's view of the liveness locks, kept for one leader session.

    `observe` records which locks are held; `dead` returns the supervisors
    that run jobs and whose lock was seen held, then found free on two
    consecutive looks (a live supervisor whose LISTEN session broke takes
    its lock again within milliseconds of reconnecting)."""

    def __init__(self) -> None:
        self.seen: Set[int] = set()       # lock seen held on this connection
        self.free_once: Set[int] = set()  # seen held, found free at the last look

    def forget(self) -> None:
        """A new connection (or server): what was seen before no longer counts."""
        self.seen.clear()
        self.free_once.clear()

    def observe(self, cur: Any) -> Dict[int, bool]:
        """Read the locks; returns {id: runs jobs} of supervisors found dead."""
        cur.execute(QUERIES["liveness_states"], {"class": LOCK_CLASS_LIVENESS})
        rows = cur.fetchall()
        live = {row[0] for row in rows}
        held = {row[0] for row in rows if row[1]}
        free_seen = {row[0] for row in rows if not row[1] and row[0] in self.seen}
        dead = {row[0]: row[2] for row in rows if row[0] in free_seen and row[0] in self.free_once}
        self.free_once = free_seen
        self.seen = held | (self.seen & live)
        return dead

    def rescue(self, cur: Any) -> List[int]:
        """Observe, then rescue the running jobs of supervisors found dead;
        returns the rescued job ids."""
        dead = [supervisor for supervisor, running in self.observe(cur).items() if running]
        if not dead:
            return []
        cur.execute(QUERIES["rescue_supervisors"], {"ids": dead, "limit": RESCUE_BATCH})
        rows = cur.fetchall()
        for job_id, state in rows:
            log.warning("rescued job %d at once: its supervisor's session ended (now %s)", job_id, state)
        return [row[0] for row in rows]
