"""Leader election and the reliability it buys: one leader at a time (checked
in pg_locks) while leaders are killed, rescue of a killed supervisor's job,
and the lease guard against an old owner that comes back."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Dict, List, Optional

import psycopg2
import pytest

import awa_pool
from awa_pool import Job
from awa_pool.core.db import LOCK_CLASS, LOCK_LEADER
from awa_pool.worker.leader import Leader
from awa_pool.worker.maintenance import Maintenance, Service
from helpers import exec_records, job_row, query, scalar, wait_for

HANDOVER_S = 10.0

# granted leader locks in this test's database (pg_locks is cluster-wide)
LEADER_LOCKS = ("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s "
                "AND objsubid = 2 AND granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")


def _lock_holders(dsn: str) -> List[int]:
    return [row[0] for row in query(dsn, LEADER_LOCKS, (LOCK_CLASS, LOCK_LEADER))]


class _Sampler(threading.Thread):
    """Samples, as often as it can, how many leaders exist right now: granted
    leader locks, rows flagged is_leader, and live supervisors whose last
    heartbeat says they lead."""

    def __init__(self, dsn: str, alive) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.alive = alive
        self.stop = threading.Event()
        self.samples = 0
        self.worst: Dict[str, int] = {"locks": 0, "flags": 0, "claims": 0}

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    cur.execute(LEADER_LOCKS, (LOCK_CLASS, LOCK_LEADER))
                    locks = len(cur.fetchall())
                    cur.execute("SELECT count(*) FILTER (WHERE is_leader), "
                                "array_agg(pid) FILTER (WHERE (stats->>'leader')::boolean) FROM awa.supervisors")
                    flags, claimed = cur.fetchone()
                    claims = len([pid for pid in (claimed or []) if pid in self.alive()])
                    for key, value in (("locks", locks), ("flags", flags), ("claims", claims)):
                        self.worst[key] = max(self.worst[key], value)
                    self.samples += 1
                    self.stop.wait(0.01)
        finally:
            conn.close()


def _reports_leading(dsn: str, pid: int) -> bool:
    return bool(scalar(dsn, "SELECT (stats->>'leader')::boolean FROM awa.supervisors "
                            "WHERE pid = %s AND stopped_at IS NULL", (pid,)))


def _leader_pid(dsn: str) -> Optional[int]:
    """The OS pid of the supervisor that holds the lock and has marked itself."""
    if not _lock_holders(dsn):
        return None
    return scalar(dsn, "SELECT pid FROM awa.supervisors WHERE is_leader")


@pytest.mark.parametrize("count", [2, 3])
def test_one_leader_at_a_time_and_handover_after_kill(pools, dsn, count) -> None:
    running = [pools.start(app="apps.basic", workers=1, name=f"sup{i}") for i in range(count)]
    alive = lambda: {p.pid for p in running if p.poll() is None}  # noqa: E731
    sampler = _Sampler(dsn, alive)
    sampler.start()
    handovers = []
    try:
        leader = wait_for(lambda: _leader_pid(dsn), timeout=30, message="a first leader")
        for round_ in range(3):
            # every supervisor campaigns, and the leader's own heartbeat says it leads
            wait_for(lambda: scalar(dsn, "SELECT count(*) FROM awa.supervisors WHERE stopped_at IS NULL "
                                         "AND pid = ANY(%s)", (list(alive()),)) == count,
                     timeout=30, message=f"{count} registered supervisors")
            wait_for(lambda: _reports_leading(dsn, leader), timeout=10, message="the leader's heartbeat")
            assert leader in alive()
            os.kill(leader, signal.SIGKILL)
            killed_at = time.monotonic()
            next(p for p in running if p.pid == leader).wait(10)
            new = wait_for(lambda: (lambda pid: pid if pid not in (None, leader) else None)(_leader_pid(dsn)),
                           timeout=HANDOVER_S + 5, message=f"a new leader after kill {round_ + 1}")
            handovers.append(time.monotonic() - killed_at)
            assert new in alive()
            running = [p for p in running if p.pid != leader]
            running.append(pools.start(app="apps.basic", workers=1, name=f"sup-r{round_}"))
            leader = new
        wait_for(lambda: sampler.samples > 50, timeout=10, message="enough samples")
    finally:
        sampler.stop.set()
        sampler.join(10)
    assert sampler.worst == {"locks": 1, "flags": 1, "claims": 1}, sampler.worst
    assert max(handovers) < HANDOVER_S, handovers
    assert len(_lock_holders(dsn)) == 1


class _Recorder(Service):
    name = "recorder"
    interval = 0.05

    def __init__(self, label: str, log: List[tuple]) -> None:
        self.label = label
        self.log = log

    def tick(self, cur) -> int:
        cur.execute("SELECT 1")  # like every real service, it uses the leader's session
        self.log.append((self.label, time.monotonic()))
        return 0


def test_in_process_leaders_hand_over_when_the_session_dies(dsn) -> None:
    """Two Leader threads: only one runs maintenance; terminating its session
    makes it stop at once and the other take over within seconds."""
    ids = [scalar(dsn, "INSERT INTO awa.supervisors (hostname, pid, version, workers) "
                       "VALUES ('t', %s, 't', 1) RETURNING id", (n,)) for n in (1, 2)]
    log: List[tuple] = []
    first = Leader(dsn, ids[0], Maintenance([_Recorder("first", log)]))
    second = Leader(dsn, ids[1], Maintenance([_Recorder("second", log)]))
    first.start()
    try:
        wait_for(lambda: first.is_leader, timeout=10, message="the first leader")
        second.start()
        wait_for(lambda: len([e for e in log if e[0] == "first"]) > 10, timeout=10, message="maintenance")
        assert not second.is_leader and not [e for e in log if e[0] == "second"]
        assert scalar(dsn, "SELECT id FROM awa.supervisors WHERE is_leader") == ids[0]
        assert _lock_holders(dsn) == [first.conn.get_backend_pid()]

        query(dsn, "SELECT pg_terminate_backend(%s)", (first.conn.get_backend_pid(),))
        started = time.monotonic()
        wait_for(lambda: not first.is_leader, timeout=5, message="the first leader to notice")
        # the first reconnects at once but lets the others campaign first (two
        # campaign intervals), the second campaigns every 0.5 s: it wins
        wait_for(lambda: second.is_leader, timeout=HANDOVER_S, message="the second to take over")
        assert time.monotonic() - started < HANDOVER_S
        ran_by_first = len([e for e in log if e[0] == "first"])
        wait_for(lambda: len([e for e in log if e[0] == "second"]) > 20, timeout=10,
                 message="the new leader's maintenance")
        assert len([e for e in log if e[0] == "first"]) == ran_by_first, "the old leader stopped at once"
        assert not first.is_leader
        assert _lock_holders(dsn) == [second.conn.get_backend_pid()]
        assert scalar(dsn, "SELECT id FROM awa.supervisors WHERE is_leader") == ids[1]
    finally:
        first.stop()
        second.stop()
    assert _lock_holders(dsn) == [], "stopping ends the session and frees the lock"


def test_kill9_mid_job_is_completed_by_another_supervisor(pools, dsn) -> None:
    supervisors = [pools.start(app="apps.basic", workers=1, name=f"sup{i}") for i in range(2)]
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        job_id = awa_pool.enqueue(conn, Job("sleep", {"seconds": 3}))
    finally:
        conn.close()
    wait_for(lambda: any(r[0] == "sleep_start" and r[1] == job_id for r in exec_records(pools.log_dir)),
             timeout=30, message="the job to start")
    owner = scalar(dsn, "SELECT s.pid FROM awa.jobs j JOIN awa.supervisors s ON s.id = j.supervisor_id "
                        "WHERE j.id = %s AND j.state = 'running'", (job_id,))
    assert owner in {p.pid for p in supervisors}
    os.kill(owner, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)) == "completed",
             timeout=45, message="another supervisor to complete the job")
    assert time.monotonic() - killed_at < 45
    row = job_row(dsn, job_id)
    survivor = next(p for p in supervisors if p.pid != owner)
    assert row["attempt"] == 2, "one extra attempt"
    assert row["supervisor_id"] == scalar(dsn, "SELECT id FROM awa.supervisors WHERE pid = %s", (survivor.pid,))
    assert len(row["errors"]) == 1 and "supervisor lost" in row["errors"][0]["error"]
    assert [a["outcome"] for a in awa_pool.JobRecord.from_row(row).attempts] == ["lost", "completed"]
    starts = [r for r in exec_records(pools.log_dir) if r[0] == "sleep_start" and r[1] == job_id]
    assert len(starts) == 2 and starts[0][2] != starts[1][2], "ran again in another process"


def test_old_owner_back_after_rescue_cannot_overwrite(pools, dsn) -> None:
    """The owner of a running job freezes (SIGSTOP) while its child finishes
    the job; the job is rescued and completed elsewhere; the owner thaws
    (SIGCONT) and flushes its stale completion, which changes nothing."""
    leader = pools.start("--queue", "idle", app="apps.lease", workers=1, name="leader")
    wait_for(lambda: _leader_pid(dsn) == leader.pid, timeout=30, message="the first supervisor to lead")
    owner = pools.start(app="apps.lease", workers=1, name="owner")
    owner_id = wait_for(lambda: scalar(dsn, "SELECT id FROM awa.supervisors WHERE pid = %s", (owner.pid,)),
                        timeout=30, message="the owner to register")
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        job_id = awa_pool.enqueue(conn, Job("sleep_whoami", {"seconds": 3}, queue="lease"))
    finally:
        conn.close()
    start = wait_for(lambda: next((r for r in exec_records(pools.log_dir)
                                   if r[0] == "sleep_whoami_start" and r[1] == job_id), None),
                     timeout=30, message="the owner to start the job")
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        assert job_row(dsn, job_id)["supervisor_id"] == owner_id
        rescuer = pools.start(app="apps.lease", workers=1, name="rescuer")
        wait_for(lambda: scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)) == "completed",
                 timeout=45, message="the job to be rescued and completed elsewhere")
        # the frozen owner's child finished its run too: its outcome waits in the pipe
        wait_for(lambda: any(r[0] == "sleep_whoami" and r[1] == job_id and r[2] == start[2]
                             for r in exec_records(pools.log_dir)),
                 timeout=15, message="the old attempt to finish")
        final = job_row(dsn, job_id)
        assert final["attempt"] == 2 and final["result"]["attempt"] == 2
        assert final["result"]["pid"] != start[2]
        assert final["supervisor_id"] == scalar(dsn, "SELECT id FROM awa.supervisors WHERE pid = %s",
                                                (rescuer.pid,))
        thawed_at = scalar(dsn, "SELECT now()")
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    # the owner records its child's outcome, flushes it (lease 1) and heartbeats;
    # wait for a heartbeat that reports the completion, then one more
    reported = wait_for(lambda: scalar(dsn, "SELECT heartbeat_at FROM awa.supervisors WHERE id = %s "
                                            "AND heartbeat_at > %s AND (stats->'counters'->>'completed')::int >= 1",
                                       (owner_id, thawed_at)),
                        timeout=30, message="the old owner to report its late completion")
    wait_for(lambda: scalar(dsn, "SELECT heartbeat_at > %s FROM awa.supervisors WHERE id = %s",
                            (reported, owner_id)), timeout=30, message="another heartbeat of the old owner")
    assert owner.poll() is None
    assert job_row(dsn, job_id) == final, "the stale completion changed nothing"
    assert scalar(dsn, "SELECT count(*) FROM awa.jobs") == 1


def test_leader_session_detects_a_vanished_host_quickly(dsn) -> None:
    """The lock is freed only when the server drops the leader's session: it
    must notice a dead or cut-off host within seconds."""
    supervisor_id = scalar(dsn, "INSERT INTO awa.supervisors (hostname, pid, version, workers) "
                                "VALUES ('t', 1, 't', 1) RETURNING id")
    leader = Leader(dsn, supervisor_id, Maintenance([]))
    try:
        leader.step()
        assert leader.is_leader
        with leader.conn.cursor() as cur:
            cur.execute("SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_user_timeout'), "
                        "inet_client_addr() IS NULL")
            idle, user_timeout, unix_socket = cur.fetchone()
        if unix_socket:
            pytest.skip("keepalives do not apply to Unix-domain sockets")
        assert idle == "5" and user_timeout == "10000"
    finally:
        leader.stop()


def test_a_frozen_leader_is_deposed_and_its_jobs_rescued(pools, dsn) -> None:
    """SIGSTOP the leader while it runs a job: it keeps its session (and the
    lock), but a follower ends that session once the leader stops
    heartbeating, takes over, and rescues the frozen supervisor's job."""
    supervisors = [pools.start(app="apps.basic", workers=1, name=f"sup{i}") for i in range(2)]
    wait_for(lambda: _leader_pid(dsn) in {p.pid for p in supervisors}, timeout=30, message="a leader")
    leader = _leader_pid(dsn)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        # a job the leader will hold: pause the follower's queue share by keeping it busy
        jobs = [awa_pool.enqueue(conn, Job("sleep", {"seconds": 60})) for _ in range(2)]
    finally:
        conn.close()
    wait_for(lambda: len({r[1] for r in exec_records(pools.log_dir) if r[0] == "sleep_start"}) == 2,
             timeout=30, message="both jobs running, one per supervisor")
    frozen_job = scalar(dsn, "SELECT j.id FROM awa.jobs j JOIN awa.supervisors s ON s.id = j.supervisor_id "
                             "WHERE s.pid = %s AND j.state = 'running'", (leader,))
    os.kill(leader, signal.SIGSTOP)
    try:
        frozen_at = time.monotonic()
        follower = next(p.pid for p in supervisors if p.pid != leader)
        wait_for(lambda: _leader_pid(dsn) == follower, timeout=30, message="the follower to take over")
        took_over = time.monotonic() - frozen_at
        wait_for(lambda: scalar(dsn, "SELECT attempt FROM awa.jobs WHERE id = %s", (frozen_job,)) == 2
                 or scalar(dsn, "SELECT state::text FROM awa.jobs WHERE id = %s", (frozen_job,)) == "available",
                 timeout=30, message="the frozen supervisor's job to be rescued")
        errors = job_row(dsn, frozen_job)["errors"]
        assert errors and "supervisor lost" in errors[0]["error"]
        assert took_over < 25, f"leadership moved after {took_over:.1f}s"
        assert len(_lock_holders(dsn)) == 1
    finally:
        os.kill(leader, signal.SIGCONT)
    assert len(jobs) == 2


