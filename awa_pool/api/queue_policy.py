"""A queue's policy, the fleet's (SPEC §11): awa_pool.set_queue and the
read behind `awa-pool queues show`. Held in awa.queues; a supervisor's
--queue spec gives only what is its own (weight, min, max, aging).

Like the admin functions these run in the caller's transaction and never
commit. Every value is checked before any SQL runs, so bad input changes
nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from ..core.config import parse_rate
from ..core.job import check_name
from ..core.sql import QUERIES
from .drivers import cursor_for

SETTINGS = ("rate", "dlq", "global_max", "shards")


@dataclass(frozen=True)
class QueuePolicy:
    """What awa.queues holds for a queue. `rate` is job starts per second
    across the fleet; `dlq` None means nobody set it (no dead-lettering)."""

    queue: str
    paused: bool = False
    rate: Optional[float] = None
    dlq: Optional[bool] = None
    shards: int = 1
    global_max: Optional[int] = None   # at most this many of its jobs running across the fleet


def _checked(settings: Dict[str, Any]) -> Dict[str, Any]:
    """The settings as stored, or ValueError/TypeError naming the first bad one."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown queue setting {unknown[0]!r} (known: {', '.join(SETTINGS)})")
    if not settings:
        raise ValueError(f"nothing to set: name at least one of {', '.join(SETTINGS)}")
    values: Dict[str, Any] = {}
    if "rate" in settings:
        rate = settings["rate"]
        values["rate"] = None if rate is None else parse_rate(rate)   # ConfigError is a ValueError
    if "dlq" in settings:
        dlq = settings["dlq"]
        if dlq is not None and not isinstance(dlq, bool):
            raise TypeError(f"dlq must be True, False or None, not {type(dlq).__name__}")
        values["dlq"] = dlq
    if "global_max" in settings:
        limit = settings["global_max"]
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"global_max must be a positive int or None, got {limit!r}")
        values["global_max"] = limit
    if "shards" in settings:
        shards = 1 if settings["shards"] is None else settings["shards"]
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 64:
            raise ValueError(f"shards must be an int from 1 to 64, got {shards!r}")
        values["shards"] = shards
    return values


def set_queue(conn: Any, queue: str, **settings: Any) -> QueuePolicy:
    """Set a queue's fleet-wide policy; returns it as stored afterwards.

    rate: job starts per second across all supervisors (10, "10/s", "30/m");
    dlq: exhausted jobs go to the dead-letter queue; global_max: at most
    this many of the queue's jobs running at once across all supervisors
    (a slot frees when the job's outcome commits); shards: FIFO lanes
    (1-64; changing it moves waiting jobs to their lanes). None clears a
    setting. Running supervisors apply a change within a few seconds.
    Settings not named stay as they are."""
    name = check_name(queue, "queue")
    values = _checked(settings)
    with cursor_for(conn) as cur:
        if values.keys() - {"shards"}:
            cur.execute(QUERIES["set_queue"], {
                "name": name, "rate": values.get("rate"), "dlq": values.get("dlq"),
                "global_max": values.get("global_max"), "set_rate": "rate" in values,
                "set_dlq": "dlq" in values, "set_global_max": "global_max" in values})
        if "shards" in values:
            cur.execute(QUERIES["set_queue_shards"], {"name": name, "shards": values["shards"]})
    policy = queue_policy(conn, name)
    assert policy is not None  # written just above, in this transaction
    return policy


def queue_policy(conn: Any, queue: str) -> Optional[QueuePolicy]:
    """The queue's stored policy, None when awa.queues has no row for it."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["queue_policy"], {"name": check_name(queue, "queue")})
        row = cur.fetchone()
    if row is None:
        return None
    name, paused, rate, dlq, shards, global_max = row
    return QueuePolicy(queue=name, paused=bool(paused), rate=rate, dlq=dlq, shards=int(shards),
                       global_max=global_max)
