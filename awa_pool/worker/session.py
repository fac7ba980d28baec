"""The supervisor's own database connections: the main one (claims,
requests, heartbeats, settings) and the LISTEN one, which also holds one of
the supervisor's two liveness locks (liveness.py).

It runs statements (each published in the loop's `LoopTurn` while it
waits, for the watchdog), notices when the database went away, and
reconnects with backoff while the children keep running. Start-up (connect, register,
LISTEN) is retried as a whole until the connect timeout, so the database may
go away at any point of a supervisor's life. The supervisor owns the loop
and decides what a loss or a return means for its jobs (the callbacks).

Behind a transaction-mode pooler (pooling.py) the main connection carries
no session state: no SET, and no LISTEN or lock unless a direct session URL
(`session_dsn`) is given for them; without one the supervisor polls.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Callable, Dict, List, Optional

import psycopg2
import psycopg2.extensions
from tenacity import RetryCallState, wait_exponential, wait_random

from ..core.config import PoolConfig, QueueConfig
from ..core.db import (close_quietly, connect, first_line, is_connection_error, is_transient, session_name,
                       socket_of)
from ..core.errors import AwaError
from .liveness import LivenessLock
from .notifier import Notifier
from .pooling import TRANSACTION_POOLER, classify
from .registration import Registration, register
from .watchdog import LoopTurn, Statement
from ..core.sql import QUERIES

log = logging.getLogger(__name__)

RECONNECT_CONNECT_TIMEOUT_S = 3


def _retry_state(attempt: int) -> RetryCallState:
    """What tenacity's wait strategies read: the attempt number."""
    state = RetryCallState(None, None, (), {})
    state.attempt_number = attempt
    return state


