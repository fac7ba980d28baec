"""Claiming: one round trip per queue plan, through awa.claim (SKIP LOCKED,
lease bump, aging, pause, rate limits and the effective timeout all live
in SQL). The only place a claimed row becomes a ClaimedJob."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from .protocol import ClaimedJob
from .sql import QUERIES


def claim(cur: Any, *, queue: str, limit: int, supervisor_id: int, aging_s: float,
          lane: int = 0, lease: Optional[int] = None) -> List[ClaimedJob]:
    """Claim up to `limit` jobs of `queue`, in claim order. `lease` is the
    new lease of the claimed rows (None: bump each by one)."""
    cur.execute(QUERIES["claim"], {"queue": queue, "limit": limit, "supervisor": supervisor_id,
                                   "aging": aging_s, "lane": lane, "lease": lease})
    rows = cur.fetchall()
    if rows:
        _check_columns(cur.description)
    return [ClaimedJob._make(row) for row in rows]


def _check_columns(description: Sequence[Any]) -> None:
    """The claim's columns must be ClaimedJob's fields, by name and order
    (a few microseconds per claim, not per job)."""
    names = tuple(column.name for column in description)
    if names != ClaimedJob._fields:
        raise RuntimeError(f"awa.claim returns columns {names}, expected {ClaimedJob._fields}: "
                           "the schema and this awa_pool version disagree")
