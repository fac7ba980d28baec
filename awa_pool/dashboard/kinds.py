"""The kinds page's read model: per kind, what its attempts cost over a
window (1 h to 7 d), in KIND_BUCKETS slices of time.

Counts are exact; cost percentiles come from a bounded sample (the latest
KIND_SAMPLE runs of each slice). Slices are aligned to the epoch, so a
slice that has closed is the same slice at every later view: KindTrends
keeps closed slices in memory and reads only the ones that are new or still
open. The first view of a long window reads its whole history once; the
next views read a slice or two.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..drivers import cursor_for
from ..job import check_name
from ..sql import QUERIES

KIND_BUCKETS = 30              # slices per window
KIND_SAMPLE = 40               # cost figures read per slice
KIND_WINDOWS = {"1h": 3600.0, "6h": 6 * 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
CLOSE_GRACE_S = 60.0           # a slice is final this long after it ends (late commits)


class BadWindow(ValueError):
    """A window the kinds page does not offer."""


def parse_window(text: Optional[str]) -> Tuple[str, float]:
    label = (text or "1h").strip()
    if label not in KIND_WINDOWS:
        raise BadWindow(f"unknown window {label[:20]!r}: use one of {', '.join(KIND_WINDOWS)}")
    return label, KIND_WINDOWS[label]


def percentile(values: Sequence[float], fraction: float) -> Optional[float]:
    """Linear interpolation between closest ranks (like percentile_cont)."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class KindBucket:
    """One slice of time: exact counts, and the sampled cost figures."""

    start: float               # epoch seconds
    finished: int = 0
    attempts: int = 0
    failures: int = 0
    crashes: int = 0
    timeouts: int = 0
    wall: List[float] = field(default_factory=list)
    cpu: List[float] = field(default_factory=list)
    rss: List[float] = field(default_factory=list)


@dataclass
class KindTrend:
    kind: str
    buckets: List[KindBucket]

    def total(self, name: str) -> int:
        return sum(getattr(bucket, name) for bucket in self.buckets)

    def all_values(self, name: str) -> List[float]:
        return [value for bucket in self.buckets for value in getattr(bucket, name)]

    def overall(self, name: str, fraction: float) -> Optional[float]:
        return percentile(self.all_values(name), fraction)

    def series(self, name: str, fraction: float) -> List[Optional[float]]:
        return [percentile(getattr(bucket, name), fraction) for bucket in self.buckets]


def _bucket(start: float, row: Dict[str, Any]) -> KindBucket:
    count = {name: int(row[name]) for name in row if name != "slot_start"}
    return KindBucket(
        start=start, finished=count["finished"], attempts=count["finished"] + count["earlier"],
        failures=count["failed_final"] - count["crash_final"] - count["timeout_final"] + count["earlier_failures"],
        crashes=count["crash_final"] + count["earlier_crashes"],
        timeouts=count["timeout_final"] + count["earlier_timeouts"])


class KindTrends:
    """Reads kind trends, keeping the closed slices it has read."""

    def __init__(self) -> None:
        self._closed: Dict[Tuple[str, float, int], KindBucket] = {}
        self._lock = threading.Lock()
        self.slices_read = 0          # how many slices the last read() fetched (for tests)

    def _fetch(self, cur: Any, kind: str, first: int, last: int, width: float) -> Dict[int, KindBucket]:
        since = first * width
        fetched = {k: KindBucket(start=k * width) for k in range(first, last + 1)}
        cur.execute(QUERIES["dash_kind_counts"], {"kind": kind, "since": since, "width_s": width})
        names = [d.name for d in cur.description]
        for values in cur.fetchall():
            row = dict(zip(names, values))
            k = round(row["slot_start"] / width)
            if k in fetched:
                fetched[k] = _bucket(k * width, row)
        cur.execute(QUERIES["dash_kind_samples"], {"kind": kind, "since": since, "width_s": width,
                                                   "slices": last - first + 1, "sample": KIND_SAMPLE})
        for slice_no, wall, cpu, rss in cur.fetchall():
            target = fetched[first + int(slice_no)]
            for values, value in ((target.wall, wall), (target.cpu, cpu), (target.rss, rss)):
                if value is not None:
                    values.append(float(value))
        return fetched

    def read(self, conn: Any, window_s: float, kind: Optional[str] = None) -> List[KindTrend]:
        """Per kind with history in the window (or just `kind`), its trend."""
        width = window_s / KIND_BUCKETS
        self.slices_read = 0
        with cursor_for(conn) as cur:
            cur.execute(QUERIES["dash_clock"])
            now = cur.fetchone()[0]
            last = math.floor(now / width)
            wanted = range(last - KIND_BUCKETS + 1, last + 1)
            if kind is None:
                cur.execute(QUERIES["dash_kinds"], {"since": wanted[0] * width})
                kinds = [row[0] for row in cur.fetchall()]
            else:
                kinds = [check_name(kind, "kind")]
            self._forget_before(width, wanted[0])
            trends = []
            for name in kinds:
                with self._lock:
                    known = {k: self._closed.get((name, width, k)) for k in wanted}
                missing = [k for k, bucket in known.items() if bucket is None]
                if missing:
                    fetched = self._fetch(cur, name, missing[0], last, width)
                    self.slices_read += len(fetched)
                    with self._lock:
                        for k, bucket in fetched.items():
                            if (k + 1) * width + CLOSE_GRACE_S <= now:
                                self._closed[(name, width, k)] = bucket
                    known.update(fetched)
                trends.append(KindTrend(kind=name, buckets=[known[k] for k in wanted]))
        return trends

    def _forget_before(self, width: float, first: int) -> None:
        with self._lock:
            for key in [key for key in self._closed if key[1] == width and key[2] < first]:
                del self._closed[key]
