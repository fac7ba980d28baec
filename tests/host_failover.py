"""Scenario 6 of issue 25: a failover the way managed PostgreSQL and Patroni
do it. A private primary and a streaming standby (pg_basebackup), with
synchronous replication; two supervisor hosts and a producer all given one
multi-host URL (`host=a,b target_session_attrs=read-write`). While jobs
run, the primary crashes (immediate stop) and the standby is promoted.

Measured: how long until the new primary takes writes, until every
supervisor works on it again and until a job enqueued after the promotion
completes; whether every job whose enqueue committed completes; and how
many jobs ran again because a claim or outcome committed asynchronously on
the old primary never reached the standby.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import psycopg2

from awa_pool import Job

from hostlab import Bench, cluster, wait_until
from pgserver import PrivateServer

QUEUE = "hosts"
DATABASE = "awa_failover"


class Producer(threading.Thread):
    """Enqueues one job per transaction at a steady pace over the multi-host
    URL; remembers the ids whose commit returned. An enqueue whose commit
    failed is not counted (it may or may not have happened)."""

    def __init__(self, url: str, per_second: float, job_seconds: float) -> None:
        super().__init__(name="failover-producer", daemon=True)
        self.url = url
        self.pause = 1.0 / per_second
        self.job_seconds = job_seconds
        self.committed: List[int] = []
        self.commit_times: List[float] = []
        self.failures = 0
        self._halt = threading.Event()

    def run(self) -> None:
        import awa_pool

        conn: Optional[psycopg2.extensions.connection] = None
        while not self._halt.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(self.url, connect_timeout=2)
                job_id = awa_pool.enqueue(conn, Job("host_work", {"seconds": self.job_seconds}, queue=QUEUE))
                conn.commit()
                self.committed.append(job_id)
                self.commit_times.append(time.time())
            except psycopg2.Error:
                self.failures += 1
                if conn is not None:
                    conn.close()
                conn = None
            self._halt.wait(self.pause)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


@dataclass
class Failover:
    writable_after_s: float         # crash -> the promoted standby takes a write
    enqueue_gap_s: float            # longest time without a committed enqueue around the failover
    supervisors_back_after_s: float  # crash -> every supervisor heartbeated on the new primary
    first_job_after_s: float        # crash -> a job enqueued after the promotion completed
    committed: int                  # enqueues whose commit returned
    lost: int                       # of those, missing or not completed at the end (must be 0)
    reruns: int                     # jobs executed more than once (asynchronous claims/outcomes lost)
    leases_run_twice: int           # (must be 0)
    exit_codes: List[int]


def _sync_replication(primary: PrivateServer, standby_name: str) -> None:
    primary.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{standby_name}'")
    primary.execute("SELECT pg_reload_conf()")
    wait_until(lambda: primary.execute(
        "SELECT count(*) FROM pg_stat_replication WHERE application_name = %s AND sync_state = 'sync'",
        (standby_name,))[0][0] == 1, 30, "the standby to replicate synchronously")


def failover(bench: Bench, work_dir: Path, *, before_s: float = 4.0, after_s: float = 4.0,
             per_second: float = 40.0, job_seconds: float = 0.1) -> Failover:
    """Run the failover once; both servers are removed at the end."""
    lab = bench.lab
    primary = PrivateServer.create(["127.0.0.1", lab.add_address(2)], trust=[str(lab.network)],
                                   name="failover-primary")
    standby = None
    try:
        standby = primary.standby(["127.0.0.1", lab.add_address(3)], name="standby")
        _sync_replication(primary, "standby")
        url = (f"host={primary.listen[-1]},{standby.listen[-1]} port={primary.port},{standby.port} "
               f"dbname={DATABASE} user=postgres target_session_attrs=read-write")
        with cluster(bench, work_dir / "failover", server=primary, url=url, name=DATABASE) as c:
            supervisors = [c.start(lab.add_host(name)) for name in ("a", "b")]
            c.wait_ready(supervisors)
            producer = Producer(url, per_second, job_seconds)
            producer.start()
            try:
                wait_until(lambda: len(producer.committed) >= per_second * before_s, before_s * 5,
                           "the producer to enqueue before the failover")
                crashed_at = time.time()
                primary.stop("immediate")
                standby.promote()
                writable = wait_until(lambda: _writable_at(standby), 60, "the promoted standby to take writes")
                back = wait_until(lambda: _all_beat_since(c, [s.id for s in supervisors], writable), 60,
                                  "every supervisor to heartbeat on the new primary", interval=0.1)
                probe = c.enqueue([Job("host_work", queue=QUEUE)])
                c.wait_terminal(probe, timeout=60)
                first_job = float(c.scalar("SELECT extract(epoch FROM finalized_at) FROM awa.jobs WHERE id = %s",
                                           (probe[0],)))
                # the producer goes on enqueueing on the new primary for a while
                wait_until(lambda: sum(1 for t in producer.commit_times if t > writable) >= per_second * after_s,
                           after_s * 5, "the producer to enqueue on the new primary")
            finally:
                producer.stop()
            committed = producer.committed + probe
            try:
                counts = c.wait_terminal(committed, timeout=120)
            except AssertionError:  # a committed job is missing: counted as lost below
                counts = c.states(committed)
            codes = [c.stop(s) for s in supervisors]
            runs = c.executions("host_work")
    finally:
        if standby is not None:
            standby.remove()
        primary.remove()
    per_job: dict = {}
    for run in runs:
        per_job[run["job"]] = per_job.get(run["job"], 0) + 1
    leases = [(run["job"], run["lease"]) for run in runs]
    around = [t for t in producer.commit_times if crashed_at - 5 <= t <= crashed_at + 60]
    return Failover(
        writable_after_s=writable - crashed_at,
        enqueue_gap_s=max((b - a for a, b in zip(around, around[1:])), default=0.0),
        supervisors_back_after_s=back - crashed_at,
        first_job_after_s=first_job - crashed_at,
        committed=len(committed), lost=len(committed) - counts.get("completed", 0),
        reruns=sum(1 for n in per_job.values() if n > 1),
        leases_run_twice=len(leases) - len(set(leases)), exit_codes=codes)


def _writable_at(server: PrivateServer) -> Optional[float]:
    try:
        rows = server.execute("SELECT NOT pg_is_in_recovery()")
    except psycopg2.Error:
        return None
    return time.time() if rows[0][0] else None


def _all_beat_since(c, ids: List[int], since: float) -> Optional[float]:
    try:
        fresh = c.scalar("SELECT count(*) FROM awa.supervisors WHERE id = ANY(%s)"
                         " AND heartbeat_at > to_timestamp(%s)", (ids, since))
    except psycopg2.Error:
        return None
    return time.time() if fresh == len(ids) else None
