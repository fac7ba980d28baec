"""The loop's watchdog: a thread that notices when the supervisor's loop
stops turning, says why, and bounds the statement it waits on.

The loop publishes what it does in a `LoopTurn` (plain attribute writes,
read here; nothing else crosses): when its current turn began, and the
statement it waits on. A turn over STALL_LOG_S gets one log line naming
that statement and what its backend waits for, read on the watchdog's own
short-lived connection. A statement still waiting after STATEMENT_CUT_S
(past the server-side statement_timeout of the loop's session, which a
transaction pooler does not carry, and which a stopped pooler or server
never enforces) has its socket shut down: the loop sees the connection
lost and reconnects, so it goes back to reaping children and enforcing
timeouts (SPEC §5).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from ..core.db import close_quietly, connect, first_line, session_name
from ..core.sql import QUERIES

log = logging.getLogger(__name__)

STALL_LOG_S = 5.0
STATEMENT_CUT_S = 7.0    # > the loop session's statement_timeout (5 s, query loop_session)
CHECK_EVERY_S = 0.5


@dataclass(frozen=True)
class Statement:
    """A statement the loop waits on: what it is for, since when, on which
    connection and backend."""

    what: str
    since: float
    conn: Any
    backend_pid: Optional[int]


class LoopTurn:
    """What the loop is doing now. Written by the loop's thread only."""

    def __init__(self) -> None:
        self.started: Optional[float] = None       # None: waiting for events (select)
        self.statement: Optional[Statement] = None
        self.turned = False   # a turn has completed (the health probe's "the loop runs")

    def begin(self) -> None:
        self.started = time.monotonic()

    def idle(self) -> None:
        self.started = None
        self.turned = True


class Watchdog:
    def __init__(self, url: str, turn: LoopTurn) -> None:
        self.url = url   # a direct URL when there is one: a stopped pooler cannot answer for itself
        self.turn = turn
        self.stalls = 0   # turns that took over STALL_LOG_S
        self.cuts = 0     # statements whose connection it cut
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._logged_turn: Optional[float] = None
        self._cut: Optional[Statement] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="awa-pool-watchdog", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(CHECK_EVERY_S):
            try:
                self.check(time.monotonic())
            except Exception:  # the watchdog must outlive its own mistakes
                log.exception("the loop's watchdog failed a check")

    def check(self, now: float) -> None:
        started, statement = self.turn.started, self.turn.statement
        if statement is not None and now - statement.since >= STATEMENT_CUT_S and statement is not self._cut:
            self._cut = statement
            self._cut_connection(statement, now)
        if started is not None and now - started >= STALL_LOG_S and started != self._logged_turn:
            self._logged_turn = started
            self.stalls += 1
            self._log_stall(now - started, statement, now)

    def _log_stall(self, turn_s: float, statement: Optional[Statement], now: float) -> None:
        if statement is None:
            log.warning("the supervisor's loop turn has taken %.1fs outside any statement "
                        "(reconnecting, or a hook or handler of the loop is slow)", turn_s)
            return
        log.warning("the supervisor's loop turn has taken %.1fs: it waits on %s (%.1fs so far); %s",
                    turn_s, statement.what, now - statement.since, self._backend_wait(statement.backend_pid))

    def _backend_wait(self, pid: Optional[int]) -> str:
        """What the backend waits for, in words, read on a connection of our own."""
        if not pid:
            return "its backend is not known"
        conn = None
        try:
            conn = connect(self.url, autocommit=True, connect_timeout=2, application_name=session_name("watchdog"))
            with conn.cursor() as cur:
                cur.execute(QUERIES["backend_wait"], {"pid": pid})
                row = cur.fetchone()
        except Exception as exc:  # DatabaseUnavailable, ConfigError, psycopg2.Error
            return f"what backend {pid} waits for could not be read ({first_line(exc)})"
        finally:
            close_quietly(conn)
        if row is None:
            return f"backend {pid} is not on the server (behind a pooler, or the session is gone)"
        state, wait_type, wait_event, running_s = row
        waits = f"waiting for {wait_type}/{wait_event}" if wait_type else "not waiting on the server"
        return f"backend {pid} is {state or 'unknown'}, {waits}" + (
            f", its statement running for {running_s:.1f}s" if running_s is not None else "")

    def _cut_connection(self, statement: Statement, now: float) -> None:
        conn = statement.conn
        if self.turn.statement is not statement or conn is None or conn.closed:
            return
        try:
            fd = conn.fileno()
            duplicate = socket.socket(fileno=os.dup(fd))
        except Exception:   # closed meanwhile: nothing to cut
            return
        try:
            duplicate.shutdown(socket.SHUT_RDWR)   # the socket itself, shared by both descriptors
        except OSError:
            pass
        finally:
            duplicate.close()
        self.cuts += 1
        log.warning("cut the loop's connection after %.1fs waiting on %s with no answer; it reconnects",
                    now - statement.since, statement.what)
