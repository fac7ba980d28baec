"""Operator statistics, one read model each: per-queue stats (counts per
state, throughput, lag, paused), live supervisors and per-kind attempt
figures. The data behind `queue_stats()`, `awa-pool queues`, `kinds`, `top`,
the dashboard and the queue gauges of the Prometheus endpoint. Plus
`queue_depth()`, the live counts alone (QueueStats extends its QueueDepth),
cheap enough for an embedding program or an autoscaler to poll.

Read-only, in the caller's transaction like the admin functions; no
printing or formatting here (cli_output.py and top.py do that).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..api.drivers import adapt, cursor_for
from ..api.plan import Plan, Query, Steps
from ..core.job import check_name
from ..core.sql import QUERIES

SUPERVISOR_STALE_S = 10.0   # a supervisor silent for longer is not shown as alive
KIND_SAMPLE = 1000          # kind_stats' percentiles: each kind's latest finished jobs


@dataclass(frozen=True)
class QueueDepth:
    """A queue's live (not yet terminal) jobs, by state.

    `counts_age_s` is how old the counts are: 0 when they were counted for
    this read. Above a backlog of 100,000 live jobs (all queues together)
    the counts are the leader's census, retaken every 2 s or 25 times what
    a count takes, whichever is longer, so reads stay cheap however deep
    the backlog; then every queue's counts are of that one moment."""

    queue: str
    available: int = 0
    running: int = 0
    scheduled: int = 0
    retryable: int = 0
    waiting_external: int = 0
    counts_age_s: float = 0.0

    @property
    def total(self) -> int:
        return self.available + self.running + self.scheduled + self.retryable + self.waiting_external


@dataclass(frozen=True)
class QueueStats(QueueDepth):
    """One queue: its jobs per state (live, as in QueueDepth, and terminal
    ones still retained), whether it is paused, its lag (age of its oldest
    available job in seconds, 0 when none) and its recent throughput."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    paused: bool = False
    lag_seconds: float = 0.0
    # Jobs that reached a terminal state in the last 10 s and the last
    # minute: exact up to 10,000 in the window; above, an estimate from the
    # rate of the newest 10,000, so a fast drain does not make the read slow.
    finished_10s: int = 0
    finished_60s: int = 0
    # The queue's fleet-wide policy (awa.queues, SPEC §11): job starts per
    # second, dead-lettering (None: nobody set it, so none) and lanes.
    rate: Optional[float] = None
    dlq: Optional[bool] = None
    shards: int = 1
    global_max: Optional[int] = None   # running never exceeds it (SPEC §11)

    @property
    def jobs_per_s(self) -> float:
        """Jobs that reached a terminal state per second, over the last minute."""
        return self.finished_60s / 60.0

    @property
    def jobs_per_s_10s(self) -> float:
        return self.finished_10s / 10.0


@dataclass(frozen=True)
class SupervisorInfo:
    """A live supervisor and the stats it wrote on its last heartbeat."""

    id: int
    hostname: str
    pid: int
    version: str
    queues: Tuple[str, ...]
    workers: int
    started_at: datetime
    is_leader: bool
    heartbeat_age_s: float
    stats: Dict[str, Any] = field(default_factory=dict)

    @property
    def busy(self) -> int:
        return int(self.stats.get("busy") or 0)

    @property
    def idle(self) -> int:
        return int(self.stats.get("idle") or 0)

    @property
    def children(self) -> int:
        return int(self.stats.get("children") or 0)

    @property
    def state(self) -> str:
        return str(self.stats.get("state") or "?")

    def counter(self, *names: str) -> int:
        counters = self.stats.get("counters") or {}
        return sum(int(counters.get(name) or 0) for name in names)

    @property
    def rss_bytes(self) -> int:
        """Sum of the children's last reported RSS."""
        return sum(int(value or 0) for value in (self.stats.get("rss") or {}).values())


@dataclass(frozen=True)
class KindStats:
    """Per-kind attempt figures (SPEC §5): runs, outcomes, and p50/p95 of wall
    time, CPU time and peak RSS over the attempts whose handler returned.

    The counts cover every attempt on record, the figures (percentiles,
    rss_max, last_finished_at) the attempts of the kind's latest `sampled`
    finished jobs plus the earlier attempts of its live jobs; with a
    window, both only what finished in it (the counts in whole minutes)."""

    kind: str
    runs: int
    completed: int
    failures: int
    crashes: int
    timeouts: int
    wall_p50: Optional[float]
    wall_p95: Optional[float]
    cpu_p50: Optional[float]
    cpu_p95: Optional[float]
    rss_p50: Optional[float]
    rss_p95: Optional[float]
    rss_max: Optional[float]
    last_finished_at: Optional[datetime]
    sampled: int = 0    # finished jobs the figures were computed from