class Session:
    def __init__(self, config: PoolConfig, *, on_lost: Callable[[str], None],
                 on_back: Callable[[float], None], on_listen: Callable[[bool], None] = lambda up: None,
                 turn: Optional[LoopTurn] = None) -> None:
        self.config = config
        self.turn = turn or LoopTurn()
        self.on_lost = on_lost    # (error line): the main connection is gone
        self.on_back = on_back    # (outage seconds): it is back
        self.on_listen = on_listen   # (up): the LISTEN session went down, or came back
        self.conn: Optional[psycopg2.extensions.connection] = None
        self.notifier = Notifier(config.session_dsn or config.dsn)
        self.listen_ok = True
        self.pooled = False   # the main URL is a transaction-mode pooler: no session state on it
        self.liveness = LivenessLock()
        self.supervisor_id: Optional[int] = None
        self.lost_at: Optional[float] = None
        self.reconnect_at = 0.0
        self.reconnect_attempts = 0
        self.listen_at = 0.0           # the LISTEN session's own reconnects (it holds a liveness lock)
        self.listen_attempts = 0
        self.backoff = wait_exponential(multiplier=0.2, max=5.0) + wait_random(0, 0.2)

    @property
    def connected(self) -> bool:
        return self.conn is not None

    def sockets(self) -> List[int]:
        return [fd for fd in map(socket_of, (self.conn, self.notifier.conn)) if fd is not None]

    # -- start-up ------------------------------------------------------------
    def start(self, queues: Dict[str, QueueConfig], pid: int) -> Registration:
        """Connect, register and LISTEN; the whole sequence starts over when
        the database goes away part-way, until the connect timeout."""
        deadline = time.monotonic() + self.config.connect_timeout
        for attempt in itertools.count(1):
            try:
                # Registration commits synchronously (the id seeds every
                # lease); then the session's settings apply (loop_session).
                self.conn = connect(self.config.dsn, autocommit=True, application_name=session_name("main"),
                                    retry_for=max(0.0, deadline - time.monotonic()),
                                    connect_timeout=max(1, int(min(10, self.config.connect_timeout or 1))))
                self.pooled = classify(self.conn, self.config.dsn) == TRANSACTION_POOLER
                registration = register(self.conn, queues, self.config.workers, pid,
                                        session_settings=not self.pooled)
                self.supervisor_id = registration.supervisor_id
                self.notifier.application_name = session_name("listen", self.supervisor_id)
                self.listen_ok = self._listen()
                break
            except psycopg2.Error as exc:
                self.close()
                remaining = deadline - time.monotonic()
                if not is_transient(exc) or remaining <= 0:
                    raise
                if attempt == 1:
                    log.warning("lost the database during start-up (%s); starting over for up to %.0fs",
                                first_line(exc), remaining)
                time.sleep(min(remaining, self.backoff(_retry_state(attempt))))
        for conflict in registration.conflicts:   # after the retries: once per start
            log.warning("%s", conflict)
        if self.pooled and not self.config.session_dsn:
            log.warning("the database URL goes through a transaction-mode pooler: polling every 0.2s for "
                        "jobs and cancels, not campaigning for leader, no liveness lock (give "
                        "--session-database-url, a direct URL, for LISTEN and the locks)")
        elif not self.listen_ok:
            log.warning("LISTEN/NOTIFY does not reach this supervisor (a transaction-mode connection "
                        "pooler?); polling every 0.2s, not campaigning for leader")
        return registration

    def _listen(self) -> bool:
        """Open the LISTEN session and take the liveness lock on it; False
        when there must be none (a transaction pooler and no session URL)
        or LISTEN does not work on it."""
        if self.pooled and not self.config.session_dsn:
            return False  # a LISTEN would stay behind on a pooled server session
        self.notifier.open(first=self._take_liveness)
        if not self.notifier.probe(self.conn):
            self.notifier.close()  # and with it the lock: no LISTEN, no liveness either
            return False
        return True

    @property
    def may_lead(self) -> bool:
        """Whether a session is at hand for the leader lock (the LISTEN URL works)."""
        return self.listen_ok

    def _take_liveness(self, conn: Any) -> None:
        """On a new LISTEN session, before its LISTEN (see Notifier.open)."""
        if self.supervisor_id is not None:
            self.liveness.take(conn, self.supervisor_id)

    def check_liveness(self) -> None:
        """From the loop: take the liveness lock again if a take failed. A
        lost connection starts reconnecting."""
        if not (self.listen_ok and self.notifier.connected) or self.liveness.held_on(self.notifier.conn):
            return
        try:
            self._take_liveness(self.notifier.conn)
        except psycopg2.Error as exc:
            if is_connection_error(exc) or not self.notifier.connected or self.notifier.conn.closed:
                self.listen_lost(exc)
            else:
                log.error("taking the liveness lock failed: %s", first_line(exc))

    # -- statements ------------------------------------------------------------
    def run(self, fn: Callable[[Any], Any], what: str = "a statement") -> Any:
        """fn(cursor) on the main connection; errors propagate (a lost
        connection also starts reconnecting). While it waits, the statement
        is in the loop's turn record, where the watchdog sees it."""
        conn = self.conn
        if conn is None:
            raise AwaError("the database is unreachable right now")
        self.turn.statement = Statement(what, time.monotonic(), conn, conn.info.backend_pid)
        try:
            with conn.cursor() as cur:
                return fn(cur)
        except psycopg2.Error as exc:
            if is_connection_error(exc) or conn.closed:
                self.lost(exc)
            raise
        finally:
            self.turn.statement = None

    def run_quietly(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """fn(cursor); on any database error log it (or start reconnecting)
        and return None."""
        try:
            return self.run(fn, what)
        except AwaError:
            return None
        except psycopg2.Error as exc:
            if self.conn is not None:
                log.error("%s failed: %s", what, first_line(exc))
            return None

    # -- losing and finding the database ---------------------------------------
    # The two sessions come back on their own: the main one losing its
    # connection must not drop the LISTEN session, which holds one of the
    # supervisor's two liveness locks (while the other, the leader thread's,
    # may be reconnecting too).
    def lost(self, exc: BaseException) -> None:
        """The main connection failed."""
        first_loss = self.lost_at is None
        if first_loss:
            self.lost_at = time.monotonic()
            log.warning("lost the database connection (%s); retrying with backoff while children "
                        "keep running", first_line(exc))
        close_quietly(self.conn)
        self.conn = None
        self.reconnect_attempts = 0
        self.reconnect_at = time.monotonic()
        if first_loss:
            self.on_lost(first_line(exc))

    def listen_lost(self, exc: BaseException) -> None:
        """The LISTEN session failed: it is opened again at once, then with backoff."""
        if self.notifier.conn is not None:
            log.info("the LISTEN session ended (%s); opening it again", first_line(exc))
            self.on_listen(False)
        self.notifier.close()
        self.listen_attempts = 0
        self.listen_at = time.monotonic()

    def maybe_reconnect(self, now: float) -> None:
        if self.conn is None and now >= self.reconnect_at:
            self._reconnect_main(now)
        if self.listen_ok and self.notifier.conn is None and now >= self.listen_at:
            self._reopen_listen(now)

    def _reconnect_main(self, now: float) -> None:
        self.reconnect_attempts += 1
        conn = None
        try:
            conn = connect(self.config.dsn, autocommit=True, connect_timeout=RECONNECT_CONNECT_TIMEOUT_S,
                           application_name=session_name("main", self.supervisor_id))
            if not self.pooled:
                with conn.cursor() as cur:
                    cur.execute(QUERIES["loop_session"])
        except (AwaError, psycopg2.Error) as exc:
            close_quietly(conn)
            delay = self.backoff(_retry_state(self.reconnect_attempts))
            self.reconnect_at = now + delay
            log.debug("reconnect attempt %d failed (%s); next in %.1fs", self.reconnect_attempts,
                      first_line(exc), delay)
            return
        self.conn = conn
        outage = now - (self.lost_at or now)
        self.lost_at = None
        log.info("reconnected to the database after %.1fs", outage)
        self.on_back(outage)

    def _reopen_listen(self, now: float) -> None:
        self.listen_attempts += 1
        try:
            self.notifier.open(first=self._take_liveness)
        except (AwaError, psycopg2.Error) as exc:
            self.notifier.close()
            self.listen_at = now + self.backoff(_retry_state(self.listen_attempts))
            log.debug("reopening the LISTEN session failed (attempt %d: %s)", self.listen_attempts,
                      first_line(exc))
            return
        self.on_listen(True)

    def close(self) -> None:
        close_quietly(self.conn)
        self.conn = None
        self.notifier.close()
