"""Leader election: one supervisor holds a session advisory lock on its own
connection and runs maintenance. When that session dies (process killed,
connection terminated), the lock is free and another supervisor takes it
within a second; a leader whose connection fails stops maintenance at once.

Runs in a thread of the supervisor, so slow maintenance never delays
claiming. The thread touches only its own connection, on which it also
holds the second of its supervisor's liveness locks (liveness.py); a
supervisor that must not lead (`campaign=False`) runs it for that alone.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import psycopg2
import psycopg2.errors
import psycopg2.extensions

from ..core.db import LOCK_CLASS, LOCK_LEADER, close_quietly, connect, first_line, is_connection_error, session_name
from ..core.errors import DatabaseUnavailable
from .maintenance import Maintenance
from ..core.sql import QUERIES
from .liveness import LivenessLock

log = logging.getLogger(__name__)

CAMPAIGN_INTERVAL_S = 0.5
DEPOSE_CHECK_S = 2.0   # how often a follower checks whether the leader froze


class Leader:
    def __init__(self, url: str, supervisor_id: int, maintenance: Maintenance,
                 on_change: Optional[Callable[[bool], None]] = None, stale_after_s: float = 10.0,
                 campaign: bool = True) -> None:
        self.url = url
        self.campaign = campaign
        self.liveness = LivenessLock()
        self.supervisor_id = supervisor_id
        self.maintenance = maintenance
        self.on_change = on_change
        self.conn: Optional[psycopg2.extensions.connection] = None
        self._is_leader = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.changes = 0
        self.stale_after_s = stale_after_s
        self.next_depose_check = 0.0

    @property
    def is_leader(self) -> bool:
        return self._is_leader

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="awa-pool-leader", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._drop_connection()

    def _set_leader(self, value: bool) -> None:
        if value != self._is_leader:
            self._is_leader = value
            self.changes += 1
            if value:
                log.info("supervisor %d is now the leader", self.supervisor_id)
            elif self._stop.is_set():
                log.info("supervisor %d stepped down as leader (shutting down)", self.supervisor_id)
            else:
                log.warning("supervisor %d lost leadership", self.supervisor_id)
            if self.on_change is not None:
                self.on_change(value)

    def _drop_connection(self) -> None:
        close_quietly(self.conn)  # ends the session: the advisory lock is released
        self.conn = None
        self._set_leader(False)

    def _run(self) -> None:
        failures = 0   # in a row: the session holds a liveness lock, so the first retry is quick
        while not self._stop.is_set():
            wait = CAMPAIGN_INTERVAL_S
            try:
                wait = self.step()
                failures = 0
            except (psycopg2.Error, DatabaseUnavailable) as exc:
                if self.conn is not None and not self.conn.closed and not is_connection_error(exc):
                    # a lock or statement timeout: the session (and the lock) live on
                    log.warning("leader pass failed: %s", first_line(exc))
                    wait = 1.0
                else:
                    if not failures:
                        log.warning("leader connection failed: %s", first_line(exc))
                    self._drop_connection()
                    wait = min(1.0, 0.05 * 2 ** failures)
                    failures += 1
            except Exception:  # a bug in a service must not kill the thread silently
                log.exception("maintenance failed")
                wait = 1.0
            self._stop.wait(max(0.01, wait))

    def _follower_checks(self, cur) -> None:
        """Every DEPOSE_CHECK_S while following: depose a frozen leader, and
        keep the maintenance's observations current (the liveness locks), so
        that this supervisor acts at once if it takes over from one that died."""
        now = time.monotonic()
        if now < self.next_depose_check:
            return
        self.next_depose_check = now + DEPOSE_CHECK_S
        self.maintenance.observe(cur)
        try:
            cur.execute(QUERIES["depose_frozen_leader"], {"class": LOCK_CLASS, "key": LOCK_LEADER,
                                                          "stale_s": self.stale_after_s})
            if any(row[0] for row in cur.fetchall()):
                log.warning("ended the session of a leader whose supervisor stopped heartbeating "
                            "(frozen?); taking over leadership")
        except psycopg2.errors.InsufficientPrivilege as exc:
            log.warning("cannot end a frozen leader's session: %s", first_line(exc))

    def step(self) -> float:
        """One pass: connect, campaign or run due maintenance. Returns how long
        to wait before the next pass."""
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.url, autocommit=True, connect_timeout=5,
                                application_name=session_name("leader", self.supervisor_id))
            with self.conn.cursor() as cur:
                cur.execute(QUERIES["maintenance_session"])
            self.maintenance.forget()  # a new session, maybe a new server: start looking afresh
        if not self.liveness.held_on(self.conn):
            self.liveness.take(self.conn, self.supervisor_id)
        if not self.campaign:
            with self.conn.cursor() as cur:   # a ping: a session that ended is noticed, and reopened
                cur.execute(QUERIES["backend_pid"])
            return CAMPAIGN_INTERVAL_S
        with self.conn.cursor() as cur:
            if not self._is_leader:
                cur.execute(QUERIES["try_leader_lock"], {"class": LOCK_CLASS, "key": LOCK_LEADER})
                if not cur.fetchone()[0]:
                    self._follower_checks(cur)
                    return CAMPAIGN_INTERVAL_S
                cur.execute(QUERIES["mark_leader"], {"id": self.supervisor_id})
                self.maintenance.reset()
                self._set_leader(True)
            started = time.monotonic()
            wait = self.maintenance.run_due(cur)
            if time.monotonic() - started > 5:
                log.info("maintenance pass took %.1fs", time.monotonic() - started)
            return min(wait, CAMPAIGN_INTERVAL_S)
