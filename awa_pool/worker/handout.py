"""The hand-out, one pass per loop turn: share the idle children among the
queues with work (dispatcher.plan), claim one batch per queue (Claimer),
place the jobs (placement) and send them (Children.assign); then claim new
priority-1 jobs at once for the children placement names (a rush), and
the next batch of children half-way through a batch of short jobs.

Runs on the loop's thread only, like everything it touches: it owns no
state, it applies decisions to their owners.
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

from . import dispatcher, ownership, placement
from .children import ChildHandle, Children
from .claimer import Claimer
from ..core.config import PoolConfig


@ownership.owned
class HandOut:
    def __init__(self, config: PoolConfig, children: Children, claimer: Claimer,
                 ready: Callable[[], bool]) -> None:
        self.config = config
        self.children = children
        self.claimer = claimer
        self.times = claimer.times
        self.ready = ready   # connected, and outcomes are not piling up: claims may go

    def run(self) -> None:
        if not self.ready():
            return
        self._idle_children()
        if self.claimer.rushing and self.ready():
            self._rush(time.monotonic())
        if self.ready():
            self._refills(time.monotonic())

    def _idle_children(self) -> None:
        """Plan, claim, place. Plans again at once while a round leaves
        children idle and some queue may still have work (a claim that comes
        back short clears that queue's flag)."""
        queues = self.claimer.queues
        for _ in range(len(queues) + 1):
            idle = self.children.idle()
            if not idle or not self.ready():
                return
            now = time.monotonic()
            plan = dispatcher.plan(len(idle), self.config.workers, queues, self.children.busy_by_queue(),
                                   None, self.claimer.blocked(now), self.claimer.stride)
            if not plan:
                return
            given, free = 0, iter(idle)
            for name, count in plan.items():
                got = self._fill(name, [next(free) for _ in range(count)], now)
                if got is None:
                    return
                given += got
            if given == len(idle):
                return

    def _fill(self, name: str, kids: List[ChildHandle], now: float) -> Optional[int]:
        """One claim for these children of a queue, each taking up to its
        batch (a child due for recycling no more than it has left); returns
        how many got work (None: the claim failed)."""
        depth = self.claimer.depth(name)
        caps = [max(1, min(depth, child.tasks_left)) for child in kids]
        jobs = self.claimer.claim(name, sum(caps), now)
        if jobs is None:
            return None
        urgency = self.claimer.urgency(name, time.time())
        moves = placement.batches(jobs, kids, caps)
        for child, batch in moves:
            self.children.assign(child, name, batch, urgency, self.times.patience(name))
        return len(moves)

    def _rush(self, now: float) -> None:
        """New priority-1 jobs (awa_urgent): one claim per queue of priority-1
        jobs only, one for each child placement names; they go ahead of the
        less urgent jobs those children hold queued (Children.assign)."""
        for name in self.claimer.take_rushing(now):
            urgency = self.claimer.urgency(name, time.time())
            kids = placement.rush_targets(
                self.children.idle(), self._room(name), self.children.serving(name), self.times.batched(name),
                wants_refill=lambda child: child.refill_wanted,
                holds_less_urgent=lambda child: placement.goes_ahead(1, child.queued_jobs,
                                                                     child.lowest_priority, urgency))
            if not kids:
                continue
            jobs = self.claimer.claim_urgent(name, len(kids))
            if jobs is None:
                return
            for child, job in zip(kids, jobs):
                self.children.assign(child, name, [job], urgency, self.times.patience(name))

    def _refills(self, now: float) -> None:
        wanting = self.children.wanting_refill()
        if not wanting:
            return
        blocked = self.claimer.blocked(now)
        busy = self.children.busy_by_queue()
        share = self.claimer.stride.shares(self.config.workers, busy, blocked)
        for name, kids in placement.refills(wanting, self.times, self.claimer.with_work, blocked, busy, share):
            if self._fill(name, kids, now) is None:
                return

    def _room(self, name: str) -> int:
        """How many more children the queue may have (its max)."""
        cap = self.claimer.queues[name].max
        return self.config.workers if cap is None else max(
            0, cap - self.children.busy_by_queue().get(name, 0))
