"""The kinds page's read model: per kind, what its attempts cost over a
window (1 h to 7 d), in KIND_BUCKETS slices of time.

Counts are exact and read at every view from the history's running counts
(awa.done_kinds, per kind and minute, kept by triggers in the writers'
transactions), so they follow every change of history (retention, purges,
retries) and cost what the window's kinds and minutes hold, whatever the
size of the history; they count as `awa-pool kinds` counts. Cost
percentiles come from a bounded sample (the latest KIND_SAMPLE runs of each
slice) read from the history itself. Slices are aligned to the epoch, so a
slice that has closed is the same slice at every later view: KindTrends
keeps the samples of closed slices in memory and samples only the slices
that are new or still open. The first view of a long window samples all of
it once; the next views sample a slice or two.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..api.drivers import cursor_for
from ..core.sql import QUERIES

KIND_BUCKETS = 30              # slices per window
KIND_SAMPLE = 40               # cost figures read per slice
KIND_WINDOWS = {"1h": 3600.0, "6h": 6 * 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
CLOSE_GRACE_S = 60.0           # a slice is final this long after it ends (late commits)
COUNTS = ("finished", "attempts", "failures", "crashes", "timeouts")   # dash_kind_counts' columns


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
class Samples:
    """One slice's cost figures: a bounded sample of its runs."""

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


class KindTrends:
    """Reads kind trends, keeping the cost samples of the closed slices it
    has read (the counts are read whole at every view: they are cheap)."""

    def __init__(self) -> None:
        self._samples: Dict[Tuple[str, float, int], Samples] = {}
        self._lock = threading.Lock()
        self.slices_sampled = 0       # how many slices the last read() sampled (for tests)

    def read(self, conn: Any, window_s: float) -> List[KindTrend]:
        """Per kind that finished jobs in the window, its trend."""
        width = window_s / KIND_BUCKETS
        self.slices_sampled = 0
        with cursor_for(conn) as cur:
            cur.execute(QUERIES["dash_clock"])
            now = cur.fetchone()[0]
            last = math.floor(now / width)
            first = last - KIND_BUCKETS + 1
            cur.execute(QUERIES["dash_kind_counts"], {"since": first * width, "width_s": width})
            names = [d.name for d in cur.description]
            counted: Dict[str, Dict[int, Dict[str, Any]]] = {}   # kind -> slice -> counts, in kind order
            for values in cur.fetchall():
                row = dict(zip(names, values))
                counted.setdefault(row["kind"], {})[round(row["slot_start"] / width)] = row
            self._forget_before(width, first)
            trends = []
            for kind, slices in counted.items():
                samples = self._sampled(cur, kind, first, last, width, now)
                buckets = []
                for k in range(first, last + 1):
                    row = slices.get(k, {})
                    sample = samples.get(k) or Samples()
                    buckets.append(KindBucket(
                        start=k * width, **{name: int(row.get(name, 0)) for name in COUNTS},
                        wall=sample.wall, cpu=sample.cpu, rss=sample.rss))
                trends.append(KindTrend(kind=kind, buckets=buckets))
        return trends

    def _sampled(self, cur: Any, kind: str, first: int, last: int, width: float,
                 now: float) -> Dict[int, Optional[Samples]]:
        """The kind's samples of slices first..last: kept ones, the rest read
        (from the oldest one missing to the open one)."""
        with self._lock:
            known = {k: self._samples.get((kind, width, k)) for k in range(first, last + 1)}
        missing = [k for k, sample in known.items() if sample is None]
        if not missing:
            return known
        fetched = {k: Samples() for k in range(missing[0], last + 1)}
        cur.execute(QUERIES["dash_kind_samples"], {"kind": kind, "since": missing[0] * width, "width_s": width,
                                                   "slices": len(fetched), "sample": KIND_SAMPLE})
        for slice_no, wall, cpu, rss in cur.fetchall():
            target = fetched[missing[0] + int(slice_no)]
            for values, value in ((target.wall, wall), (target.cpu, cpu), (target.rss, rss)):
                if value is not None:
                    values.append(float(value))
        self.slices_sampled += len(fetched)
        with self._lock:
            for k, sample in fetched.items():
                if (k + 1) * width + CLOSE_GRACE_S <= now:
                    self._samples[(kind, width, k)] = sample
        known.update(fetched)
        return known

    def _forget_before(self, width: float, first: int) -> None:
        with self._lock:
            for key in [key for key in self._samples if key[1] == width and key[2] < first]:
                del self._samples[key]
