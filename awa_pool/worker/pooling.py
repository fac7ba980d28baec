"""Does a database URL lead to a session of our own, or through a connection
pooler, and in which mode?

A pooler answers the connect itself, so the backend process id the server
reported at connect differs from the one that runs our statements.
Behind a transaction-mode pooler (PgBouncer `pool_mode = transaction`) two
client connections take turns on the same server sessions; in session mode
each keeps its own. A transaction pooler cannot carry LISTEN, advisory
locks or session settings: a LISTEN or a SET sent through it stays behind on
a pooled server session, where it reaches (or breaks) other clients.
"""
from __future__ import annotations

from typing import Any

from ..core.db import close_quietly, connect
from ..core.sql import QUERIES

DIRECT = "direct"
SESSION_POOLER = "session pooler"
TRANSACTION_POOLER = "transaction pooler"

TURNS = 4   # alternating statements on two connections, looking for a shared server session


def _backend_pid(conn: Any) -> int:
    with conn.cursor() as cur:
        cur.execute(QUERIES["backend_pid"])
        return int(cur.fetchone()[0])


def classify(conn: Any, url: str) -> str:
    """DIRECT, SESSION_POOLER or TRANSACTION_POOLER for `conn`, an open
    autocommit connection to `url`. Behind a pooler it opens a second,
    short-lived connection: statements of the two alternate, and a server
    session that serves both means transaction pooling (a pooler reuses the
    session that was just released)."""
    if conn.info.backend_pid == _backend_pid(conn):
        return DIRECT
    other = connect(url, autocommit=True, connect_timeout=5)
    try:
        for _ in range(TURNS):
            if _backend_pid(other) == _backend_pid(conn):
                return TRANSACTION_POOLER
    finally:
        close_quietly(other)
    return SESSION_POOLER