def _rows(cur: Any) -> List[Dict[str, Any]]:
    names = [d.name for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


_COUNTS = ("available", "running", "scheduled", "retryable", "waiting_external", "completed",
           "failed", "cancelled", "finished_10s", "finished_60s")


def queue_stats(conn: Any) -> List[QueueStats]:
    """One QueueStats per known queue (with jobs, history or settings), by name.
    Read in the caller's transaction; never commits. Terminal totals come
    from the history's running counts (awa.done_counts) and, above a big
    backlog, live ones from the leader's census (see QueueDepth), so the
    cost grows neither with retained history nor with the backlog."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["queue_stats"])
        rows = _rows(cur)
    return [QueueStats(queue=row["queue"], paused=bool(row["paused"]), lag_seconds=float(row["lag_s"] or 0.0),
                       counts_age_s=float(row["counts_age_s"] or 0.0), rate=row["rate_per_s"], dlq=row["dlq"],
                       shards=int(row["shards"]), global_max=row["global_max"], **{name: int(row[name]) for name in _COUNTS})
            for row in rows]


def live_supervisors(conn: Any, stale_s: float = SUPERVISOR_STALE_S) -> List[SupervisorInfo]:
    """Supervisors that heartbeat within `stale_s` seconds and have not stopped."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["live_supervisors"], {"stale_s": float(stale_s)})
        rows = _rows(cur)
    return [SupervisorInfo(
        id=row["id"], hostname=row["hostname"], pid=row["pid"], version=row["version"],
        queues=tuple(row["queues"] or ()), workers=row["workers"], started_at=row["started_at"],
        is_leader=bool(row["is_leader"]), heartbeat_age_s=float(row["heartbeat_age_s"] or 0.0),
        stats=row["stats"] if isinstance(row["stats"], dict) else {}) for row in rows]


def kind_stats(conn: Any, kind: Optional[str] = None, since_s: Optional[float] = None,
               sample: int = KIND_SAMPLE) -> List[KindStats]:
    """Per-kind figures, by kind: counts over every attempt on record and
    percentiles over each kind's latest `sample` finished jobs; with
    `since_s`, both only what finished within that many seconds. Neither
    reads all of history."""
    if kind is not None:
        check_name(kind, "kind")
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
        raise ValueError(f"sample must be an int >= 1, got {sample!r}")
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["kind_stats"], {"kind": kind, "since_s": since_s, "sample": sample})
        rows = _rows(cur)
    result = []
    for row in rows:
        figures = {name: (float(row[name]) if row[name] is not None else None) for name in (
            "wall_p50", "wall_p95", "cpu_p50", "cpu_p95", "rss_p50", "rss_p95", "rss_max")}
        result.append(KindStats(
            kind=row["kind"], runs=int(row["runs"]), completed=int(row["completed"]),
            failures=int(row["failures"]), crashes=int(row["crashes"]), timeouts=int(row["timeouts"]),
            last_finished_at=row["last_finished_at"], sampled=int(row["sampled"] or 0), **figures))
    return result


def queue_known(conn: Any, name: str) -> bool:
    """True when the queue has a settings row, a live supervisor serving it,
    or any job (live or retained) in it."""
    with cursor_for(conn) as cur:
        cur.execute(QUERIES["queue_known"], {"name": check_name(name, "queue")})
        return bool(cur.fetchone()[0])


def queue_depth_plan(queues: Optional[Iterable[str]] = None) -> Plan[Dict[str, QueueDepth]]:
    if isinstance(queues, str):
        raise TypeError("queues must be a list of queue names, not a single string")
    names = None if queues is None else [check_name(name, "queue") for name in queues]
    return Plan(_queue_depth_steps(names), loads=None)


def _queue_depth_steps(names: Optional[List[str]]) -> Steps[Dict[str, QueueDepth]]:
    counts: Dict[str, Dict[str, int]] = {name: {} for name in names or ()}
    age_s = 0.0
    rows = yield Query("queue_depth", {"queues": names})
    for queue, state, n, row_age_s in rows.values:
        counts.setdefault(queue, {})[state] = int(n)
        age_s = max(age_s, float(row_age_s or 0.0))
    return {name: QueueDepth(queue=name, counts_age_s=age_s, **by_state) for name, by_state in sorted(counts.items())}


def queue_depth(conn: Any, queues: Optional[Iterable[str]] = None) -> Dict[str, QueueDepth]:
    """Live jobs per queue (every queue with one, or each of `queues`, with
    zeros for a queue that has none). Reads only the live tables or, above
    a big backlog, the leader's census of them (see QueueDepth), never the
    history, so it stays cheap however much history is retained and however
    deep the backlog."""
    plan = queue_depth_plan(queues)
    return adapt(conn).run(plan)
