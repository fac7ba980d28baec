"""Leader-only maintenance services. Each has its own interval, works in
bounded batches and exposes `tick(cur)`, so tests can drive one service
step by step without a running supervisor.

Services: promote due jobs, rescue jobs of dead supervisors (at once, by
their liveness lock), of lost ones (by heartbeat) and past their
deadlines, expire callbacks, forget old supervisors, fire periodic jobs,
retention (rotate terminal history, clean bookkeeping rows), vacuuming
the claim path's tables and the census of live jobs the operator reads use.
"""
from __future__ import annotations

import logging
import math
import time
from datetime import datetime
from typing import Any, Dict, List, Optional, Sequence, Tuple

import psycopg2

from ..core.config import DEFAULT_DEADLINE_GRACE_S, DEFAULT_RETENTION_COMPLETED_S, DEFAULT_RETENTION_FAILED_S
from ..core.db import first_line, is_connection_error
from .liveness import DeadSupervisors
from ..core.periodic import CATCH_UP_CAP, due_fire_times, next_fire_time
from ..core.sql import QUERIES

log = logging.getLogger(__name__)

BATCH = 1000
MAX_BATCHES_PER_TICK = 20
# Promotion moves rows in bigger statements (a call's fixed cost is spread
# over more jobs) and keeps going while full batches come back, for at most
# PROMOTE_BUDGET_S per tick; then the other services get their turn and it
# runs again at once (Service.more). 1M jobs due at once went from about
# 11,000 promoted per second (20 batches of 1,000 every 0.25 s) to the
# statement's own speed (issue 23, docs/benchmarks.md "How cost grows").
PROMOTE_BATCH = 5000
PROMOTE_BUDGET_S = 1.0
DLQ_RETENTION_S = 30 * 86400.0        # dead letters stay a month (or retention_failed if longer)
CRON_FIRES_KEEP_S = 2 * 86400.0       # fired-tick records guard against double fires this long
ROTATE_LOCK_TIMEOUT = "200ms"         # how long a TRUNCATE may queue ahead of readers

PASS_GRID_S = 0.25   # every service is due on a step of this grid (the shortest interval)


class Service:
    """One maintenance duty. Subclasses set `name` and `interval` and
    implement `tick(cur) -> int` (how many rows it handled)."""

    name = "service"
    interval = 1.0
    more = False   # set by a tick that stopped with work left: run again at once

    def tick(self, cur: Any) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def observe(self, cur: Any) -> None:
        """What a follower keeps up to date, to act at once when it leads."""

    def forget(self) -> None:
        """The leader's connection is new: drop what was observed on the old one."""


class PromoteDue(Service):
    """Scheduled and retryable jobs whose time has come become available
    (and the supervisors of their queues are woken by a NOTIFY)."""

    name = "promote"
    interval = 0.25

    def __init__(self, batch: int = PROMOTE_BATCH, budget_s: float = PROMOTE_BUDGET_S) -> None:
        self.batch = batch
        self.budget_s = budget_s

    def tick(self, cur: Any) -> int:
        total = 0
        deadline = time.monotonic() + self.budget_s
        self.more = False
        while True:
            cur.execute(QUERIES["promote_due"], {"limit": self.batch})
            moved = cur.fetchone()[0]
            total += moved
            if moved < self.batch:
                return total
            if time.monotonic() >= deadline:
                self.more = True
                return total


class QuietAfterOutage:
    """A rescue that judges other supervisors by time (a heartbeat's age, a
    deadline) holds off for `quiet_s` after the leader's session came back
    from a loss: while the leader could not reach the server, neither could
    the others, and they need that long to reconnect, heartbeat and write
    the outcomes they kept (SPEC §5: a rescue never takes a live
    supervisor's jobs). Its first session is not a return."""

    quiet_s = 0.0

    def __init__(self) -> None:
        self.sessions = 0
        self.quiet_until = 0.0

    def forget(self) -> None:
        self.sessions += 1
        if self.sessions > 1:
            self.quiet_until = time.monotonic() + self.quiet_s

    def quiet(self) -> bool:
        return time.monotonic() < self.quiet_until


class RescueLost(QuietAfterOutage, Service):
    """Running jobs of supervisors that stopped heartbeating go back to the
    queue; never those of the leader's own supervisor (`spare`)."""

    name = "rescue_lost"
    interval = 1.0

    def __init__(self, stale_s: float, spare: Optional[int] = None) -> None:
        super().__init__()
        self.stale_s = self.quiet_s = stale_s
        self.spare = spare

    def tick(self, cur: Any) -> int:
        if self.quiet():
            return 0
        cur.execute(QUERIES["rescue_lost"], {"stale_s": self.stale_s, "limit": 500, "spare": self.spare})
        rows = cur.fetchall()
        for job_id, state in rows:
            log.warning("rescued job %d from a lost supervisor (now %s)", job_id, state)
        return len(rows)


