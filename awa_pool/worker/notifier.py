"""The LISTEN connection: wake-ups for queues with new jobs (and with new
priority-1 jobs), and cancel requests for running jobs. Its fileno() goes
into the supervisor's selector.
"""
from __future__ import annotations

import json
import logging
import selectors
import time
from typing import Any, Callable, List, NamedTuple, Optional, Set, Tuple

import psycopg2
import psycopg2.extensions

from ..core.db import close_quietly, connect, session_name
from ..core.sql import QUERIES

log = logging.getLogger(__name__)

JOBS_CHANNEL = "awa_jobs"
URGENT_CHANNEL = "awa_urgent"
CANCEL_CHANNEL = "awa_cancel"
PROBE_TIMEOUT_S = 2.0


class Notes(NamedTuple):
    """What one drain of the LISTEN session brought."""

    queues: Set[str]                           # queues with new jobs
    urgent: Set[str]                           # ... among them, new priority-1 jobs
    cancels: List[Tuple[int, Optional[int]]]   # (job id, lease) whose cancel was requested


class Notifier:
    def __init__(self, url: str) -> None:
        self.url = url
        self.application_name = session_name("listen")   # the supervisor's id joins it once registered
        self.conn: Optional[psycopg2.extensions.connection] = None

    def open(self, first: Optional[Callable[[Any], Any]] = None) -> None:
        """Connect and LISTEN. `first(conn)` runs on the new session before
        the LISTEN (the supervisor takes its liveness lock there), so that
        the LISTEN stays the session's last statement, which is how
        operators and scripts/chaos.py recognize it in pg_stat_activity."""
        conn = connect(self.url, autocommit=True, connect_timeout=5, application_name=self.application_name)
        try:
            if first is not None:
                first(conn)
            with conn.cursor() as cur:
                cur.execute(QUERIES["listen"])
        except BaseException:
            close_quietly(conn)
            raise
        self.conn = conn

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed

    def fileno(self) -> int:
        assert self.conn is not None
        return self.conn.fileno()

    def drain(self) -> Notes:
        """What arrived since the last drain. Raises psycopg2 errors when the
        connection is gone."""
        assert self.conn is not None
        self.conn.poll()
        notes = Notes(set(), set(), [])
        queues, cancels = notes.queues, notes.cancels
        for note in self.conn.notifies:
            if note.channel == JOBS_CHANNEL:
                queues.add(note.payload)
            elif note.channel == URGENT_CHANNEL:
                queues.add(note.payload)
                notes.urgent.add(note.payload)
            elif note.channel == CANCEL_CHANNEL:
                try:
                    data = json.loads(note.payload)
                    cancels.append((int(data["id"]), data.get("lease")))
                except (ValueError, KeyError, TypeError):
                    log.warning("ignoring a malformed cancel notification %r", note.payload)
        self.conn.notifies.clear()
        return notes

    def probe(self, conn: Any, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        """Does LISTEN work? It needs a session: behind a transaction-mode
        pooler it silently never fires. Sends ourselves an empty NOTIFY on
        `conn` and waits for it here; False when it does not come back."""
        assert self.conn is not None
        with conn.cursor() as cur:
            cur.execute(QUERIES["probe_notify"])
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as waiting:
            waiting.register(self.conn.fileno(), selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if waiting.select(max(0.0, deadline - time.monotonic())):
                    self.conn.poll()
                    notes = self.conn.notifies
                    if any(n.channel == JOBS_CHANNEL and n.payload == "" for n in notes):
                        notes[:] = [n for n in notes if n.payload != ""]
                        return True
        return False

    def close(self) -> None:
        close_quietly(self.conn)
        self.conn = None
