"""Weighted fair share: turn idle children into a per-queue claim plan.

No I/O. The model: every queue that is active (has work or holds children)
is entitled to its `min` plus a weight-proportional share of the rest of the
pool, capped at its `max` (water-filling, so capacity a capped queue cannot
use flows to the others). Idle children go first to queues below the whole
part of their share; any still idle go to queues with work one at a time,
in weighted turns that last across plans (Stride), so no child idles while
some queue has work it may take, and shares smaller than one child (more
active queues than children) still add up to the weights over time.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

from .config import QueueConfig


def entitlements(total: int, configs: Mapping[str, QueueConfig], active: Iterable[str]) -> Dict[str, int]:
    """How many of `total` children each active queue should hold (whole
    children: the shares of `shares`, rounded by largest remainder)."""
    names = sorted(set(active))
    if not names or total <= 0:
        return {}
    caps = {name: (configs[name].max if configs[name].max is not None else total) for name in names}
    return _largest_remainder(shares(total, configs, names), min(total, sum(caps.values())), caps)


def shares(total: int, configs: Mapping[str, QueueConfig], active: Iterable[str]) -> Dict[str, float]:
    """Each active queue's share of `total` children, in fractions of a child."""
    names = set(active)
    if not names or total <= 0:
        return {}
    plain = [configs[name] for name in names]
    if not any(c.min or c.max is not None for c in plain):
        # no minimum, no maximum (the usual case): shares are the weights' proportions,
        # worked out in one pass (a supervisor redoes this whenever queues come and go)
        weight_sum = sum(c.weight for c in plain)
        return {name: total * configs[name].weight / weight_sum for name in names}
    names = sorted(names)
    share: Dict[str, float] = {}
    caps = {name: (configs[name].max if configs[name].max is not None else total) for name in names}
    floor_ = {name: min(configs[name].min, caps[name]) for name in names}
    remaining = total - sum(floor_.values())
    if remaining < 0:  # minimums overbooked by active queues: scale them down
        return {n: floor_[n] * total / sum(floor_.values()) for n in names}
    open_ = set(names)
    share = {name: float(floor_[name]) for name in names}
    # water-filling: hand out `remaining` by weight, capping at max
    while remaining > 1e-9 and open_:
        weight_sum = sum(configs[name].weight for name in open_)
        handed = 0.0
        capped = set()
        for name in sorted(open_):
            portion = remaining * configs[name].weight / weight_sum
            room = caps[name] - share[name]
            if portion >= room:
                portion = room
                capped.add(name)
            share[name] += portion
            handed += portion
        remaining -= handed
        open_ -= capped
        if not capped:
            break
    return share


def _largest_remainder(shares: Mapping[str, float], total: int, caps: Mapping[str, int]) -> Dict[str, int]:
    result = {name: min(int(math.floor(value + 1e-9)), caps[name]) for name, value in shares.items()}
    left = min(total, int(round(sum(shares.values())))) - sum(result.values())
    order = sorted(shares, key=lambda n: (-(shares[n] - math.floor(shares[n] + 1e-9)), n))
    for name in order:
        if left <= 0:
            break
        if result[name] < caps[name]:
            result[name] += 1
            left -= 1
    return result


