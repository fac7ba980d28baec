"""Claiming: the per-queue state claims depend on (work flags, kept with
the weighted turns in a dispatcher.Stride; back-offs; cursors past a
backlog's claimed jobs; shards; the lease counter) and the claim
statements themselves. What the claimed jobs then do is the hand-out's
(handout.py) and placement's business.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Set, Tuple

from . import dispatcher, fetcher, ownership
from ..core.config import PoolConfig, QueueConfig
from .placement import JobTimes
from .registration import QueueSettings
from .protocol import ClaimedJob, Outcome

LEASE_COUNTER_BITS = 40       # leases: supervisor id above, claim counter below
LOOK_FROM_START_EVERY_S = 0.5  # a backlog's claims use a cursor; one claim this often does not
RUSH_EVERY_S = 0.005         # at most one early claim of urgent jobs per queue this often
FAILED_CLAIM_BACKOFF_S = 1.0
# A queue with a global_max that came back short may be at its limit, not
# empty: look again this soon (a slot another supervisor frees sends no NOTIFY).
LIMITED_RETRY_S = 0.1
# A rush claim's cursor: priority 1 from the start, the other levels past
# their end (it claims nothing else: a job another supervisor took first
# leaves it empty-handed, not holding a backlog job it has no use for).
URGENT_ONLY: fetcher.Cursor = {level: (float("inf"), 0) for level in (2, 3, 4)}

# The supervisor's "run fn(cursor), or log and return None" (Supervisor.db).
Db = Callable[[str, Callable[[Any], Any]], Any]


class Completions(Protocol):
    """Successes waiting to be written, lent to a claim (BackgroundCompleter)."""

    def lend(self) -> List[Outcome]: ...

    def repay(self, written: bool) -> None: ...


@ownership.owned
class Claimer:
    def __init__(self, config: PoolConfig, times: JobTimes, db: Db,
                 on_claimed: Callable[[str, List[ClaimedJob]], None],
                 completions: Optional[Completions] = None) -> None:
        self.config = config
        self.times = times
        self.db = db
        self.on_claimed = on_claimed
        self.completions = completions  # successes a claim writes on its way (BackgroundCompleter)
        self.supervisor_id = 0
        self.queues: Dict[str, QueueConfig] = {}
        self.blocked_until: Dict[str, float] = {}
        self.shards: Dict[str, int] = {}
        self.rates: Dict[str, Optional[float]] = {}   # the fleet's, from awa.queues
        self.limited: Set[str] = set()                 # queues with a global_max
        # weighted turns across plans, priced in child time; it also holds the work flags
        self.stride = dispatcher.Stride(cost=self.turn_seconds)
        self.lane_cursor = random.randrange(1 << 16)
        # Per (queue, lane) in a backlog: where the last claims ended, per
        # priority level, and when a claim last looked from the start.
        self.cursors: Dict[Tuple[str, int], fetcher.Cursor] = {}
        self.looked_from_start: Dict[Tuple[str, int], float] = {}
        self.rushing: Set[str] = set()          # queues with new priority-1 jobs not yet claimed early
        self.rushed_at: Dict[str, float] = {}
        self.claims = 0          # claim statements sent (the lease counter)
        self.empty_claims = 0    # ... that found nothing
        self.claimed_jobs = 0
        self.rushes = 0          # early claims of new priority-1 jobs that found one

    def start(self, queues: Dict[str, QueueConfig], supervisor_id: int) -> None:
        self.queues = queues
        self.supervisor_id = supervisor_id
        self.stride.configure(queues)
        self.look()

    # -- which queues may have work ------------------------------------------------
    def wake(self, names: Optional[Iterable[str]] = None) -> None:
        """Mark queues as possibly having work (all of them by default)."""
        self.stride.want(self.queues if names is None else names)

    def rush(self, names: Iterable[str]) -> None:
        """These queues got priority-1 jobs (awa_urgent): the next hand-out
        claims them at once for the children placement names."""
        self.rushing.update(name for name in names if name in self.queues)

    def apply_settings(self, settings: Dict[str, QueueSettings]) -> None:
        """The fleet's queue settings, read at start and every few seconds."""
        for name, queue in settings.items():
            self.shards[name] = queue.shards
            self.rates[name] = queue.rate
            if queue.global_max is None:
                self.limited.discard(name)
            else:
                self.limited.add(name)
            if queue.paused:
                self.no_work(name)

    def no_work(self, name: str) -> None:
        """This queue has nothing to claim (it is paused, or a claim came back short)."""
        self.stride.drop(name)

    @property
    def with_work(self) -> Set[str]:
        return self.stride.demand

    def look(self) -> None:
        """Mark the queues the database says have jobs available: one query
        for all of them, where waking them all would cost a claim each that
        finds nothing (the poll behind LISTEN). All of them when it fails."""
        names = self.db("looking for work", lambda cur: fetcher.queues_with_work(cur, list(self.queues)))
        self.wake(names)

    def blocked(self, now: float) -> Set[str]:
        """The queues backed off now (expired back-offs are forgotten)."""
        if any(until <= now for until in self.blocked_until.values()):
            self.blocked_until = {name: until for name, until in self.blocked_until.items() if until > now}
        return set(self.blocked_until)

    def take_rushing(self, now: float) -> List[str]:
        """The queues to rush now: at most one early claim per queue every
        RUSH_EVERY_S (one sooner waits for the next refill, as without it)."""
        rushing, self.rushing = self.rushing, set()
        blocked = self.blocked(now)
        due = [name for name in rushing
               if name not in blocked and now - self.rushed_at.get(name, -RUSH_EVERY_S) >= RUSH_EVERY_S]
        for name in due:
            self.rushed_at[name] = now
        return due

    # -- prices ------------------------------------------------------------------
    def depth(self, name: str) -> int:
        return self.times.depth(name, self.config.max_batch_per_child)

    def turn_seconds(self, name: str) -> float:
        return self.times.turn_seconds(name, self.depth(name))

    def urgency(self, name: str, wall: float) -> Callable[[ClaimedJob], int]:
        """A job's effective priority at `wall` (epoch seconds), as the claim
        ranks it (priority aging included): children run the lower first."""
        aging = self.queues[name].aging
        if not aging or aging <= 0:
            return lambda job: job.priority
        return lambda job: max(1, job.priority - int((wall - job.run_at) // aging))

    # -- claims --------------------------------------------------------------------
    def claim(self, name: str, want: int, now: float) -> Optional[List[ClaimedJob]]:
        """Claim up to `want` jobs of a queue (trying the lanes of a sharded
        queue); None when the database connection was lost. A claim that
        comes back short drops the queue's work flag (a rate-limited queue
        backs off until its next token instead, a queue with a global_max
        for LIMITED_RETRY_S)."""
        rows: List[ClaimedJob] = []
        for _ in range(self.shards.get(name, 1)):
            got = self._claim_lane(name, self._lane(name), want - len(rows), now)
            if got is None:
                self.blocked_until[name] = now + FAILED_CLAIM_BACKOFF_S
                return None if not rows else rows
            rows.extend(got)
            self._count(name, got)
            if len(rows) >= want:
                return rows
        rate = self.rates.get(name)
        waits = [min(1.0, max(0.01, 1.0 / rate))] if rate is not None else []
        if name in self.limited:
            waits.append(LIMITED_RETRY_S)
        if waits:   # held back by a limit, maybe: keep the work flag, look again soon
            self.blocked_until[name] = now + min(waits)
        else:
            self.stride.drop(name)
        return rows

    def claim_urgent(self, name: str, want: int) -> Optional[List[ClaimedJob]]:
        """Claim up to `want` priority-1 jobs of a queue and nothing else,
        carrying no completions (the urgent job must not wait for them)."""
        jobs = self._statement(name, self._lane(name), want, URGENT_ONLY, rush=True)
        if jobs is not None:
            self._count(name, jobs)
            self.rushes += bool(jobs)
        return jobs

    def _lane(self, queue: str) -> int:
        shards = self.shards.get(queue, 1)
        if shards <= 1:
            return 0
        self.lane_cursor += 1
        return self.lane_cursor % shards

    def _count(self, name: str, jobs: List[ClaimedJob]) -> None:
        self.claimed_jobs += len(jobs)
        if jobs:
            self.on_claimed(name, jobs)
        else:
            self.empty_claims += 1

    def _claim_lane(self, name: str, lane: int, want: int, now: float) -> Optional[List[ClaimedJob]]:
        """Claim up to `want` jobs of one lane. While its claims come back
        full (a backlog), each scans from past the last one's jobs (claimed
        jobs stay in the claim index until VACUUM, and a scan from the start
        steps over every one of them). Jobs that become available behind
        the cursor (released, rescued, promoted, or enqueued with a past
        run_at) are found by a claim from the start: one every
        LOOK_FROM_START_EVERY_S, and one at once when a claim past the
        cursor comes back short."""
        key = (name, lane)
        cursor = self.cursors.get(key)
        if cursor is not None and now - self.looked_from_start.get(key, 0.0) >= LOOK_FROM_START_EVERY_S:
            cursor = None
        got = self._statement(name, lane, want, cursor)
        if got is not None and cursor is not None and len(got) < want:
            more = self._statement(name, lane, want - len(got), None)
            got, cursor = got + (more or []), None   # never drop rows claimed already
        if got is None:
            return None
        if cursor is None:
            self.looked_from_start[key] = now
        if len(got) < want:
            self.cursors.pop(key, None)   # no backlog: every claim looks from the start
        else:
            self.cursors[key] = fetcher.advance(cursor, got)
        return got

    def _next_lease(self) -> int:
        """A lease no other claim ever gets: this supervisor's id (from a
        sequence, committed durably at registration) and a claim counter."""
        self.claims += 1
        return (self.supervisor_id << LEASE_COUNTER_BITS) | self.claims

    def _statement(self, name: str, lane: int, want: int, cursor: Optional[fetcher.Cursor],
                   rush: bool = False) -> Optional[List[ClaimedJob]]:
        """One claim statement. It first writes the successes waiting in the
        completer, in the same round trip and transaction (completions.lend);
        a rush claim carries none."""
        queue = self.queues[name]
        riding = self.completions.lend() if not rush and self.completions is not None else []
        lease = self._next_lease()
        got = self.db(f"claiming from {name}", lambda cur: fetcher.claim(
            cur, queue=name, limit=want, supervisor_id=self.supervisor_id, aging_s=queue.aging,
            lane=lane, lease=lease, after=cursor, completing=riding))
        if riding:
            self.completions.repay(written=got is not None)
        return got
