"""The dashboard's database connections: a few kept open between requests,
any that broke thrown away, so a database restart costs one 503 and the
next request reconnects by itself.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, List

import psycopg2

from ..core.db import close_quietly, connect, is_connection_error
from ..core.sql import QUERIES

CONNECT_TIMEOUT_S = 3


class Connections:
    """At most `keep` idle connections; a request takes one or opens one."""

    def __init__(self, dsn: str, keep: int = 4) -> None:
        self._dsn = dsn
        self._keep = keep
        self._idle: List[Any] = []
        self._lock = threading.Lock()

    def _open(self) -> Any:
        conn = connect(self._dsn, connect_timeout=CONNECT_TIMEOUT_S)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(QUERIES["dash_session_setup"])
        conn.autocommit = False
        return conn

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection for one request. Whatever the request left
        uncommitted is rolled back; a broken connection is closed."""
        conn = self._take_alive()
        if conn is None:
            conn = self._open()
        reusable = True   # any other exception leaves the session sound: rolled back below
        try:
            yield conn
        except psycopg2.Error as exc:
            reusable = not is_connection_error(exc)
            raise
        finally:
            self._release(conn, reusable)

    def _take_alive(self) -> Any:
        """An idle connection that still answers, or None."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return None
            try:
                with conn.cursor() as cur:
                    cur.execute(QUERIES["dash_ping"])
                conn.rollback()
                return conn
            except psycopg2.Error:
                close_quietly(conn)

    def _release(self, conn: Any, reusable: bool) -> None:
        if reusable and not conn.closed:
            try:
                conn.rollback()
            except psycopg2.Error:
                reusable = False
        if reusable and not conn.closed:
            with self._lock:
                if len(self._idle) < self._keep:
                    self._idle.append(conn)
                    return
        close_quietly(conn)

    def discard_all(self) -> None:
        """Close every idle connection (after the database went away)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            close_quietly(conn)
