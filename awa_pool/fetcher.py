"""Claiming: one round trip per queue plan, through awa.claim (SKIP LOCKED,
lease bump, aging, pause and rate limits all live in SQL)."""
from __future__ import annotations

from typing import Any, List

from .sql import QUERIES


def claim(cur: Any, *, queue: str, limit: int, supervisor_id: int, aging_s: float,
          lane: int = 0) -> List[tuple]:
    """Claim up to `limit` jobs of `queue`; rows in awa.claim's column order."""
    cur.execute(QUERIES["claim"], {"queue": queue, "limit": limit, "supervisor": supervisor_id,
                                   "aging": aging_s, "lane": lane})
    return cur.fetchall()
