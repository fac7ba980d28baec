"""A supervisor's start-up in the database: check the schema, register the
supervisor, record the settings of the queues it serves, its tasks' declared
timeouts (awa.claim applies them) and its schedules.

Each step is idempotent apart from the registration itself, so when the
database goes away part-way the whole sequence runs again on a new
connection (a row left by a registration that committed before the loss is
never heartbeated and is forgotten by the leader).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional

import psycopg2

from ..core.config import QueueConfig
from ..core.db import session_name
from ..core.errors import ConfigError
from ..api.migrate import require_current
from ..api.periodic_admin import register_schedules
from ..core.sql import QUERIES
from ..core.tasks import all_tasks
from ..core.version import __version__


@dataclass(frozen=True)
class QueueSettings:
    """What a supervisor applies from a queue's fleet-wide policy (awa.queues)."""

    shards: int = 1
    paused: bool = False
    rate: Optional[float] = None   # job starts per second across the fleet
    global_max: Optional[int] = None   # jobs running at once across the fleet


@dataclass(frozen=True)
class Registration:
    supervisor_id: int
    settings: Dict[str, QueueSettings]   # per served queue that awa.queues has
    # --queue rate=/dlq values the database overrode (SPEC §11), to warn about
    conflicts: List[str]


def register(conn: Any, queues: Dict[str, QueueConfig], workers: int, pid: int, *,
             session_settings: bool = True) -> Registration:
    """Run the start-up steps on an autocommit connection; returns what the
    supervisor needs from them. session_settings=False (a transaction-mode
    pooler) leaves the session's settings alone."""
    require_current(conn)
    with conn.cursor() as cur:
        supervisor_id = _register_row(cur, {"hostname": socket.gethostname(), "pid": pid, "version": __version__,
                                            "queues": sorted(queues), "workers": workers})
        # The registration above committed synchronously (its id seeds every
        # lease this supervisor hands out); from here on the session's writes
        # need not wait for fsync and each is bounded (loop_session). Through a transaction
        # pooler that SET would stay behind on a server session other clients
        # share (their commits would go asynchronous): commits stay synchronous.
        if session_settings:
            cur.execute(QUERIES["loop_session"])
            cur.execute(QUERIES["name_session"], {"name": session_name("main", supervisor_id)})
        conflicts = [_fill_policy(cur, name, queue) for name, queue in sorted(queues.items())]
        tasks = sorted(all_tasks().values(), key=lambda declared: declared.kind)
        cur.execute(QUERIES["register_task_defaults"], {
            "kinds": [t.kind for t in tasks], "timeouts": [t.timeout for t in tasks]})
    register_schedules(conn)
    with conn.cursor() as cur:
        settings = read_queue_settings(cur, queues)
    return Registration(supervisor_id, settings, [conflict for conflict in conflicts if conflict])


def _fill_policy(cur: Any, name: str, queue: QueueConfig) -> str:
    """Write the spec's rate=/dlq where the queue has none; a description of
    what the database kept instead of what the spec named, or ""."""
    cur.execute(QUERIES["configure_queue"], {"name": name, "dlq": True if queue.dlq else None, "rate": queue.rate})
    dlq, rate = cur.fetchone()
    kept = []
    if queue.rate is not None and rate is not None and abs(rate - queue.rate) > 1e-9 * queue.rate:
        kept.append(f"rate={queue.rate:g}/s (the database has {rate:g}/s)")
    if queue.dlq and dlq is False:
        kept.append("dlq (the database has dead-lettering off)")
    if not kept:
        return ""
    return (f"queue {name!r}: --queue {' and '.join(kept)}: the database's value holds "
            f"(change it with: awa-pool queues set {name} ...)")


def served_queues(configured: Dict[str, QueueConfig]) -> Dict[str, QueueConfig]:
    """The queues a supervisor serves: those of its --queue specs, else
    every queue its registered tasks name."""
    queues = dict(configured)
    if not queues:
        for declared in all_tasks().values():
            queues.setdefault(declared.queue, QueueConfig())
    if not queues:
        raise ConfigError("nothing to serve: no --queue given and the app registers no tasks")
    return queues


def read_queue_settings(cur: Any, queues: Iterable[str]) -> Dict[str, QueueSettings]:
    """The named queues' settings, as awa.queues has them now."""
    cur.execute(QUERIES["queue_settings"], {"names": sorted(queues)})
    return {name: QueueSettings(shards=shards, paused=paused, rate=rate, global_max=global_max)
            for name, shards, paused, rate, global_max in cur.fetchall()}


def _register_row(cur: Any, values: Dict[str, Any], attempts: int = 20) -> int:
    """A new supervisor row with the next free id. A heartbeat puts back the
    row of a supervisor the leader forgot, under its own id; when the
    database was dropped and made again under a running supervisor, that id
    may be one the fresh sequence has yet to hand out: skip it."""
    for attempt in range(attempts):
        try:
            cur.execute(QUERIES["register_supervisor"], values)
            return cur.fetchone()[0]
        except psycopg2.errors.UniqueViolation:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
