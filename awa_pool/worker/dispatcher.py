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
import random
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

from . import ownership
from ..core.config import QueueConfig


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


@ownership.owned
class Stride:
    """Weighted turns that last from one plan to the next (stride
    scheduling): each queue has a pass that grows by cost/weight with every
    child it is handed; the next child goes to the queue with the lowest
    pass. A queue that was idle comes back at the current pass, not with
    credit saved up. This is what keeps weights when shares are smaller
    than one child: without it the same few queues won every round (with
    100 queues of weights 2 and 1 on 15 children, weight-2 queues got 95%
    of the starts instead of 67%, and most queues none).

    A turn costs one child unless `cost` says otherwise: the claimer prices
    it in seconds of the child's time (its batch's jobs times their average
    time), so a queue whose batches are short does not pay as much as one
    whose batches are long (at 1,000 queues, each queue's first batch is
    one job of unknown length and later ones two: at one child per turn,
    weight-2 queues got 71% of the starts instead of 67%).

    It also owns the set of queues with work (`want` and `drop`), kept with
    their weights and in the heap of turns as they come and go, so what a
    plan costs does not grow with the number of queues (a supervisor plans
    every time a child comes free). The heap orders queues by pass plus a
    part of one turn drawn at random per queue and supervisor: queues that
    all come at once take turns spread out rather than a weight class at a
    time, and supervisors serving the same queues do not take them in the
    same order (the second kept finding queues the first had just emptied)."""

    def __init__(self, cost: Optional[Callable[[str], float]] = None, seed: Optional[int] = None) -> None:
        self.cost = cost
        self.passes: Dict[str, float] = {}
        self.clock = 0.0
        self.demand: Set[str] = set()    # queues believed to have work
        self._heap: List[Tuple[float, float, float, str, float]] = []  # (key, -weight, rank, name, pass)
        self._queued: Set[str] = set()   # names with an entry in the heap
        self._aside: List[str] = []      # popped in a plan but not eligible in it
        self._random = random.Random(seed)
        self._rank: Dict[str, float] = {}
        self._configs: Optional[Mapping[str, QueueConfig]] = None
        self._weights: Dict[str, float] = {}
        self._max_weight = 0.0
        self.capped: Set[str] = set()    # the queues with a max
        self._plain = False              # no queue has a min or a max
        self._demand_weight = 0.0
        self._by_weight: Dict[float, Set[str]] = {}   # the queues with work, by weight
        self._shares_key: Optional[Tuple[int, FrozenSet[str]]] = None
        self._shares: Any = {}
        self.whole: List[str] = []       # the active queues whose share is at least one child

    def configure(self, configs: Mapping[str, QueueConfig]) -> None:
        """The queues served (a new mapping starts the demand over)."""
        if configs is self._configs:
            return
        self._configs = configs
        self._weights = {name: float(config.weight) for name, config in configs.items()}
        self._max_weight = max(self._weights.values(), default=0.0)
        self.capped = {name for name, config in configs.items() if config.max is not None}
        self._plain = not self.capped and not any(config.min for config in configs.values())
        self._shares_key = None
        wanted, self.demand, self._by_weight, self._demand_weight = self.demand, set(), {}, 0.0
        self.want(wanted)

    def want(self, names: Iterable[str]) -> None:
        """These queues may have work (unknown names are ignored)."""
        for name in names:
            weight = self._weights.get(name)
            if weight is None:
                continue
            if name not in self.demand:
                self.demand.add(name)
                self._demand_weight += weight
                self._by_weight.setdefault(weight, set()).add(name)
                # back at the current pass at least: no credit saved up while idle
                if self.passes.get(name, self.clock) < self.clock:
                    self.passes[name] = self.clock
            if name not in self._queued:   # (a queue with work must always have its turn queued)
                self._push(name)

    def drop(self, name: str) -> None:
        """This queue has no work (its heap entry goes when it comes up)."""
        if name in self.demand:
            self.demand.discard(name)
            weight = self._weights[name]
            self._by_weight[weight].discard(name)
            self._demand_weight = self._demand_weight - weight if self.demand else 0.0

    def set_demand(self, names: Iterable[str]) -> None:
        wanted = set(names)
        for name in self.demand - wanted:
            self.drop(name)
        self.want(wanted - self.demand)

    def _push(self, name: str) -> None:
        rank = self._rank.get(name)
        if rank is None:
            rank = self._rank[name] = self._random.random()
        start = self.passes.setdefault(name, self.clock)
        # the random part of a turn shifts when a queue's turns come, not how often
        heapq.heappush(self._heap, (start + rank * self._turn(name), -self._weights[name], rank, name, start))
        self._queued.add(name)

    def pick(self, eligible: Callable[[str], bool]) -> Optional[str]:
        """The eligible queue with work that comes first (see the class);
        advances its pass by one turn. Queues not eligible now wait aside
        until `restore`."""
        while self._heap:
            _, _, _, name, start = heapq.heappop(self._heap)
            self._queued.discard(name)
            if name not in self.demand:   # no work: back in the heap when it has work again
                continue
            if start != self.passes[name]:  # moved up to the clock since: requeue at its pass
                self._push(name)
                continue
            if not eligible(name):
                self._aside.append(name)
                continue
            self.clock = max(start, self.clock)
            self.passes[name] = start + self._turn(name)
            self._push(name)
            return name
        return None

    def _turn(self, name: str) -> float:
        return (self.cost(name) if self.cost else 1.0) / self._weights[name]

    def restore(self) -> None:
        """Queues set aside in a plan (blocked or at their max) come back at
        the current pass at least, as if they had been idle."""
        for name in self._aside:
            if name in self.demand and name not in self._queued:
                self.passes[name] = max(self.passes[name], self.clock)
                self._push(name)
        self._aside.clear()

    def shares(self, total: int, busy: Mapping[str, int], skip: Set[str]) -> Any:
        """Each active queue's share (get(name, default) and [name]): the
        queues with work not skipped, and those holding children."""
        def wanted(name: str) -> bool:
            return name in self.demand and name not in skip

        holding = [name for name, count in busy.items() if count > 0 and name in self._weights and not wanted(name)]
        if not self._plain:
            # a min or a max somewhere: water-filling over the active set, reused while it stays the same
            active = (self.demand - skip).union(holding)
            key = (total, frozenset(active))
            if key != self._shares_key:
                self._shares_key = key
                assert self._configs is not None
                self._shares = shares(total, self._configs, active) if active else {}
                self.whole = [name for name, value in self._shares.items() if value >= 1.0 - 1e-9]
            return self._shares
        # the usual case: the weights' proportions, worked out from the demand's weight
        # kept as queues come and go, without a pass over every queue
        weight = (self._demand_weight - sum(self._weights[name] for name in skip if name in self.demand)
                  + sum(self._weights[name] for name in holding))
        self.whole = []
        if weight <= 0:
            return _Proportional(self._weights, lambda name: False, 0.0)
        factor = total / weight
        if self._max_weight * factor >= 1.0 - 1e-9:
            for value, names in self._by_weight.items():
                if value * factor >= 1.0 - 1e-9:
                    self.whole.extend(name for name in names if name not in skip)
            self.whole.extend(name for name in holding if self._weights[name] * factor >= 1.0 - 1e-9)
        holds = set(holding)
        return _Proportional(self._weights, lambda name: wanted(name) or name in holds, factor)


