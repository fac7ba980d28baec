"""Placement: how many jobs a child takes per claim, which children a claim
is for, how a claim's jobs are shared among them, and when a new job goes
ahead of jobs a child holds queued. Decisions only: no I/O, no clock of its
own, no state but the job times it is fed. The hand-out (handout.py) asks
and applies the answers; Children sends what it is told to send.

A child runs its jobs in the order it gets them. Jobs shorter than
PREFETCH_BELOW_S come in batches of about TARGET_BATCH_S of work (at least
two), and the child asks for its next batch (LOW) when half of one has
started, so it never waits for a claim between batches: measured on 45 ms
jobs, the children's cores stayed busy 97 % of the time this way against
93 % when such jobs were claimed one per free child (docs/architecture.md,
"Prefetch"). Longer jobs, and jobs of a queue not measured yet, come one
per child, when the child is free. A job queued behind one that runs
longer than its queue's patience is taken back for another child.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

from . import ownership
from .protocol import ClaimedJob

TARGET_BATCH_S = 0.004     # a child's batch of short jobs should take about this long
PREFETCH_BELOW_S = 0.25    # jobs shorter than this come in batches, the next one queued early
EWMA_ALPHA = 0.2
TURN_JOB_FLOOR_S = 0.0001  # a job costs a turn at least this much of a child's time (its dispatch)
# Jobs queued behind one that has run this many times its queue's usual
# time, and at least TAKE_BACK_AFTER_S, are taken back for another child.
PATIENCE_JOBS = 2.0
TAKE_BACK_AFTER_S = 0.1

Urgency = Callable[[ClaimedJob], int]   # a job's effective priority now (lower runs first)
C = TypeVar("C")


@ownership.owned
class JobTimes:
    """The usual wall time of a queue's jobs, a moving average fed by the
    outcomes. `of(queue)` is None until a job of the queue has run: the one
    definition of "not measured yet", which every decision below reads."""

    def __init__(self) -> None:
        self.by_queue: Dict[str, float] = {}
        self.overall: Optional[float] = None   # over all queues: prices a queue not measured yet

    def record(self, queue: str, seconds: float) -> None:
        previous = self.by_queue.get(queue)
        self.by_queue[queue] = seconds if previous is None else previous + EWMA_ALPHA * (seconds - previous)
        overall = self.overall
        self.overall = seconds if overall is None else overall + EWMA_ALPHA * (seconds - overall)

    def of(self, queue: str) -> Optional[float]:
        return self.by_queue.get(queue)

    def batched(self, queue: str) -> bool:
        """Do the queue's jobs come in batches with the next one queued early?"""
        seconds = self.of(queue)
        return seconds is not None and seconds < PREFETCH_BELOW_S

    def depth(self, queue: str, max_batch: int) -> int:
        """Jobs per child per claim: about TARGET_BATCH_S of work and at
        least two for batched jobs (a batch of one costs a claim, a
        completion and two wake-ups per job); one for the others."""
        seconds = self.of(queue)
        if not self.batched(queue) or seconds is None:
            return 1
        return max(1, min(max_batch, max(2, int(TARGET_BATCH_S / max(seconds, 1e-6)))))

    def patience(self, queue: str) -> float:
        """How long a job of the queue may run before the jobs queued behind
        it go to another child: a multiple of its usual time, so a queue of
        0.1-0.25 s jobs, which also get a next one queued, does not take
        back half of them."""
        return max(TAKE_BACK_AFTER_S, PATIENCE_JOBS * (self.of(queue) or 0.0))

    def turn_seconds(self, queue: str, depth: int) -> float:
        """What a child's turn at this queue costs in its weighted turns: the
        child time of one batch (a queue not measured yet is priced at the
        pool's usual job time)."""
        seconds = self.of(queue)
        if seconds is None:
            seconds = self.overall if self.overall is not None else TARGET_BATCH_S
        return depth * max(seconds, TURN_JOB_FLOOR_S)


def spread(n: int, caps: Sequence[int]) -> List[int]:
    """How many of n claimed jobs each child takes: as evenly as their caps
    allow, every job placed while the caps have room (a child near its
    recycling takes fewer, and the others take what it leaves)."""
    takes = [0] * len(caps)
    left = n
    order = sorted(range(len(caps)), key=lambda i: caps[i])  # the smallest caps first
    for rank, index in enumerate(order):
        takes[index] = min(caps[index], -(-left // (len(caps) - rank)))
        left -= takes[index]
    return takes


def batches(jobs: Sequence[ClaimedJob], kids: Sequence[C], caps: Sequence[int]) -> List[Tuple[C, List[ClaimedJob]]]:
    """A claim's jobs, in claim order, shared among the children it was for."""
    moves, offset = [], 0
    for child, take in zip(kids, spread(len(jobs), caps)):
        if take:
            moves.append((child, list(jobs[offset:offset + take])))
            offset += take
    return moves


def refills(wanting: Mapping[str, List[C]], times: JobTimes, with_work: Set[str], blocked: Set[str],
            busy: Mapping[str, int], share: Mapping[str, float]) -> List[Tuple[str, List[C]]]:
    """The children half-way through a batch (LOW) that get their next
    batch now, by queue: the queue may have work, is not backed off, its
    jobs are batched, and it holds no more children than its share (over
    it, they free up for other queues instead)."""
    return [(name, kids) for name, kids in wanting.items()
            if name in with_work and name not in blocked and times.batched(name)
            and busy.get(name, 0) <= share.get(name, 0)]


def rush_targets(idle: Sequence[C], room: int, serving: Sequence[C], batched: bool,
                 wants_refill: Callable[[C], bool], holds_less_urgent: Callable[[C], bool]) -> List[C]:
    """Who gets one of a queue's new priority-1 jobs at once: idle children
    (the queue's max allowing), then those holding less urgent jobs of the
    queue queued (the urgent one goes ahead of them) and, for batched jobs,
    those asking for their next batch. Not a child running a long job with
    nothing queued: the urgent job waits for the first child to free up."""
    return list(idle[:room]) + [child for child in serving
                                if (batched and wants_refill(child)) or holds_less_urgent(child)]


def goes_ahead(than: int, queued: Sequence[Optional[ClaimedJob]], lowest_priority: int,
               urgency: Urgency) -> bool:
    """Does a job of effective priority `than` go ahead of the jobs a child
    holds queued (not started)? When it is more urgent than one of them, and
    every one of them was kept to be sent again (None: too big to keep)."""
    if not queued or than >= lowest_priority:
        return False   # nothing queued, or nothing less urgent (aging only makes jobs more urgent)
    return all(job is not None for job in queued) and than < max(urgency(job) for job in queued)


def overtakes(queued: Sequence[Optional[ClaimedJob]], lowest_priority: int, incoming: Sequence[ClaimedJob],
              urgency: Urgency) -> bool:
    """Does a batch arriving for a child go ahead of the jobs it holds
    queued? When its most urgent job (claims come most urgent first) does."""
    return bool(incoming) and goes_ahead(urgency(incoming[0]), queued, lowest_priority, urgency)


def merged(held: Sequence[ClaimedJob], incoming: Sequence[ClaimedJob], urgency: Urgency) -> List[ClaimedJob]:
    """Jobs taken back and a new batch, as they are sent again: most urgent
    first, the held ones first among equals (the sort is stable)."""
    return sorted(list(held) + list(incoming), key=urgency)
