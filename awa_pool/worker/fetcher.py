"""Claiming: one round trip per queue plan, through awa.claim (SKIP LOCKED,
lease bump, aging, pause, rate limits and the effective timeout all live
in SQL). The only place a claimed row becomes a ClaimedJob."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .outcome_params import completion_params
from .protocol import ClaimedJob, Outcome
from ..core.sql import QUERIES

PRIORITY_LEVELS = (1, 2, 3, 4)

# Per priority level, the (run_at, id) of the last job claimed at it.
Cursor = Mapping[int, Tuple[float, int]]


def claim(cur: Any, *, queue: str, limit: int, supervisor_id: int, aging_s: float,
          lane: int = 0, lease: Optional[int] = None, after: Optional[Cursor] = None,
          completing: Sequence[Outcome] = ()) -> List[ClaimedJob]:
    """Claim up to `limit` jobs of `queue`, in claim order. `lease` is the
    new lease of the claimed rows (None: bump each by one). `after`: scan
    each priority level from past this cursor instead of from the start.
    `completing`: successes (lease-guarded, as the completer writes them)
    written first, in the same round trip and transaction."""
    run_at, ids = (None, None) if not after else (
        [after[p][0] if p in after else None for p in PRIORITY_LEVELS],
        [after[p][1] if p in after else None for p in PRIORITY_LEVELS])
    params = {"queue": queue, "limit": limit, "supervisor": supervisor_id, "aging": aging_s,
              "lane": lane, "lease": lease, "after_run_at": run_at, "after_id": ids}
    if completing:
        params.update(completion_params(completing))
        cur.execute(QUERIES["complete_then_claim"], params)
    else:
        cur.execute(QUERIES["claim"], params)
    rows = cur.fetchall()
    if rows:
        _check_columns(cur.description)
    return [ClaimedJob._make(row) for row in rows]


def queues_with_work(cur: Any, queues: Sequence[str]) -> List[str]:
    """Which of these queues have jobs available now and are not paused."""
    cur.execute(QUERIES["queues_with_work"], {"queues": list(queues)})
    return [row[0] for row in cur.fetchall()]


def _check_columns(description: Sequence[Any]) -> None:
    """The claim's columns must be ClaimedJob's fields, by name and order
    (a few microseconds per claim, not per job)."""
    names = tuple(column.name for column in description)
    if names != ClaimedJob._fields:
        raise RuntimeError(f"awa.claim returns columns {names}, expected {ClaimedJob._fields}: "
                           "the schema and this awa_pool version disagree")


def advance(cursor: Optional[Cursor], jobs: Sequence[ClaimedJob]) -> Dict[int, Tuple[float, int]]:
    """The cursor past `jobs` (claimed from `cursor`, or from the start when
    None): per level, the furthest (run_at, id) claimed."""
    moved: Dict[int, Tuple[float, int]] = dict(cursor or {})
    for job in jobs:
        mark = (job.run_at, job.id)
        if job.priority not in moved or mark > moved[job.priority]:
            moved[job.priority] = mark
    return moved
