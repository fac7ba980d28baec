"""The overview's throughput: jobs that reached a terminal state per
minute over the last hour, per queue and state.

Minutes are aligned to the database's clock; a minute that has closed
never changes, so ThroughputMinutes keeps closed minutes and the 2-second
refresh reads only the current minute (and any it has not seen yet)
instead of an hour of history.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from ..api.drivers import cursor_for
from ..core.sql import QUERIES

MINUTES = 60              # the chart's span
CLOSE_GRACE_S = 10.0      # a minute is final this long after it ends (late commits)
STATES = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class Throughput:
    """Jobs finished per minute over the last hour, oldest minute first."""

    completed: List[int]
    failed: List[int]
    cancelled: List[int]

    @property
    def total(self) -> int:
        return sum(self.completed) + sum(self.failed) + sum(self.cancelled)

    @classmethod
    def summed(cls, series: Sequence["Throughput"]) -> "Throughput":
        """Every queue's series added up, minute by minute."""
        def total(state: str) -> List[int]:
            return [sum(getattr(one, state)[i] for one in series) for i in range(MINUTES)]

        return cls(*(total(state) for state in STATES))


class ThroughputMinutes:
    """Reads per-minute throughput, keeping the minutes that have closed."""

    def __init__(self) -> None:
        self._closed: Dict[Tuple[str, int], Dict[str, int]] = {}
        self._lock = threading.Lock()
        self.minutes_read = 0        # how many minutes the last read() fetched (for tests)

    def read(self, conn: Any, queues: Sequence[str]) -> Dict[str, Throughput]:
        with cursor_for(conn) as cur:
            cur.execute(QUERIES["dash_clock"])
            now = cur.fetchone()[0]
            current = math.floor(now / 60)
            wanted = range(current - MINUTES + 1, current + 1)
            with self._lock:
                for key in [key for key in self._closed if key[1] < wanted[0]]:
                    del self._closed[key]
                missing = [m for m in wanted if any((q, m) not in self._closed for q in queues)]
            fetched: Dict[Tuple[str, int], Dict[str, int]] = {}
            self.minutes_read = 0
            if queues and missing:
                self.minutes_read = current - missing[0] + 1
                cur.execute(QUERIES["dash_throughput"], {"queues": list(queues), "since": missing[0] * 60})
                for queue, state, minute_start, n in cur.fetchall():
                    counts = fetched.setdefault((queue, round(minute_start / 60)), {})
                    counts[state] = counts.get(state, 0) + int(n)
                with self._lock:
                    for minute in range(missing[0], current + 1):
                        if (minute + 1) * 60 + CLOSE_GRACE_S <= now:
                            for queue in queues:
                                self._closed[(queue, minute)] = fetched.get((queue, minute), {})
            with self._lock:
                known = {key: self._closed.get(key) for key in ((q, m) for q in queues for m in wanted)}
        result = {}
        for queue in queues:
            per_minute = [known[(queue, m)] if known[(queue, m)] is not None else fetched.get((queue, m), {})
                          for m in wanted]
            result[queue] = Throughput(*([counts.get(state, 0) for counts in per_minute] for state in STATES))
        return result