class _Proportional:
    """Shares proportional to weight, worked out when asked for (get and [])."""

    def __init__(self, weights: Mapping[str, float], active: Callable[[str], bool], factor: float) -> None:
        self.weights, self.active, self.factor = weights, active, factor

    def get(self, name: str, default: float = 0.0) -> float:
        return self.weights[name] * self.factor if self.active(name) else default

    def __getitem__(self, name: str) -> float:
        if not self.active(name):
            raise KeyError(name)
        return self.weights[name] * self.factor


def plan(idle: int, total: int, configs: Mapping[str, QueueConfig], busy: Mapping[str, int],
         demand: Optional[Iterable[str]] = None, blocked: Optional[Iterable[str]] = None,
         stride: Optional[Stride] = None) -> Dict[str, int]:
    """How many idle children to hand to each queue with work right now.

    idle: children free now; total: pool size; busy: children per queue now;
    demand: queues believed to have available jobs (None: the stride's own,
    kept with want/drop); blocked: queues to skip this round (rate-limited,
    paused); stride: the caller's weighted turns (kept across plans; a fresh
    one when omitted).
    """
    turns = stride if stride is not None else Stride()
    turns.configure(configs)
    if demand is not None:
        turns.set_demand(demand)
    skip = set(blocked or ())
    if idle <= 0 or len(turns.demand) <= len(skip & turns.demand):
        return {}
    share = turns.shares(total, busy, skip)
    grants: Dict[str, int] = {}
    free = idle
    # 1. raise queues below the whole part of their share, most starved first
    gaps = {name: int(math.floor(share[name] + 1e-9)) - busy.get(name, 0)
            for name in turns.whole if name in turns.demand and name not in skip}
    for name in sorted((n for n, gap in gaps.items() if gap > 0),
                       key=lambda n: (busy.get(n, 0) - share.get(n, 0.0), n)):
        if free <= 0:
            break
        give = min(gaps[name], free)
        grants[name] = give
        free -= give
    # 2. the rest, a child at a time, in weighted turns among queues with work, within max

    def eligible(name: str) -> bool:
        return name not in skip and (name not in turns.capped or _room(name, configs, busy, grants) > 0)

    try:
        while free > 0:
            name = turns.pick(eligible)
            if name is None:
                break
            grants[name] = grants.get(name, 0) + 1
            free -= 1
    finally:
        turns.restore()
    return {name: count for name, count in grants.items() if count > 0}


def _room(name: str, configs: Mapping[str, QueueConfig], busy: Mapping[str, int],
          grants: Mapping[str, int]) -> int:
    cap = configs[name].max
    held = busy.get(name, 0) + grants.get(name, 0)
    return (cap - held) if cap is not None else 1 << 30