class RescueDead(Service):
    """Running jobs of a supervisor whose sessions all ended (killed,
    crashed, out of memory) go back at once, without waiting for its
    heartbeat to go stale (see liveness.py)."""

    name = "rescue_dead"
    interval = 0.25

    def __init__(self, spare: Optional[int] = None) -> None:
        self.supervisors = DeadSupervisors(spare)

    def tick(self, cur: Any) -> int:
        return len(self.supervisors.rescue(cur))

    def observe(self, cur: Any) -> None:
        self.supervisors.observe(cur)

    def forget(self) -> None:
        self.supervisors.forget()


class RescueDeadlines(QuietAfterOutage, Service):
    """Backstop: attempts long past their deadline whose supervisor is alive
    but did not stop them."""

    name = "rescue_deadlines"
    interval = 5.0

    def __init__(self, grace_s: float = DEFAULT_DEADLINE_GRACE_S) -> None:
        super().__init__()
        self.grace_s = self.quiet_s = grace_s

    def tick(self, cur: Any) -> int:
        if self.quiet():
            return 0
        cur.execute(QUERIES["rescue_deadlines"], {"grace_s": self.grace_s, "limit": 500})
        rows = cur.fetchall()
        for job_id, state in rows:
            log.warning("rescued job %d past its deadline (now %s)", job_id, state)
        return len(rows)


class ExpireCallbacks(Service):
    """Jobs waiting on a callback past its timeout count a failed attempt."""

    name = "expire_callbacks"
    interval = 1.0

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["expire_callbacks"], {"limit": 500})
        rows = cur.fetchall()
        for job_id, state in rows:
            log.info("callback of job %d timed out (now %s)", job_id, state)
        return len(rows)


class ExpireJobs(Service):
    """Jobs past their expires_at that never started are cancelled with
    reason "expired" (awa.claim already skips them). `expired` counts them
    by (queue, kind) for the metrics."""

    name = "expire_jobs"
    interval = 1.0

    def __init__(self, batch: int = BATCH) -> None:
        self.batch = batch
        self.expired: Dict[Tuple[str, str], int] = {}

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["expire_jobs"], {"limit": self.batch})
        total = 0
        for queue, kind, jobs in cur.fetchall():
            self.expired[(queue, kind)] = self.expired.get((queue, kind), 0) + jobs
            total += jobs
            log.info("expired %d %s job(s) of queue %s before they started", jobs, kind, queue)
        self.more = total >= self.batch
        return total


class ForgetSupervisors(Service):
    """Drop registrations of supervisors gone for long, and of waiters
    (awa_pool.wait) whose session ended without unregistering."""

    name = "forget_supervisors"
    interval = 60.0

    def __init__(self, after_s: float = 3600.0) -> None:
        self.after_s = after_s

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["forget_supervisors"], {"after_s": self.after_s})
        forgotten = cur.rowcount
        cur.execute(QUERIES["forget_waiters"])
        return forgotten + cur.rowcount


class FireCron(Service):
    """Fire due periodic-job ticks. The ticks are computed here with croniter
    on the database clock; awa.fire_cron inserts them idempotently (CAS on
    last_fire_at plus one awa.cron_fires row per tick)."""

    name = "fire_cron"
    interval = 0.25

    def __init__(self, cap: int = CATCH_UP_CAP) -> None:
        self.cap = cap
        # name -> (what the next tick was computed from, that next tick): a
        # schedule that is not due costs no croniter work on the next pass
        self._next: Dict[str, Tuple[tuple, datetime]] = {}
        self._invalid: Dict[str, tuple] = {}

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["cron_schedules_due"])
        rows = cur.fetchall()
        fired = 0
        for name, expression, timezone, policy, last_fire_at, now in rows:
            key = (expression, timezone, policy, last_fire_at)
            cached = self._next.get(name)
            if (cached is not None and cached[0] == key and now < cached[1]) or self._invalid.get(name) == key:
                continue
            try:
                ticks = due_fire_times(expression, timezone, last_fire_at, now, policy,
                                       cap=self.cap, hash_id=name)
                if not ticks:
                    self._next[name] = (key, next_fire_time(expression, timezone, now, hash_id=name))
                    continue
            except (ValueError, KeyError) as exc:
                self._invalid[name] = key
                log.warning("periodic job %r cannot be scheduled (%s): %s", name, expression, exc)
                continue
            cur.execute(QUERIES["fire_cron"], {"name": name, "expected": last_fire_at, "fire_ats": ticks})
            jobs = cur.fetchall()
            for fire_at, job_id in jobs:
                log.debug("periodic job %r fired for %s: job %d", name, fire_at.isoformat(), job_id)
            if len(ticks) > 1:
                log.info("periodic job %r caught up %d missed tick(s)", name, len(jobs))
            fired += len(jobs)
        names = {row[0] for row in rows}
        for gone in [name for name in self._next if name not in names]:
            del self._next[gone]
        return fired


