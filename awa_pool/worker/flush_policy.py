"""When outcomes are written: the completer's flush rules in one place.

Every flush is a statement and a commit whatever its size (about a
millisecond of server and supervisor CPU while the cores are busy with
jobs), so a small flush gathers company before it goes:

- first COALESCE_S, for what arrives together;
- then, while jobs still run and outcomes arrive less than MAX_COALESCE_S
  apart (long jobs on several children), up to MAX_COALESCE_S after the
  first pending outcome: for more of them, and for a claim to carry them.
  The whole window, not only until the next outcome is due: children that
  run 45 ms jobs refill (a claim) every 45 ms or so, and a flush that went
  when the next outcome was due went just before that claim could carry it.
  A completion is still written at most MAX_COALESCE_S late.
- A claim carries the waiting successes (Claimer, `complete_then_claim`)
  only when at most RIDE_MAX wait, all plain (no result, no progress: values
  the database cannot refuse). Short jobs leave many, which the completer
  writes on its own connection while the claim runs; carried, they made
  every claim of a no-op backlog longer (a quarter less drain).

A buffer holding a failed flush waits for no company and lends nothing: it
goes again as soon as its backoff allows.
"""
from __future__ import annotations

from typing import Optional

FLUSH_SIZE = 200          # a buffer this full is not small: it goes at once
RIDE_MAX = 4


class FlushPolicy:
    COALESCE_S = 0.002
    MAX_COALESCE_S = 0.05
    GAP_ALPHA = 0.2

    def __init__(self) -> None:
        self.last_arrival: Optional[float] = None
        self.gap_s: Optional[float] = None    # moving average of the gap between arrivals
        self.more_coming = False              # jobs were still running at the last arrival
        self.retrying = False                 # the buffer holds a failed flush

    def arrived(self, now: float, more_coming: bool) -> None:
        """Outcomes arrived (one call per child report, whatever its size)."""
        if self.last_arrival is not None:
            gap = min(now - self.last_arrival, 2 * self.MAX_COALESCE_S)
            self.gap_s = gap if self.gap_s is None else self.gap_s + self.GAP_ALPHA * (gap - self.gap_s)
        self.last_arrival = now
        self.more_coming = more_coming

    @staticmethod
    def small(pending: int) -> bool:
        return 0 < pending < FLUSH_SIZE // 4

    def window(self, pending: int) -> float:
        """How long after its first pending outcome a small flush may wait:
        MAX_COALESCE_S at a steady trickle while jobs still run, else none."""
        if self.retrying or not self.more_coming or not self.small(pending):
            return 0.0
        if self.gap_s is None or self.gap_s >= self.MAX_COALESCE_S:
            return 0.0
        return self.MAX_COALESCE_S

    def may_ride(self, waiting_successes: int) -> bool:
        """May a claim about to go carry the successes waiting now?"""
        return not self.retrying and 0 < waiting_successes <= RIDE_MAX
