"""The fast rescue of issue 25: `kill -9` of the supervisor running a job,
and the time until that job runs again on another host.

Three hosts: the leader serves a queue of its own (it never runs the job),
two workers of one child each serve the job's queue. The job sleeps for
minutes; each round kills the worker running it, waits for the other to
start it again (the handler's own start record, same clock as the kill),
then restarts the killed worker for the next round. The job hops between
the two workers, one attempt per kill.
"""
from __future__ import annotations

import os
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from awa_pool import Job
from awa_pool.core.db import LOCK_CLASS, LOCK_CLASS_LIVENESS, LOCK_LEADER

from hostlab import Bench, Supervisor, cluster, wait_until

QUEUE = "hosts"


@dataclass
class FastRescue:
    kills: int
    seconds: List[float]            # kill -> the job's next attempt started on the other host
    reasons: List[str]              # why each attempt was rescued

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds)

    @property
    def p95(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(round(0.95 * len(ordered))) - 1)]

    @property
    def worst(self) -> float:
        return max(self.seconds)


def _started(c, job_id: int, attempt: int) -> float:
    """When the handler started `attempt` of the job (0.0 until it has)."""
    for run in c.executions("host_sleep_start"):
        if run["job"] == job_id and run["attempt"] == attempt:
            return run["time"]
    return 0.0


# The leader's session ran a statement this long after the later of the
# holder's two sessions that take its liveness lock (LISTEN and leader
# thread) started: the leader looks at the locks every 0.25 s, so it has
# seen this one held.
_LEADER_HAS_LOOKED = f"""
    SELECT (SELECT a.state_change FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND l.classid = {LOCK_CLASS}
               AND l.objid = {LOCK_LEADER} AND l.objsubid = 2)
         > (SELECT max(a.backend_start) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND l.classid = {LOCK_CLASS_LIVENESS}
               AND l.objid = %s AND l.objsubid = 2) + interval '1 second'"""


def fast_rescue(bench: Bench, work_dir: Path, *, kills: int = 20) -> FastRescue:
    with cluster(bench, work_dir / "fast-rescue") as c:
        leader = c.start(bench.lab.add_host("l"), queues=("lead",), workers=1)
        c.wait_ready([leader])
        wait_until(lambda: c.leader() is leader, 15, "host l to lead")
        hosts = [bench.lab.add_host(name) for name in ("w1", "w2")]
        workers: Dict[str, Supervisor] = {h.name: c.start(h, workers=1) for h in hosts}
        c.wait_ready(list(workers.values()))
        job_id = c.enqueue([Job("host_sleep", {"seconds": 600}, queue=QUEUE, max_attempts=kills + 5)])[0]
        wait_until(lambda: _started(c, job_id, 1), 15, "the job's first attempt")
        seconds: List[float] = []
        for attempt in range(1, kills + 1):
            holder = wait_until(lambda: next((s for s in workers.values() if s.id == c.scalar(
                "SELECT supervisor_id FROM awa.jobs WHERE id = %s AND state = 'running'", (job_id,))), None),
                15, f"the supervisor running attempt {attempt}")
            # a supervisor killed before the leader's first look at its lock is
            # rescued by its heartbeat's staleness instead (under load, the
            # restarted worker can be the holder before the leader has looked)
            wait_until(lambda: c.scalar(_LEADER_HAS_LOOKED, (holder.id % 2147483648,)), 15,
                       f"the leader to have seen the liveness lock of supervisor {holder.id}")
            killed_at = time.time()
            os.kill(holder.pid, signal.SIGKILL)
            started = wait_until(lambda: _started(c, job_id, attempt + 1), 30,
                                 f"attempt {attempt + 1} to start on the other host", interval=0.01)
            seconds.append(started - killed_at)
            holder.process.wait(timeout=10)
            workers[holder.host.name] = c.start(holder.host, workers=1)
            c.wait_ready([workers[holder.host.name]])
        reasons = [entry["error"] for entry in c.scalar("SELECT errors FROM awa.jobs WHERE id = %s", (job_id,))]
    return FastRescue(kills, seconds, reasons)