class Retention(Service):
    """Remove terminal history past its retention by rotating the
    awa.jobs_done ring (carry young rows forward, TRUNCATE the oldest
    segment: no mass DELETE, no vacuum debt), and clean bookkeeping rows in
    bounded batches: old fired-tick records, unique keys whose job is gone,
    finished batches past retention."""

    name = "retention"
    interval = 5.0

    def __init__(self, completed_s: float = DEFAULT_RETENTION_COMPLETED_S,
                 failed_s: float = DEFAULT_RETENTION_FAILED_S, dlq_s: float = DLQ_RETENTION_S,
                 cron_fires_keep_s: float = CRON_FIRES_KEEP_S, batch: int = BATCH) -> None:
        self.completed_s = float(completed_s)
        self.failed_s = float(failed_s)
        self.dlq_s = max(float(dlq_s), self.failed_s)
        self.cron_fires_keep_s = cron_fires_keep_s
        self.batch = batch
        # look often enough to rotate on time even with short retentions (tests,
        # demos): the ring's period is min(retention) / 7 with the default 8 segments
        self.interval = min(Retention.interval, max(0.5, min(self.completed_s, self.failed_s) / 14))
        self.keys_after: Optional[bytes] = None
        self.busy = 0
        self.last: Optional[Tuple[bool, bool, int, int, Optional[int]]] = None

    def tick(self, cur: Any) -> int:
        return self.rotate(cur) + self.clean(cur)

    def rotate(self, cur: Any, period_s: Optional[float] = None) -> int:
        """Turn the ring if its current segment is old enough (or period_s
        has passed); returns how many rows were dropped."""
        cur.execute(QUERIES["rotate_done_ring"], {
            "keep_completed_s": self.completed_s, "keep_failed_s": self.failed_s,
            "keep_dlq_s": self.dlq_s, "lock_timeout": ROTATE_LOCK_TIMEOUT, "period_s": period_s})
        rotated, busy, dropped, carried, segment = cur.fetchone()
        self.last = (rotated, busy, dropped, carried, segment)
        if busy:
            self.busy += 1
            log.info("retention: segment in use (lock not granted within %s); will retry",
                     ROTATE_LOCK_TIMEOUT)
        elif rotated:
            log.info("retention: dropped %d terminal job(s), carried %d forward; segment %d is current",
                     dropped, carried, segment)
        return dropped if rotated else 0

    def clean(self, cur: Any) -> int:
        total = 0
        for statement, keep_s in ((QUERIES["clean_cron_fires"], self.cron_fires_keep_s),
                                  (QUERIES["clean_batches"], max(self.completed_s, self.failed_s))):
            for _ in range(MAX_BATCHES_PER_TICK):
                cur.execute(statement, {"keep_s": keep_s, "limit": self.batch})
                total += cur.rowcount
                if cur.rowcount < self.batch:
                    break
        cur.execute(QUERIES["clean_unique_keys"], {"after": self.keys_after, "limit": self.batch})
        removed, last_key = cur.fetchone()
        self.keys_after = bytes(last_key) if last_key is not None else None
        return total + removed


class VacuumQueueTables(Service):
    """Vacuum the tables the claim path reads as soon as they carry enough
    dead tuples. Every job leaves dead tuples in awa.jobs_hot (claim, then
    completion), and autovacuum visits a table at most once per
    autovacuum_naptime (a minute by default): at thousands of jobs per
    second, claims would otherwise wade through a million dead index entries
    before finding a live one."""

    name = "vacuum_queue_tables"
    interval = 1.0
    STATEMENTS = {"jobs_hot": QUERIES["vacuum_jobs_hot"], "jobs_deferred": QUERIES["vacuum_jobs_deferred"],
                  "queues": QUERIES["vacuum_queues"]}

    def __init__(self, dead_threshold: int = 20_000) -> None:
        self.dead_threshold = dead_threshold
        self.vacuums = 0

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["queue_table_dead_tuples"], {"tables": list(self.STATEMENTS)})
        vacuumed = 0
        for table, dead in cur.fetchall():
            if dead >= self.dead_threshold:
                cur.execute(self.STATEMENTS[table])
                vacuumed += 1
        self.vacuums += vacuumed
        return vacuumed