class Stride:
    """Weighted turns that last from one plan to the next (stride
    scheduling): each queue has a pass that grows by 1/weight with every
    child it is handed; the next child goes to the queue with the lowest
    pass. A queue that was idle comes back at the current pass, not with
    credit saved up. This is what keeps weights when shares are smaller
    than one child: without it the same few queues won every round (with
    100 queues of weights 2 and 1 on 15 children, weight-2 queues got 95%
    of the starts instead of 67%, and most queues none).

    It also keeps what a plan costs small with many queues (a supervisor
    plans every time a child comes free): a heap of the queues with work
    instead of a scan of all of them, and the last shares computed, reused
    while the set of active queues stays the same."""

    def __init__(self) -> None:
        self.passes: Dict[str, float] = {}
        self.clock = 0.0
        self._heap: List[Tuple[float, float, str]] = []
        self._queued: Set[str] = set()
        self._shares_key: Optional[Tuple[int, FrozenSet[str]]] = None
        self._shares: Any = {}
        self.whole: List[str] = []   # the queues whose share is at least one child
        self._capped_of: Optional[Mapping[str, QueueConfig]] = None
        self.capped: Set[str] = set()   # the queues with a max
        self._plain = False              # no queue has a min or a max
        self._weights: Dict[str, float] = {}
        self._max_weight = 0.0

    def shares(self, total: int, configs: Mapping[str, QueueConfig], active: Set[str]) -> Any:
        """Each active queue's share (get(name, default) and [name]), the last
        one reused while `total` and the active set stay the same."""
        if configs is not self._capped_of:
            self._capped_of = configs
            self.capped = {name for name, config in configs.items() if config.max is not None}
            self._plain = not self.capped and not any(config.min for config in configs.values())
            self._weights = {name: config.weight for name, config in configs.items()}
            self._max_weight = max(self._weights.values(), default=0.0)
        key = (total, frozenset(active))
        if key != self._shares_key:
            self._shares_key = key
            if self._plain and active:
                # the usual case: the weights' proportions, worked out on demand
                # (with many queues the active set changes at nearly every plan)
                factor = total / sum(self._weights[name] for name in active)
                self._shares = _Proportional(self._weights, active, factor)
                self.whole = ([name for name in active if self._weights[name] * factor >= 1.0 - 1e-9]
                              if self._max_weight * factor >= 1.0 - 1e-9 else [])
            else:
                self._shares = shares(total, configs, active)
                self.whole = [name for name, value in self._shares.items() if value >= 1.0 - 1e-9]
        return self._shares

    def pick(self, candidates: Set[str], configs: Mapping[str, QueueConfig]) -> Optional[str]:
        """The candidate with the lowest pass (then the higher weight, then
        the name); advances its pass."""
        for name in candidates - self._queued:
            heapq.heappush(self._heap, (max(self.passes.get(name, self.clock), self.clock),
                                        -configs[name].weight, name))
            self._queued.add(name)
        while self._heap:
            _, _, name = heapq.heappop(self._heap)
            self._queued.discard(name)
            if name in candidates:   # others come back when they have work again
                self.clock = max(self.passes.get(name, self.clock), self.clock)
                self.passes[name] = self.clock + 1.0 / configs[name].weight
                return name
        return None


class _Proportional:
    """Shares proportional to weight, worked out when asked for (get and [])."""

    def __init__(self, weights: Mapping[str, float], active: Set[str], factor: float) -> None:
        self.weights, self.active, self.factor = weights, active, factor

    def get(self, name: str, default: float = 0.0) -> float:
        return self.weights[name] * self.factor if name in self.active else default

    def __getitem__(self, name: str) -> float:
        if name not in self.active:
            raise KeyError(name)
        return self.weights[name] * self.factor


def plan(idle: int, total: int, configs: Mapping[str, QueueConfig], busy: Mapping[str, int],
         demand: Iterable[str], blocked: Optional[Iterable[str]] = None,
         stride: Optional[Stride] = None) -> Dict[str, int]:
    """How many idle children to hand to each queue with work right now.

    idle: children free now; total: pool size; busy: children per queue now;
    demand: queues believed to have available jobs; blocked: queues to skip
    this round (rate-limited, paused); stride: the caller's weighted turns
    (kept across plans; a fresh one when omitted).
    """
    skip = set(blocked or ())
    wanting = [name for name in demand if name in configs and name not in skip]
    if idle <= 0 or not wanting:
        return {}
    turns = stride if stride is not None else Stride()
    active = set(wanting).union(name for name, count in busy.items() if count > 0 and name in configs)
    share = turns.shares(total, configs, active)
    grants: Dict[str, int] = {}
    free = idle
    # 1. raise queues below the whole part of their share, most starved first
    wanted = set(wanting)
    gaps = {name: int(math.floor(share[name] + 1e-9)) - busy.get(name, 0)
            for name in turns.whole if name in wanted}
    for name in sorted((n for n, gap in gaps.items() if gap > 0),
                       key=lambda n: (busy.get(n, 0) - share.get(n, 0.0), n)):
        if free <= 0:
            break
        give = min(gaps[name], free)
        grants[name] = give
        free -= give
    # 2. the rest, a child at a time, in weighted turns among queues with work, within max
    candidates = wanted - {name for name in turns.capped & wanted if _room(name, configs, busy, grants) <= 0}
    while free > 0 and candidates:
        name = turns.pick(candidates, configs)
        if name is None:
            break
        grants[name] = grants.get(name, 0) + 1
        free -= 1
        if _room(name, configs, busy, grants) <= 0:
            candidates.discard(name)
    return {name: count for name, count in grants.items() if count > 0}


def _room(name: str, configs: Mapping[str, QueueConfig], busy: Mapping[str, int],
          grants: Mapping[str, int]) -> int:
    cap = configs[name].max
    held = busy.get(name, 0) + grants.get(name, 0)
    return (cap - held) if cap is not None else 1 << 30
