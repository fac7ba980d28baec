"""Handing out work: which queues the idle children serve, claiming one
batch per queue plan in one round trip, spreading it over the children, and
queueing a next batch behind children that run short jobs so they never wait
for a claim. The supervisor owns the loop and the connection; this owns the
per-queue state the claims depend on (work flags, back-offs, job times,
shards, the lease counter).
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Set, Tuple

from . import dispatcher, fetcher
from .children import ChildHandle, Children
from ..core.config import PoolConfig, QueueConfig
from .protocol import ClaimedJob, Outcome

TARGET_BATCH_S = 0.004       # a child's batch of short jobs should take about this long
LEASE_COUNTER_BITS = 40       # leases: supervisor id above, claim counter below
PREFETCH_BELOW_S = 0.25      # queue a child's next batch early only for jobs shorter than this
# A job queued behind one that has run this many times its queue's usual
# time (at least Children's 0.1 s) is taken back for another child.
PATIENCE_JOBS = 2.0
EWMA_ALPHA = 0.2
TURN_JOB_FLOOR_S = 0.0001    # a job costs a turn at least this much of a child's time (its dispatch)
LOOK_FROM_START_EVERY_S = 0.5  # a backlog's claims use a cursor; one claim this often does not
RUSH_EVERY_S = 0.005         # at most one early claim of urgent jobs per queue this often
SHARED_REFILL_FROM_S = 0.01  # jobs this long: a refill claim also tops up the queue's other children
# A rush claim's cursor: priority 1 from the start, the other levels past
# their end (it claims nothing else: a job another supervisor took first
# leaves it empty-handed, not holding a backlog job it has no use for).
URGENT_ONLY: fetcher.Cursor = {level: (float("inf"), 0) for level in (2, 3, 4)}
PAST_END = (float("inf"), 0)   # a cursor level no claim finds anything past

# The supervisor's "run fn(cursor), or log and return None" (Supervisor._db).
Db = Callable[[str, Callable[[Any], Any]], Any]


class Completions(Protocol):
    """Successes waiting to be written, lent to a claim (BackgroundCompleter)."""

    def lend(self) -> List[Outcome]: ...

    def repay(self, written: bool) -> None: ...


def spread(n: int, caps: List[int]) -> List[int]:
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


class Claimer:
    def __init__(self, config: PoolConfig, children: Children, db: Db,
                 connected: Callable[[], bool], on_claimed: Callable[[str, List[ClaimedJob]], None],
                 held_back: Callable[[], bool] = lambda: False,
                 completions: Optional[Completions] = None,
                 lane_up: Callable[[], bool] = lambda: False) -> None:
        self.config = config
        self.children = children
        self.db = db
        self.connected = connected
        self.on_claimed = on_claimed
        self.held_back = held_back   # true while outcomes wait to be written: claim nothing
        self.completions = completions  # successes a claim writes on its way (BackgroundCompleter)
        self.lane_up = lane_up       # the urgent lane listens: new priority-1 jobs are its to claim
        self.supervisor_id = 0
        self.queues: Dict[str, QueueConfig] = {}
        self.blocked_until: Dict[str, float] = {}
        self.job_seconds: Dict[str, float] = {}
        self.any_job_seconds: Optional[float] = None   # over all queues: prices unmeasured ones
        self.shards: Dict[str, int] = {}
        # weighted turns across plans, priced in child time; it also holds the work flags
        self.stride = dispatcher.Stride(cost=self._turn_seconds)
        self.lane_cursor = random.randrange(1 << 16)
        # Per (queue, lane) in a backlog: where the last claims ended, per
        # priority level, and when a claim last looked from the start.
        self.cursors: Dict[Tuple[str, int], fetcher.Cursor] = {}
        self.looked_from_start: Dict[Tuple[str, int], float] = {}
        # Queues with new priority-1 jobs (awa_urgent) not yet claimed early.
        self.rushing: Set[str] = set()
        self.rushed_at: Dict[str, float] = {}
        # Queues where priority-1 jobs may wait that no rush claim will take
        # (see _skips_urgent): the backlog claims look at level 1 again.
        self.urgent_left: Set[str] = set()
        self.claims = 0          # claim statements sent (the lease counter)
        self.empty_claims = 0    # ... that found nothing
        self.handovers = 0       # queued jobs an idle child took over from a busy one (_hand_over)
        self.claimed_jobs = 0

    def start(self, queues: Dict[str, QueueConfig], supervisor_id: int) -> None:
        self.queues = queues
        self.supervisor_id = supervisor_id
        self.stride.configure(queues)
        self.look()

    def wake(self, names: Optional[Iterable[str]] = None) -> None:
        """Mark queues as possibly having work (all of them by default)."""
        self.stride.want(self.queues if names is None else names)

    def rush(self, names: Iterable[str]) -> None:
        """These queues got priority-1 jobs: claim them at once for children
        that hold less urgent jobs of the queue queued, which they overtake
        (instead of at those children's next refill, up to a batch later)."""
        self.rushing.update(name for name in names if name in self.queues)

    def no_work(self, name: str) -> None:
        """This queue has nothing to claim (it is paused, or a claim came back short)."""
        self.stride.drop(name)

    @property
    def with_work(self) -> Set[str]:
        """The queues marked as possibly having work."""
        return self.stride.demand

    def look(self) -> None:
        """Mark the queues the database says have jobs available: one query
        for all of them, where waking them all would cost a claim each that
        finds nothing (the poll behind LISTEN; 1,000 empty queues cost an
        idle supervisor a fifth of a core that way). All of them when the
        query fails."""
        names = self.db("looking for work", lambda cur: fetcher.queues_with_work(cur, list(self.queues)))
        self.wake(names)

    def record_job_time(self, queue: str, seconds: float) -> None:
        """Fold a job's wall time into the queue's moving average (it sizes
        batches and prices turns) and into the pool's."""
        previous = self.job_seconds.get(queue)
        self.job_seconds[queue] = seconds if previous is None else (
            previous + EWMA_ALPHA * (seconds - previous))
        overall = self.any_job_seconds
        self.any_job_seconds = seconds if overall is None else overall + EWMA_ALPHA * (seconds - overall)

    def _turn_seconds(self, queue: str) -> float:
        """What a child's turn at this queue costs in its weighted turns: the
        child time of one batch (a queue not measured yet is priced at the
        pool's average job time; its batch is one job)."""
        seconds = self.job_seconds.get(queue, self.any_job_seconds)
        if seconds is None:
            seconds = TARGET_BATCH_S
        return self._depth(queue) * max(seconds, TURN_JOB_FLOOR_S)

    def _depth(self, queue: str) -> int:
        """Jobs per child per claim: about TARGET_BATCH_S of work, and at
        least two of jobs short enough to queue ahead (a batch of one costs
        a claim, a completion and two wake-ups per job; at most two such
        jobs wait behind a running one)."""
        seconds = self.job_seconds.get(queue)
        if seconds is None:
            return 1
        depth = int(TARGET_BATCH_S / max(seconds, 1e-6))
        if seconds < PREFETCH_BELOW_S:
            depth = max(2, depth)
        return max(1, min(self.config.max_batch_per_child, depth))

    def _next_lease(self) -> int:
        """A lease no other claim ever gets: this supervisor's id (from a
        sequence, committed durably at registration) and a claim counter."""
        self.claims += 1
        return (self.supervisor_id << LEASE_COUNTER_BITS) | self.claims

    def _lane(self, queue: str) -> int:
        shards = self.shards.get(queue, 1)
        if shards <= 1:
            return 0
        self.lane_cursor += 1
        return self.lane_cursor % shards

    def hand_out(self) -> None:
        """Hand idle children to queues with work: plan, claim, assign. Plans
        again at once while a round leaves children idle and some queue may
        still have work (an empty claim clears that queue's flag). Then queue
        a next batch behind children half-way through a batch of short jobs,
        so they never wait for a claim between batches."""
        for _ in range(len(self.queues) + 1):
            idle = self.children.idle()
            if not idle or not self.connected() or self.held_back():
                break
            now = time.monotonic()
            plan = dispatcher.plan(len(idle), self.config.workers, self.queues, self.children.busy_by_queue(),
                                   None, self._blocked(now), self.stride)
            if not plan:
                break
            assigned = 0
            free = iter(idle)
            for name, count in plan.items():
                got = self._fill(name, [next(free) for _ in range(count)], now)
                if got is None:
                    return
                assigned += got
            if assigned == len(idle):
                break
        self._hand_over()
        if self.connected() and not self.held_back():
            if self.rushing:
                self._rush(time.monotonic())
            self._refill(time.monotonic())

    def _hand_over(self) -> None:
        """Children the claims left idle (nothing to claim, or the queues
        back off) take over jobs queued unstarted behind running ones: at the
        end of a backlog, or when one child's jobs ran longer than the
        other's, they start now instead of after the job ahead of them.
        Half of the fullest child's queued jobs each time (rounded up), as
        the queue's max allows; same leases, no database round trip. Only
        for jobs of SHARED_REFILL_FROM_S and more (or not timed yet): short
        ones queued behind a running one start within milliseconds anyway."""
        for child in self.children.idle():
            donor, queued = self.children.fullest(
                lambda name: self.job_seconds.get(name, SHARED_REFILL_FROM_S) >= SHARED_REFILL_FROM_S)
            if donor is None or self._room(donor.inflight[-1].queue) <= 0:
                return
            name = donor.inflight[-1].queue
            jobs = self.children.withdraw(donor, -(-queued // 2))
            if jobs:
                self.children.assign(child, name, jobs, patience=self._patience(name))
                self.handovers += len(jobs)

    def rush_now(self, names: Iterable[str], db: Db) -> int:
        """The urgent lane's claim (UrgentLane, under the state lock): the
        new priority-1 jobs of these queues, through the lane's session
        `db`, at once; returns how many children got one."""
        self.rush(names)
        if not self.connected() or self.held_back():
            return 0   # rushing stays marked: the loop's next hand-out tries
        return self._rush(time.monotonic(), db)

    def _rush(self, now: float, db: Optional[Db] = None) -> int:
        """Claim one job for each idle child, and each child holding queued
        jobs less urgent than a new priority-1 job of its queue or asking
        for a refill; the claim takes priority-1 jobs only, and assign()
        lets them overtake. At most one such claim per
        queue every RUSH_EVERY_S: one that arrives sooner is claimed by the
        next refill, as without this. Returns how many children got one."""
        rushing, self.rushing = self.rushing, set()
        blocked = self._blocked(now)
        handed = 0
        for name in rushing:
            self.urgent_left.add(name)   # until a rush claim comes back short
            if name in blocked or now - self.rushed_at.get(name, -RUSH_EVERY_S) < RUSH_EVERY_S:
                continue
            urgency = self._urgency(name)
            # Idle children first (the queue's max allowing), then those
            # holding less urgent jobs queued, and those asking for a next
            # batch of short jobs (the urgent one runs after the job running
            # now). Not one running a long job with nothing queued: the
            # urgent job waits for the first child to free up instead.
            short = self.job_seconds.get(name, 1.0) < PREFETCH_BELOW_S   # as _refill judges it
            kids = self.children.idle()[:self._room(name)] + [
                child for child in self.children.serving(name)
                if (short and child.refill_wanted) or child.holds_less_urgent(1, urgency)]
            if not kids:
                continue
            self.rushed_at[name] = now
            jobs = self._claim_statement(name, self._lane(name), len(kids), URGENT_ONLY, rush=True, db=db)
            if jobs is None:
                return handed
            if len(jobs) < len(kids):
                self.urgent_left.discard(name)   # it took every priority-1 job there was
            self._count_claimed(name, jobs)
            for child, job in zip(kids, jobs):
                self.children.assign(child, name, [job], urgency, self._patience(name))
                handed += 1
        return handed

    def _room(self, name: str) -> int:
        """How many more children the queue may have (its max)."""
        cap = self.queues[name].max
        return self.config.workers if cap is None else max(0, cap - self.children.busy_by_queue().get(name, 0))

    def _refill(self, now: float) -> None:
        wanting = self.children.wanting_refill()
        if not wanting:
            return
        blocked = self._blocked(now)
        busy = self.children.busy_by_queue()
        share = self.stride.shares(self.config.workers, busy, blocked)
        for name, kids in wanting.items():
            if (name not in self.stride.demand or name in blocked
                    or self.job_seconds.get(name, 1.0) >= PREFETCH_BELOW_S):
                continue  # nothing to take, or jobs too long to queue ahead
            if busy.get(name, 0) > share.get(name, 0):
                continue  # over its share: let these children free up for other queues
            extra: List[Tuple[ChildHandle, int]] = []
            if self.job_seconds.get(name, 0.0) >= SHARED_REFILL_FROM_S:
                kids, extra = self._shared_refill(name, kids)
                if not kids:
                    continue
            if self._fill(name, kids, now, extra=extra) is None:
                return

    def _shared_refill(self, name: str, kids: List[ChildHandle]) -> Tuple[List[ChildHandle],
                                                                          List[Tuple[ChildHandle, int]]]:
        """Jobs long enough that a claim (~1.5 ms of server and supervisor
        CPU with its completions) is worth saving: one refill serves every
        child of the queue. Children that asked, each still holding as many
        unstarted jobs as a batch's LOW leaves (none, for batches of two),
        get a batch; the queue's other children get what tops them up to a
        batch of unstarted jobs, as their own batch, whose LOW asks again.
        A child that asked while holding more (such a top-up) waits for
        that LOW. Claims per job: a third instead of a half for two
        children, and no child holds more unstarted jobs than before."""
        depth = self._depth(name)
        at_low = depth - 1 - depth // 2
        need = [child for child in kids if self.children.unstarted(child) <= at_low]
        if not need:
            return [], []
        extra = []
        for child in self.children.serving(name):
            if child not in need and self.children.refillable(child):
                room = depth - self.children.unstarted(child)
                if room > 0:
                    extra.append((child, room))
        return need, extra

    def _fill(self, name: str, kids: List[ChildHandle], now: float,
              extra: Sequence[Tuple[ChildHandle, int]] = ()) -> Optional[int]:
        """Claim one batch of the queue's depth for each of these children
        in one round trip and send it, then up to `extra`'s counts for its
        children from what is left; returns how many got work (None: the
        database was lost)."""
        depth = self._depth(name)
        # a child due for recycling takes no more jobs than it has left
        caps = [max(1, min(depth, child.tasks_left)) for child in kids]
        extra = [(child, min(room, child.tasks_left)) for child, room in extra]
        jobs = self._claim(name, sum(caps) + sum(room for _, room in extra), now)
        if jobs is None:
            return None
        offset = given = 0
        urgency = self._urgency(name)
        takes = spread(min(len(jobs), sum(caps)), caps)  # those that asked first
        left = len(jobs) - sum(takes)
        for child, room in extra:
            kids, takes = kids + [child], takes + [min(room, left)]
            left -= takes[-1]
        for child, take in zip(kids, takes):
            if take:
                self.children.assign(child, name, jobs[offset:offset + take], urgency, self._patience(name))
                offset += take
                given += 1
        return given

    def _patience(self, name: str) -> float:
        """How long a job of the queue may run before the jobs queued behind
        it go to another child: a multiple of its usual time, so a queue of
        0.1-0.25 s jobs, which also get a next one queued, does not take
        back half of them."""
        return PATIENCE_JOBS * self.job_seconds.get(name, 0.0)

    def _urgency(self, name: str) -> Callable[[ClaimedJob], int]:
        """A job's effective priority now, as the claim ranks it (priority
        aging included): children run the lower first (Children.assign)."""
        aging = self.queues[name].aging
        if not aging or aging <= 0:
            return lambda job: job.priority
        wall = time.time()
        return lambda job: max(1, job.priority - int((wall - job.run_at) // aging))

    def _blocked(self, now: float) -> Set[str]:
        """The queues backed off now (expired back-offs are forgotten)."""
        if any(until <= now for until in self.blocked_until.values()):
            self.blocked_until = {name: until for name, until in self.blocked_until.items() if until > now}
        return set(self.blocked_until)

    def _claim(self, name: str, want: int, now: float) -> Optional[List[ClaimedJob]]:
        """Claim up to `want` jobs of a queue (trying lanes of a sharded
        queue); None when the database connection was lost."""
        rows: List[ClaimedJob] = []
        for _ in range(self.shards.get(name, 1)):
            got = self._claim_lane(name, self._lane(name), want - len(rows), now)
            if got is None:
                if not self.connected():
                    return None
                self.blocked_until[name] = now + 1.0  # a failing claim: back off this queue
                return rows
            rows.extend(got)
            self._count_claimed(name, got)
            if len(rows) >= want:
                return rows
        if self.queues[name].rate is not None:
            self.blocked_until[name] = now + min(1.0, max(0.01, 1.0 / self.queues[name].rate))
        else:
            self.stride.drop(name)
        return rows

    def _count_claimed(self, name: str, jobs: List[ClaimedJob]) -> None:
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
        skip_urgent = cursor is not None and self._skips_urgent(name)
        got = self._claim_statement(name, lane, want, {**cursor, 1: PAST_END} if skip_urgent else cursor)
        looked = None if skip_urgent else (got, want)   # a claim that looked at level 1, and its limit
        if got is not None and cursor is not None and len(got) < want:
            more = self._claim_statement(name, lane, want - len(got), None)
            looked = (more, want - len(got))
            got, cursor = got + (more or []), None
        if got is None:
            return None
        if name in self.urgent_left and looked is not None and looked[0] is not None and sum(
                1 for job in looked[0] if job.priority == 1) < looked[1]:
            self.urgent_left.discard(name)   # it took every priority-1 job past its cursor
        if cursor is None:
            self.looked_from_start[key] = now
        if len(got) < want:
            self.cursors.pop(key, None)   # no backlog: every claim looks from the start
        else:
            self.cursors[key] = fetcher.advance(cursor, got)
        return got

    def _skips_urgent(self, name: str) -> bool:
        """Does a backlog claim leave priority-1 jobs to the urgent lane? A
        claim of a full batch takes milliseconds under a deep backlog, and a
        new priority-1 job it takes waits for all of it; the lane claims
        each alone the moment it is committed. It does while the lane
        listens and no rush left such jobs behind (urgent_left: no child
        to give one to, a rush too soon after the last, one that came back
        full). A job that becomes available at priority 1 without a notice
        (released, rescued) is found by the claim from the start that
        every backlog makes each LOOK_FROM_START_EVERY_S."""
        return name not in self.urgent_left and self.lane_up()

    def _claim_statement(self, name: str, lane: int, want: int, cursor: Optional[fetcher.Cursor],
                         rush: bool = False, db: Optional[Db] = None) -> Optional[List[ClaimedJob]]:
        """One claim statement, on the main session unless `db` says. It
        first writes the successes waiting in the completer, in the same
        round trip and transaction; a rush claim carries none (its urgent
        job must not wait for them)."""
        queue = self.queues[name]
        riding = self.completions.lend() if not rush and self.completions is not None else []
        lease = self._next_lease()   # here, under the state lock: never while the statement runs
        got = (db or self.db)(f"claiming from {name}", lambda cur: fetcher.claim(
            cur, queue=name, limit=want, supervisor_id=self.supervisor_id, aging_s=queue.aging,
            lane=lane, lease=lease, after=cursor, completing=riding))
        if riding:
            self.completions.repay(written=got is not None)
        return got