class LiveCensus(Service):
    """Recount live jobs per queue and state (awa.live_census), which the
    operator reads use instead of counting above a big backlog. The next
    census is due after 2 s or 25 times what this one took, whichever is
    longer: at most 4 % of the leader's time however deep the backlog."""

    name = "live_census"
    interval = 2.0

    def tick(self, cur: Any) -> int:
        cur.execute(QUERIES["take_live_census"])
        self.interval = float(cur.fetchone()[0])
        return 1


class Maintenance:
    """Runs the services that are due. Not thread-safe: one runner per leader."""

    def __init__(self, services: Sequence[Service]) -> None:
        self.services: List[Service] = list(services)
        self.next_run: Dict[str, float] = {}
        self.last_error: Optional[str] = None
        # Services are due on one grid of PASS_GRID_S steps, so those due
        # together run in one pass: an idle leader's thread and backend wake
        # 4 times a second instead of once per query (each wake-up of a cold
        # core cost about as much as the query it ran).
        self.grid_start: Optional[float] = None

    def reset(self) -> None:
        """Run every service on the next pass (after becoming leader)."""
        self.next_run.clear()
        self.grid_start = None

    def _next_due(self, due: float, interval: float, now: float) -> float:
        """The first grid step at or after due + interval, and after now (a
        pass that overran skips the steps it missed instead of bunching)."""
        start = self.grid_start or 0.0   # set by run_due's first pass
        wanted = max(due + interval, now + 1e-6)
        return start + math.ceil((wanted - start) / PASS_GRID_S - 1e-9) * PASS_GRID_S

    def observe(self, cur: Any) -> None:
        """A follower's look at what the services watch (see Service.observe)."""
        for service in self.services:
            service.observe(cur)

    def forget(self) -> None:
        for service in self.services:
            service.forget()

    def run_due(self, cur: Any, now: Optional[float] = None) -> float:
        """Run due services; returns seconds until the next one is due.
        `last_error` names the services that failed in this pass (or None)."""
        now = time.monotonic() if now is None else now
        started = time.monotonic()
        clock = lambda: now + time.monotonic() - started  # noqa: E731  (`now` moved on by real time)
        if self.grid_start is None:
            self.grid_start = now
        errors: List[str] = []
        for service in self.services:
            due = self.next_run.get(service.name, now)
            if due <= now:
                try:
                    service.tick(cur)
                except psycopg2.Error as exc:
                    if is_connection_error(exc) or cur.connection.closed:
                        raise  # the leader session is gone: leadership with it
                    # one failing service (a lock or statement timeout, a bug in
                    # a schema function) must not stop the others or cost the lock
                    errors.append(f"{service.name}: {first_line(exc)}")
                    log.warning("maintenance service %s failed: %s", service.name, first_line(exc))
                after = clock()
                self.next_run[service.name] = after if service.more else self._next_due(due, service.interval, after)
        self.last_error = "; ".join(errors) or None
        return max(0.0, min(self.next_run.values(), default=now + 1.0) - clock())

    def get(self, name: str) -> Service:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)


def default_services(*, heartbeat_staleness: float, deadline_grace: float = DEFAULT_DEADLINE_GRACE_S,
                     retention_completed: float = DEFAULT_RETENTION_COMPLETED_S,
                     retention_failed: float = DEFAULT_RETENTION_FAILED_S,
                     supervisor_id: Optional[int] = None) -> List[Service]:
    """The leader's services; `supervisor_id`: the leader's own supervisor,
    which no rescue takes jobs from."""
    return [PromoteDue(), RescueDead(supervisor_id), RescueLost(heartbeat_staleness, supervisor_id),
            RescueDeadlines(deadline_grace), ExpireCallbacks(), ExpireJobs(), ForgetSupervisors(), FireCron(),
            Retention(retention_completed, retention_failed), VacuumQueueTables(), LiveCensus()]


def services_for(config: Any, supervisor_id: Optional[int]) -> List[Service]:
    """The services of a supervisor's leader thread, from its PoolConfig."""
    return default_services(heartbeat_staleness=config.heartbeat_staleness, deadline_grace=config.deadline_grace,
                            retention_completed=config.retention_completed,
                            retention_failed=config.retention_failed, supervisor_id=supervisor_id)
