"""Claiming: one round trip per queue plan, through awa.claim (SKIP LOCKED,
lease bump, aging, pause and rate limits all live in SQL)."""
from __future__ import annotations

from typing import Any, List, Optional

from .sql import QUERIES


def claim(cur: Any, *, queue: str, limit: int, supervisor_id: int, aging_s: float,
          lane: int = 0, lease: Optional[int] = None) -> List[tuple]:
    """Claim up to `limit` jobs of `queue`; rows in awa.claim's column order.
    `lease` is the new lease of the claimed rows (None: bump each by one)."""
    cur.execute(QUERIES["claim"], {"queue": queue, "limit": limit, "supervisor": supervisor_id,
                                   "aging": aging_s, "lane": lane, "lease": lease})
    return cur.fetchall()
