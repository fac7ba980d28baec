"""The soak's sampling: the queries it reads, first-attempt pickups read a
thin slice at a time, and the machine's I/O wait and stolen CPU
(scripts/soak.py)."""
from __future__ import annotations

import time
from typing import List, Optional, Tuple

from soak_producer import CommitStats


CLAIM_PATH_TABLES = ("jobs_hot", "queues")
# Their dead tuples form a saw-tooth (the leader vacuums at a threshold), so
# they are read this often and each sample keeps the highest reading since
# the previous one: single readings every few seconds would land anywhere on
# the teeth. (Backends publish their counts about once a second.)
DEAD_READ_EVERY_S = 0.5


SAMPLE_SQL = {
    # Pickup of ready jobs (first attempts); scheduled jobs are reported apart
    # because their lateness includes the leader's promotion interval.
    "window": """
        -- one row per job: (producer transaction, from run_at, scheduled, claimed at)
        -- date_part, not extract: float8 directly, a third cheaper than numeric
        SELECT (j.args->>'tx')::bigint, date_part('epoch', j.attempted_at - j.run_at),
               j.args ? 'scheduled', date_part('epoch', j.attempted_at)
          FROM awa.jobs_done j
         -- queue and state first: an index range scan, not a scan of all history
         WHERE j.queue = 'soak' AND j.state = 'completed' AND j.attempt = 1
           AND j.finalized_at > to_timestamp(%(lo)s) AND j.finalized_at <= to_timestamp(%(hi)s)""",
    "depth": """
        SELECT (SELECT count(*) FROM awa.jobs_hot WHERE state = 'available'),
               (SELECT count(*) FROM awa.jobs_hot WHERE state = 'running'),
               (SELECT count(*) FROM awa.jobs_deferred)""",
    "tables": """
        SELECT c.relname, coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
               pg_total_relation_size(c.oid)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE n.nspname = 'awa' AND c.relkind IN ('r', 'p')""",
    # The supervisors' own counters (published with each heartbeat): how
    # many round trips the load costs.
    "round_trips": """
        SELECT coalesce(sum((stats->'counters'->>'claims')::bigint), 0)::bigint,
               coalesce(sum((stats->'counters'->>'empty_claims')::bigint), 0)::bigint,
               coalesce(sum((stats->'counters'->>'claimed_jobs')::bigint), 0)::bigint,
               coalesce(sum((stats->'counters'->>'completion_flushes')::bigint), 0)::bigint
          FROM awa.supervisors WHERE stopped_at IS NULL""",
    "claim_path_dead": """
        SELECT relname, n_dead_tup FROM pg_stat_user_tables
         WHERE schemaname = 'awa' AND relname = ANY(%s)""",
    "indexes": """
        SELECT c.relname, pg_relation_size(c.oid)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'awa' AND c.relkind = 'i'""",
}


# Jobs are read in 0.1-second slices of finalized_at, each slice once it is
# PICKUP_LAG_S old (a completion flush in flight would be missed by a
# fresher one). The sampler's reads are CPU the pool does not get: one
# query per 5-second sample was a burst of 0.1-0.17 s at 10,000 jobs/s,
# and one per second still 50-60 ms of a backend's CPU at 8,000 jobs/s,
# which lined up with slow-pickup clusters on two cores. Small slices
# spread the same work thinly.
PICKUP_SLICE_S = 0.1
PICKUP_LAG_S = 0.5


class Pickups:
    """First-attempt pickups of the window so far, read a slice at a time."""

    def __init__(self, cur, since: float, commits: CommitStats, slow_s: Optional[float] = None) -> None:
        self.cur = cur
        self.commits = commits
        self.read_up_to = since
        self.rows: List[tuple] = []
        self.slow_s = slow_s
        self.slow: List[tuple] = []  # (claimed at, pickup s) above slow_s, for --trace-slow-ms

    def read_if_due(self, force: bool = False) -> None:
        upper = time.time() - PICKUP_LAG_S
        while upper - self.read_up_to >= PICKUP_SLICE_S or (force and upper > self.read_up_to):
            hi = min(upper, self.read_up_to + PICKUP_SLICE_S)
            self.cur.execute(SAMPLE_SQL["window"], {"lo": self.read_up_to, "hi": hi})
            # (from commit, from run_at, scheduled, claimed at); from commit is
            # None for scheduled jobs, and if the commit time is not known
            jobs = self.cur.fetchall()
            commit_times = self.commits.commit_times({job[0] for job in jobs})
            for tx, from_run_at, scheduled, claimed_at in jobs:
                committed = None if scheduled else commit_times.get(tx)
                self.rows.append((None if committed is None else claimed_at - committed,
                                  from_run_at, scheduled, claimed_at))
            self.read_up_to = hi

    def take(self) -> tuple:
        """(jobs, p50 and p99 from commit, p99 from run_at, scheduled p99)
        of everything read since the last take, in seconds (None if none)."""
        self.read_if_due(force=True)
        rows, self.rows = self.rows, []
        ready = [row for row in rows if not row[2]]
        if self.slow_s is not None:
            self.slow += [(row[3], row[0]) for row in ready if row[0] is not None and row[0] > self.slow_s]
        from_commit = sorted(row[0] for row in ready if row[0] is not None)
        from_run_at = sorted(row[1] for row in ready)
        scheduled = sorted(row[1] for row in rows if row[2])
        return (len(rows), percentile(from_commit, 0.5), percentile(from_commit, 0.99),
                percentile(from_run_at, 0.99), percentile(scheduled, 0.99))


STOLEN_PCT = 3.0  # a window that lost this much CPU to other guests is called out in the p99 bar


class CpuShares:
    """Shares of the machine's CPU time since the last take (Linux
    /proc/stat; None elsewhere): waiting for disk I/O, and stolen by the
    hypervisor for other guests (a VM that slows down under a noisy
    neighbour shows it here, not in the pool's figures)."""

    def __init__(self) -> None:
        self.last = self._read()

    @staticmethod
    def _read() -> Optional[List[int]]:
        try:
            with open("/proc/stat") as f:
                return [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None

    def take(self) -> Tuple[Optional[float], Optional[float]]:
        """(iowait %, steal %)"""
        now, last = self._read(), self.last
        self.last = now
        if now is None or last is None or sum(now) == sum(last):
            return None, None
        total = sum(now) - sum(last)
        return (round(100.0 * (now[4] - last[4]) / total, 1),
                round(100.0 * (now[7] - last[7]) / total, 1))


def percentile(ordered: List[float], q: float) -> Optional[float]:
    """Linear interpolation between the closest ranks (PostgreSQL's percentile_cont)."""
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
