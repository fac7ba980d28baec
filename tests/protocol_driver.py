"""The dispatch core as tests/test_protocol_machine.py drives it: one real
supervisor (started in this thread, which becomes its loop's thread), two
real children running apps.verdicts, a real database. The machine calls
these operations only, so the same machine can be pointed at another
version of the core by giving it another driver of the same shape."""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

from awa_pool.core.config import PoolConfig, QueueConfig
from awa_pool.core.tasks import import_app
from awa_pool.supervisor import Supervisor

SHORT_JOB_S = 0.001   # what the queue's jobs are taken to last: batches of 4, the next one queued early


class Driver:
    def __init__(self, dsn: str, queue: str) -> None:
        import_app("apps.verdicts")
        self.queue = queue
        self.sup = Supervisor(PoolConfig(dsn=dsn, workers=2, queues={queue: QueueConfig()}, leader=False,
                                         heartbeat_interval=0.5, cancel_grace=1.0, max_crashes=1000))
        self.sup.start()
        # the jobs wait for the test's verdicts, so their measured times are
        # the test's pace: the queue keeps the time of short jobs instead
        times = self.sup.claimer.times
        times.record(queue, SHORT_JOB_S)
        times.record = lambda queue, seconds: None

    @property
    def supervisor_id(self) -> int:
        return self.sup.supervisor_id

    def turn(self) -> None:
        """One turn of the loop (reads, reaps, deadlines, hand-out, heartbeat)."""
        self.sup.step(0.01)

    def children(self) -> List[object]:
        return sorted(self.sup.children.all(), key=lambda child: child.slot)

    def books(self) -> Dict[Tuple[int, int], int]:
        """(job id, lease) -> slot of every job a child holds, by the books."""
        held: Dict[Tuple[int, int], int] = {}
        for child in self.sup.children.all():
            for job in child.inflight:
                assert (job.id, job.lease) not in held, f"job {job.id} lease {job.lease} held by two children"
                held[(job.id, job.lease)] = child.slot
        return held

    def running(self, child) -> Optional[int]:
        """The id of the job the child runs now (its status block), unless
        it was killed and waits to be reaped."""
        if not self.sup.children.current(child):
            return None   # reaped
        job_id, _ = child.running_job()
        return job_id if job_id and child.kill_reason is None else None

    def refill(self, child, count: int) -> int:
        """Claim up to `count` jobs and queue them behind what this busy
        child holds, as a refill or a rush does; returns how many it got."""
        if not child.inflight or child.stopping or child.kill_reason is not None:
            return 0
        jobs = self.sup.claimer.claim(self.queue, count, time.monotonic()) or []
        if jobs:
            self.sup.children.assign(child, self.queue, jobs, self.sup.claimer.urgency(self.queue, time.time()))
        return len(jobs)

    def take_back(self, child) -> None:
        """Jobs queued behind the one it runs go back, as when that one runs long."""
        self.sup.check_deadlines(time.monotonic() + 0.2)

    def later(self, seconds: float) -> None:
        """The deadline checks of a turn `seconds` from now (timeouts, cancel grace)."""
        self.sup.check_deadlines(time.monotonic() + seconds)

    def backend_pid(self, role: str) -> Optional[int]:
        """The server process of one of the supervisor's sessions, if open."""
        conn = {"main": self.sup.session.conn, "listen": self.sup.session.notifier.conn,
                "completer": self.sup.completer.conn, "leader": self.sup.leader and self.sup.leader.conn}[role]
        try:
            return conn.info.backend_pid if conn is not None and not conn.closed else None
        except Exception:   # closed by its thread meanwhile
            return None

    def reconcile(self) -> None:
        self.sup.reconcile()

    def settle(self, timeout: float = 10.0) -> bool:
        """Write every outcome the supervisor holds."""
        return self.sup.completer.drain(timeout)

    def pending(self) -> int:
        return self.sup.completer.pending

    def close(self) -> None:
        self.sup.children.kill_all()
        for child in self.sup.children.all():
            child.process.join(timeout=5)
        self.sup.close()
