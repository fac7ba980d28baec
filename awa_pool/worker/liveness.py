"""The liveness lock, and the leader's fast rescue of a supervisor whose
process is gone.

Each supervisor holds a session-level advisory lock keyed by its id, in
shared mode, on two of its sessions: its LISTEN session and its leader
thread's session (`LivenessLock`). When its process dies (kill -9, a crash,
the OOM killer) the kernel closes its sockets, the server ends its sessions
and the lock is free at once. When one of its sessions ends while the
process lives (`pg_terminate_backend`, a pooler restart), the other still
holds the lock, and the first is back within moments: the lock is never
free, and nothing is rescued (SPEC §5).

The leader looks at every supervisor's lock four times a second
(`DeadSupervisors`) and rescues the running jobs of one whose lock it saw
held by both sessions and now finds free twice in a row, through the same
path as the heartbeat-staleness rescue; never its own supervisor's, which
lives in its own process. A supervisor cut off by a network partition keeps its
sessions on the server, and with them its lock: only the heartbeat
staleness rescues it. After a server restart or a failover every lock is
free until its owner reconnects, so only a lock seen held on the leader's
current connection counts: the others wait for the heartbeat staleness.
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
SESSIONS_HOLDING = 2   # a live supervisor's LISTEN and leader sessions


class LivenessLock:
    """A supervisor's own lock, on the connection it was taken on."""

    def __init__(self) -> None:
        self.conn: Optional[Any] = None

    def held_on(self, conn: Any) -> bool:
        return conn is not None and self.conn is conn and not conn.closed

    def take(self, conn: Any, supervisor_id: int) -> bool:
        """Take the lock (shared) on `conn`, an autocommit session; True when
        held. A session of this supervisor the server has not dropped yet may
        hold it too: shared, the two do not wait for each other."""
        if self.held_on(conn):
            return True
        self.conn = None
        try:
            with conn.cursor() as cur:
                cur.execute(QUERIES["take_liveness_lock"], {"class": LOCK_CLASS_LIVENESS, "id": supervisor_id})
                got = bool(cur.fetchone()[0])
        except psycopg2.errors.InsufficientPrivilege as exc:
            log.warning("cannot take the liveness lock (%s); the leader falls back to the heartbeat "
                        "to notice this supervisor's death", first_line(exc))
            return False
        if got:
            self.conn = conn
        return got


class DeadSupervisors:
    """The leader's view of the liveness locks, kept for one leader session.

    `observe` records which locks are held, and by how many sessions;
    `dead` returns the supervisors that run jobs, whose lock was seen held
    by both of their sessions, then found free on two consecutive looks.
    A lock seen on one session only (a supervisor still reconnecting its
    other, after a restart; one starting up) may be free because that one
    session ended: its supervisor is left to the heartbeat staleness.
    `spare`: the leader's own supervisor, never dead."""

    def __init__(self, spare: Optional[int] = None) -> None:
        self.spare = spare
        self.seen: Set[int] = set()       # lock seen held by both sessions on this connection
        self.free_once: Set[int] = set()  # seen so, found free at the last look

    def forget(self) -> None:
        """A new connection (or server): what was seen before no longer counts."""
        self.seen.clear()
        self.free_once.clear()

    def observe(self, cur: Any) -> Dict[int, bool]:
        """Read the locks; returns {id: runs jobs} of supervisors found dead."""
        cur.execute(QUERIES["liveness_states"], {"class": LOCK_CLASS_LIVENESS})
        rows = [row for row in cur.fetchall() if row[0] != self.spare]
        live = {row[0] for row in rows}
        both = {row[0] for row in rows if row[1] >= SESSIONS_HOLDING}
        free_seen = {row[0] for row in rows if row[1] == 0 and row[0] in self.seen}
        dead = {row[0]: row[2] for row in rows if row[0] in free_seen and row[0] in self.free_once}
        self.free_once = free_seen
        self.seen = both | (self.seen & live)
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
            log.warning("rescued job %d at once: its supervisor's sessions ended (now %s)", job_id, state)
        return [row[0] for row in rows]
