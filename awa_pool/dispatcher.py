"""Weighted fair share: turn idle children into a per-queue claim plan.

Pure functions, no I/O. The model: every queue that is active (has work or
holds children) is entitled to its `min` plus a weight-proportional share of
the rest of the pool, capped at its `max` (water-filling, so capacity a
capped queue cannot use flows to the others). Idle children go first to
queues below their entitlement; any still idle go to queues with work, by
weight, so no child idles while some queue has work it may take.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Mapping, Optional

from .config import QueueConfig


def entitlements(total: int, configs: Mapping[str, QueueConfig], active: Iterable[str]) -> Dict[str, int]:
    """How many of `total` children each active queue should hold."""
    names = sorted(set(active))
    if not names or total <= 0:
        return {}
    share: Dict[str, float] = {}
    caps = {name: (configs[name].max if configs[name].max is not None else total) for name in names}
    floor_ = {name: min(configs[name].min, caps[name]) for name in names}
    remaining = total - sum(floor_.values())
    if remaining < 0:  # minimums overbooked by active queues: scale them down
        return _largest_remainder({n: floor_[n] * total / sum(floor_.values()) for n in names}, total, caps)
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
    return _largest_remainder(share, min(total, sum(caps.values())), caps)


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


def plan(idle: int, total: int, configs: Mapping[str, QueueConfig], busy: Mapping[str, int],
         demand: Iterable[str], blocked: Optional[Iterable[str]] = None) -> Dict[str, int]:
    """How many idle children to hand to each queue with work right now.

    idle: children free now; total: pool size; busy: children per queue now;
    demand: queues believed to have available jobs; blocked: queues to skip
    this round (rate-limited, paused).
    """
    skip = set(blocked or ())
    wanting = [name for name in demand if name in configs and name not in skip]
    if idle <= 0 or not wanting:
        return {}
    active = set(wanting) | {name for name, count in busy.items() if count > 0 and name in configs}
    target = entitlements(total, configs, active)
    grants: Dict[str, int] = {}
    free = idle
    # 1. raise queues below their entitlement, most starved first
    for name in sorted(wanting, key=lambda n: (busy.get(n, 0) - target.get(n, 0), n)):
        gap = target.get(name, 0) - busy.get(name, 0)
        if gap > 0 and free > 0:
            give = min(gap, free)
            grants[name] = give
            free -= give
    # 2. idle capacity flows to any queue with work, by weight, within max
    while free > 0:
        candidates = [name for name in wanting if _room(name, configs, busy, grants) > 0]
        if not candidates:
            break
        weight_sum = sum(configs[name].weight for name in candidates)
        progressed = False
        for name in sorted(candidates, key=lambda n: (-configs[n].weight, n)):
            if free <= 0:
                break
            give = max(1, int(free * configs[name].weight / weight_sum))
            give = min(give, free, _room(name, configs, busy, grants))
            if give > 0:
                grants[name] = grants.get(name, 0) + give
                free -= give
                progressed = True
        if not progressed:
            break
    return {name: count for name, count in grants.items() if count > 0}


def _room(name: str, configs: Mapping[str, QueueConfig], busy: Mapping[str, int],
          grants: Mapping[str, int]) -> int:
    cap = configs[name].max
    held = busy.get(name, 0) + grants.get(name, 0)
    return (cap - held) if cap is not None else 1 << 30