def test_the_deadline_of_a_raw_sql_job_comes_from_its_task_and_the_leader_enforces_it(
        pools, processes, dsn) -> None:
    """A job enqueued by raw SQL sets no timeout; its task declares 3 s. The
    claim builds the database deadline from the task's timeout, so when the
    supervisor running it freezes (and cannot kill its child), the leader's
    deadline backstop fails the attempt: long before the frozen supervisor
    would count as lost (the leader here waits 120 s for that)."""
    import sys

    leader = processes.start([sys.executable, "-c", (
        "import sys; from awa_pool import Pool; "
        f"sys.exit(Pool({dsn!r}, app='apps.basic', workers=1, queues=['elsewhere'], "
        "heartbeat_staleness=120, deadline_grace=1).run())")], name="leader")
    wait_for(lambda: _leader_pid(dsn) == leader.pid, timeout=30, message="the Pool to lead")
    owner = pools.start(app="apps.basic", workers=1, name="owner")
    job_id = scalar(dsn, "SELECT awa.insert_job('hang_with_timeout', '{}'::jsonb)")
    wait_for(lambda: any(r[0] == "hang_start" for r in exec_records(pools.log_dir)), timeout=30,
             message="the job to start in the owner's child")
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        row = job_row(dsn, job_id)
        assert row["timeout_s"] is None  # the job's own: none
        assert 2.9 < (row["deadline"] - row["attempted_at"]).total_seconds() < 3.5
        wait_for(lambda: job_row(dsn, job_id)["state"] != "running", timeout=30,
                 message="the leader's deadline backstop to end the attempt")
        errors = job_row(dsn, job_id)["errors"]
        assert "deadline exceeded" in errors[-1]["error"], errors
        assert owner.poll() is None and leader.poll() is None
    finally:
        os.kill(owner.pid, signal.SIGCONT)
