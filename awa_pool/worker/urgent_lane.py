"""The urgent lane: a thread of the supervisor with a session of its own
that LISTENs on awa_urgent and claims a new priority-1 job the moment it
is notified, for the children holding less urgent jobs queued (they take
it next: Children.assign's overtake).

The main loop reads its own LISTEN session only between statements, and
under a deep backlog a claim of a full batch takes milliseconds; the
lane's claim and hand-out run while the main loop waits on such a
statement. Both work under the supervisor's state lock (children,
claimer), which the main loop holds except while it waits in select() or
for a statement's reply (Session.run), so the lane never sees a half-made
change and its claim and hand-out are one step to the loop (a reconcile
that reads the running jobs meanwhile finds the job already held).
"""
from __future__ import annotations

import logging
import os
import select
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Set

import psycopg2
import psycopg2.extensions

from ..core.db import close_quietly, connect, first_line
from .notifier import URGENT_CHANNEL
from ..core.sql import QUERIES

log = logging.getLogger(__name__)

RECONNECT_EVERY_S = 1.0
# While the lane runs, a thread waiting for the GIL asks the one holding it
# to let go after this long (Python's default is 5 ms): the lane's wake-up
# must not wait for the loop's Python work between two statements. Forked
# children get the program's interval back.
SWITCH_INTERVAL_S = 0.0002
_app_switch_interval: Optional[float] = None
HANDOFF_WAIT_S = 0.1   # at most this long a statement of the loop waits for the lane's claim

# (names of queues with new priority-1 jobs, db): claims and hands them out,
# called with the state lock held (Claimer.rush_now).
Rush = Callable[[Set[str], Callable[[str, Callable[[Any], Any]], Any]], int]


def _give_back_switch_interval() -> None:
    global _app_switch_interval
    if _app_switch_interval is not None:
        sys.setswitchinterval(_app_switch_interval)
        _app_switch_interval = None


os.register_at_fork(after_in_child=_give_back_switch_interval)


class StateLock:
    """The supervisor's state lock: the main loop holds it through a tick
    and gives it up while it waits (select(), a statement's reply). An
    urgent taker (the lane, `first()`) goes before the loop's next
    statement: otherwise the loop's claim, sent the moment it lets go,
    would take the urgent job into a batch that takes milliseconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: Optional[int] = None
        self._turns = threading.Condition()
        self._urgent = 0   # urgent takers waiting for the lock or holding it

    def __enter__(self) -> "StateLock":
        self._lock.acquire()
        self._owner = threading.get_ident()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._owner = None
        self._lock.release()

    @contextmanager
    def first(self) -> Iterator[None]:
        """Hold the lock, ahead of the loop's next statement."""
        with self._turns:
            self._urgent += 1
        try:
            with self:
                yield
        finally:
            with self._turns:
                self._urgent -= 1
                self._turns.notify_all()

    @contextmanager
    def released(self) -> Iterator[None]:
        """Give the lock up for the block if this thread holds it (a test
        driving the supervisor's parts without its loop holds nothing);
        while an urgent taker waits, the block waits for it to finish."""
        if self._owner != threading.get_ident():
            yield
            return
        self.__exit__()
        try:
            if self._urgent:
                with self._turns:
                    self._turns.wait_for(lambda: not self._urgent, timeout=HANDOFF_WAIT_S)
            yield
        finally:
            self.__enter__()


class UrgentLane:
    def __init__(self, url: str, state_lock: StateLock, rush: Rush, on_handed_out: Callable[[], None],
                 on_up: Callable[[], None]) -> None:
        self.url = url
        self.state_lock = state_lock
        self.rush = rush
        self.on_handed_out = on_handed_out    # wakes the main loop (a child's outbox may wait)
        # Called under the state lock once it listens (again): notices sent
        # while it did not are lost to it, so the loop's claims look at
        # priority 1 again (Claimer.urgent_left).
        self.on_up = on_up
        self.conn: Optional[psycopg2.extensions.connection] = None
        self.rushes = 0                       # claims the lane made (stats)
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self._down_since: Optional[float] = None
        self._failed: Optional[BaseException] = None   # by a claim, under the lock: drop the session after

    @property
    def connected(self) -> bool:
        conn = self.conn
        return conn is not None and not conn.closed

    def inherited_fds(self) -> "tuple[List[int], List[int]]":
        """(fds a new child closes, database sockets it neutralizes); read
        under the state lock, which a session is published and dropped under."""
        conn = self.conn
        sockets = [conn.fileno()] if conn is not None and not conn.closed else []
        return [self._wake_r, self._wake_w], sockets

    def start(self) -> None:
        global _app_switch_interval
        if _app_switch_interval is None:
            _app_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_app_switch_interval, SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._run, name="awa-pool-urgent", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; call without holding the state lock."""
        self._stopping = True
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout)
        _give_back_switch_interval()
        with self.state_lock:
            conn, self.conn = self.conn, None
        close_quietly(conn)
        if self._thread is None or not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)

    def _run(self) -> None:
        while not self._stopping:
            if not self.connected and not self._open():
                self._pause(RECONNECT_EVERY_S)
                continue
            assert self.conn is not None
            select.select([self.conn, self._wake_r], [], [])
            if self._stopping:
                return
            try:
                self.conn.poll()
                names = {note.payload for note in self.conn.notifies if note.channel == URGENT_CHANNEL}
                self.conn.notifies.clear()
            except psycopg2.Error as exc:
                self._drop(exc, "listening on awa_urgent")
                continue
            if names:
                self._claim(names)
            if self._failed is not None:
                self._drop(self._failed, "claiming")

    def _claim(self, names: Set[str]) -> None:
        with self.state_lock.first():
            handed = self.rush(names, self._db)
        if handed:
            self.rushes += 1
            self.on_handed_out()

    def _db(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """The claimer's "run fn(cursor), or log and return None", on this
        lane's session. A failure closes it; the next pass reconnects."""
        conn = self.conn
        if conn is None or conn.closed or self._failed is not None:
            return None
        try:
            with conn.cursor() as cur:
                return fn(cur)
        except psycopg2.Error as exc:
            self._failed = exc
            return None

    def _open(self) -> bool:
        conn = None
        try:
            conn = connect(self.url, autocommit=True, connect_timeout=5)
            with conn.cursor() as cur:   # a direct session, as the LISTEN one: session settings hold
                cur.execute(QUERIES["worker_session"])
                cur.execute(QUERIES["listen_urgent"])
        except Exception as exc:  # DatabaseUnavailable, ConfigError, psycopg2.Error
            close_quietly(conn)
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning("the urgent lane cannot reach the database (%s); priority-1 jobs are "
                            "claimed by the main loop until it can", first_line(exc))
            return False
        with self.state_lock:  # published under the lock: a child forked from now on neutralizes it
            self.conn = conn
            self.on_up()
        if self._down_since is not None:
            log.info("the urgent lane is back after %.1fs", time.monotonic() - self._down_since)
            self._down_since = None
        return True

    def _drop(self, exc: BaseException, what: str) -> None:
        self._failed = None
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("the urgent lane lost its session while %s (%s); reconnecting", what, first_line(exc))
        with self.state_lock:  # unpublished under the lock: its fd number may be reused once closed
            conn, self.conn = self.conn, None
        close_quietly(conn)

    def _pause(self, seconds: float) -> None:
        select.select([self._wake_r], [], [], seconds)
