"""An urgent job overtakes the jobs a child holds queued: a refill that
brings a job more urgent than some a child has not started yet takes those
back and sends them again behind it, so the urgent job waits only for the
job running now. Every job still runs exactly once, under the lease it was
claimed with, and a child killed mid-way loses none."""
from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta, timezone

import pytest

from awa_pool import Job
from awa_pool.supervisor import Supervisor
from gated_children import _claim, _Gates, _ready_child, _running_a_then_two
from helpers import enqueue_jobs, job_row, wait_for


def test_an_urgent_job_runs_next_and_every_job_once_with_its_lease(loopless_supervisor, dsn, tmp_path) -> None:
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    long_ago = datetime.now(timezone.utc) - timedelta(minutes=2)
    # A runs and holds the child; behind it wait `aged` (priority 2, but two
    # minutes old: aging makes it as urgent as a new priority-1 job) and
    # `fresh` (priority 2).
    a_id, aged_id, fresh_id = enqueue_jobs(dsn, [
        gates.job(held=True, priority=2, run_at=long_ago - timedelta(seconds=1)),
        gates.job(priority=2, run_at=long_ago),
        gates.job(priority=2)])
    child, pump = _ready_child(sup)
    first = _claim(sup, 3)
    assert [job.id for job in first] == [a_id, aged_id, fresh_id]
    leases = {job.id: job.lease for job in first}
    sup.children.assign(child, "gates", first, sup.claimer._urgency("gates"))
    wait_for(lambda: pump() and child.running_job()[0] == a_id, timeout=30, message="job A to start")

    # A refill of equal urgency queues behind: nothing is taken back.
    (same_id,) = enqueue_jobs(dsn, [gates.job(priority=2)])
    same = _claim(sup, 1)
    sup.children.assign(child, "gates", same, sup.claimer._urgency("gates"))
    assert [job.id for job in child.inflight] == [a_id, aged_id, fresh_id, same_id]
    assert child.overtaken == {}

    # A priority-1 job overtakes what is less urgent, not what is as urgent.
    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
    urgent = _claim(sup, 1)
    leases.update({same_id: same[0].lease, urgent_id: urgent[0].lease})
    sup.children.assign(child, "gates", urgent, sup.claimer._urgency("gates"))
    assert [job.id for job in child.inflight] == [a_id, aged_id, urgent_id, fresh_id, same_id]
    assert sorted(child.overtaken) == sorted((i, leases[i]) for i in (aged_id, fresh_id, same_id))
    assert sup.stats()["counters"]["overtakes"] == 1
    assert sup.children.inflight_leases() == leases

    gates.held.touch()
    wait_for(lambda: pump() and not child.inflight, timeout=30, message="every job to be reported")
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    assert gates.starts() == [(i, leases[i]) for i in (a_id, aged_id, urgent_id, fresh_id, same_id)], \
        "each job must start once, in urgency order, under the lease it was claimed with"
    assert child.overtaken == {}, "a stale copy's release was not reported"
    for job_id, lease in leases.items():
        row = job_row(dsn, job_id)
        assert (row["state"], row["attempt"], row["result"]) == ("completed", 1, {"lease": lease}), row


def test_a_child_killed_after_an_overtake_loses_no_job(loopless_supervisor, dsn, tmp_path) -> None:
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    child, pump, (a_id, b_id, c_id) = _running_a_then_two(sup, gates, dsn, priority=3)
    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
    sup.children.assign(child, "gates", _claim(sup, 1), sup.claimer._urgency("gates"))
    assert [job.id for job in child.inflight] == [a_id, urgent_id, b_id, c_id]

    child.process.kill()
    child.process.join(timeout=10)
    assert child.process.exitcode == -signal.SIGKILL
    sup._on_child_exit(child)   # what the loop does when the child's sentinel fires
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    assert gates.starts() == [(a_id, job_row(dsn, a_id)["lease"])], "only job A had started"
    states = {job_id: job_row(dsn, job_id)["state"] for job_id in (urgent_id, b_id, c_id)}
    assert states == {urgent_id: "available", b_id: "available", c_id: "available"}, \
        f"the jobs the child held unstarted must go back to the queue: {states}"
    assert job_row(dsn, a_id)["state"] in ("retryable", "available"), "the crashed job is retried"


def _urgent_notes(listener, dsn):
    """The awa_urgent notifications committed so far: a marker sent after
    them on another session arrives after all of them."""
    import psycopg2

    sender = psycopg2.connect(dsn)
    try:
        with sender.cursor() as cur:
            cur.execute("NOTIFY awa_urgent, 'marker'")
        sender.commit()
    finally:
        sender.close()
    got = []

    def marker_arrived() -> bool:
        listener.poll()
        got.extend(n.payload for n in listener.notifies if n.channel == "awa_urgent")
        listener.notifies.clear()
        return "marker" in got

    wait_for(marker_arrived, timeout=10, message="the marker notification")
    return [payload for payload in got if payload != "marker"]


def test_priority_1_jobs_becoming_available_notify_awa_urgent(dsn, auto) -> None:
    """Enqueued or promoted priority-1 jobs wake supervisors on awa_urgent
    (one notification per queue and transaction); other priorities and
    jobs scheduled for later do not."""
    with auto.cursor() as cur:
        cur.execute("LISTEN awa_urgent")
    enqueue_jobs(dsn, [Job("noop", {}, queue="q1", priority=2), Job("noop", {}, queue="q1", priority=4)])
    assert _urgent_notes(auto, dsn) == []
    enqueue_jobs(dsn, [Job("noop", {"i": i}, queue="q1", priority=1) for i in range(50)]
                 + [Job("noop", {}, queue="q2", priority=1)])
    assert sorted(_urgent_notes(auto, dsn)) == ["q1", "q2"]
    (later,) = enqueue_jobs(dsn, [Job("noop", {}, queue="q3", priority=1,
                                      run_at=datetime.now(timezone.utc) + timedelta(hours=1))])
    assert _urgent_notes(auto, dsn) == [], "a job scheduled for later is not available yet"
    with auto.cursor() as cur:
        cur.execute("UPDATE awa.jobs_deferred SET run_at = now() - interval '1 second' WHERE id = %s", (later,))
        cur.execute("SELECT awa.promote_due()")
    assert _urgent_notes(auto, dsn) == ["q3"], "the promoted job wakes supervisors too"


def test_a_new_priority_1_job_is_claimed_at_once_and_runs_next(loopless_supervisor, dsn, tmp_path) -> None:
    """The supervisor claims a new priority-1 job when its notification
    arrives, not at the child's next refill, and it overtakes the queued
    jobs; a new priority-2 job wakes no such early claim."""
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    child, pump, (a_id, b_id, c_id) = _running_a_then_two(sup, gates, dsn, priority=2)

    def notified() -> bool:
        sup._on_notify()   # what the loop does when the LISTEN session is readable
        return bool(sup.claimer.with_work)

    sup.claimer.no_work("gates")
    (d_id,) = enqueue_jobs(dsn, [gates.job(priority=2)])
    wait_for(notified, timeout=10, message="the notification of the priority-2 job")
    assert sup.claimer.rushing == set(), "a priority-2 job is no reason to claim early"
    assert sup.lane is None, "the urgent lane opens its session for the first priority-1 job"

    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
    wait_for(lambda: notified() and sup.claimer.rushing, timeout=10,
             message="the notification of the priority-1 job on awa_urgent")
    assert sup.lane is not None, "the first priority-1 job opens the urgent lane"
    claims = sup.claimer.claims
    sup.claimer.hand_out()   # the loop's dispatch; no child has asked for a refill
    assert sup.claimer.claims == claims + 1
    assert [job.id for job in child.inflight] == [a_id, urgent_id, b_id, c_id]
    assert sup.children.overtakes == 1

    gates.held.touch()
    wait_for(lambda: pump() and not child.inflight, timeout=30, message="every job to be reported")
    assert [job_id for job_id, _ in gates.starts()] == [a_id, urgent_id, b_id, c_id]
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    assert job_row(dsn, d_id)["state"] == "available", "D was never claimed"


def _start_lane(sup: Supervisor) -> None:
    """The urgent lane, as a running supervisor has it (a test playing the
    loop holds the state lock when it touches the supervisor's parts)."""
    sup.state = "running"
    sup._start_lane()
    wait_for(lambda: sup.lane.connected, timeout=10, message="the urgent lane's session")


def _all_reported(sup: Supervisor, child, pump) -> None:
    def reported() -> bool:
        with sup.state_lock:  # the lane runs: the part of the loop the test plays holds the lock
            pump()
            return not child.inflight

    wait_for(reported, timeout=30, message="every job to be reported")


class _BlockedStatement:
    """The main loop waiting on a statement (blocked on an advisory lock the
    test holds), in a thread that plays the loop: it holds the state lock
    except while the statement waits, as a tick does."""

    KEY = 740_021

    def __init__(self, sup: Supervisor, dsn: str) -> None:
        import threading

        import psycopg2

        self.holder = psycopg2.connect(dsn)
        self.holder.autocommit = True
        with self.holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (self.KEY,))
        self.done = threading.Event()

        def statement() -> None:
            with sup.state_lock:
                sup.session.run(lambda cur: cur.execute("SELECT pg_advisory_lock(%s), pg_advisory_unlock(%s)",
                                                        (self.KEY, self.KEY)))
            self.done.set()

        self.thread = threading.Thread(target=statement, daemon=True)
        self.thread.start()
        wait_for(lambda: self._waiting(), timeout=10, message="the main session to wait on the lock")

    def _waiting(self) -> bool:
        with self.holder.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
                        "AND NOT granted", (self.KEY,))
            return cur.fetchone()[0] == 1

    def release(self) -> None:
        with self.holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", (self.KEY,))
        self.holder.close()
        assert self.done.wait(10), "the main session's statement did not finish"


def test_the_urgent_lane_hands_out_a_priority_1_job_while_the_loop_waits_on_a_statement(
        loopless_supervisor, dsn, tmp_path) -> None:
    """The loop reads its LISTEN session only between statements; the lane
    claims a new priority-1 job and the child starts it while the loop's
    statement has not returned. Every job still runs once, under its lease."""
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    child, pump, (a_id, b_id, c_id) = _running_a_then_two(sup, gates, dsn, priority=2)
    _start_lane(sup)
    blocked = _BlockedStatement(sup, dsn)
    try:
        (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
        wait_for(lambda: urgent_id in [job.id for job in list(child.inflight)], timeout=10,
                 message="the lane to hand the priority-1 job to the child")
        assert not blocked.done.is_set()
        with sup.state_lock:
            assert [job.id for job in child.inflight] == [a_id, urgent_id, b_id, c_id]
            assert sup.children.overtakes == 1 and sup.lane.rushes == 1
        gates.held.touch()

        def urgent_started() -> bool:
            with sup.state_lock:
                pump()
            return urgent_id in [job_id for job_id, _ in gates.starts()]

        wait_for(urgent_started, timeout=30, message="the priority-1 job to start")
        assert not blocked.done.is_set(), "the job must start while the loop's statement still waits"
    finally:
        blocked.release()
    _all_reported(sup, child, pump)
    assert [job_id for job_id, _ in gates.starts()] == [a_id, urgent_id, b_id, c_id]
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    for job_id, lease in gates.starts():
        row = job_row(dsn, job_id)
        assert (row["state"], row["attempt"], row["result"]) == ("completed", 1, {"lease": lease}), row
    assert len({lease for _, lease in gates.starts()}) == 2, "the lane's claim has a lease of its own"


def test_the_urgent_lane_comes_back_after_its_session_is_terminated(loopless_supervisor, dsn, auto,
                                                                   tmp_path) -> None:
    """pg_terminate_backend on the lane's session: the loop claims priority-1
    jobs in the meantime (its own LISTEN session hears awa_urgent too), the
    lane reconnects, and its next claim works; no job runs twice."""
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    child, pump, (a_id, b_id, c_id) = _running_a_then_two(sup, gates, dsn, priority=3)
    _start_lane(sup)
    first_pid = sup.lane.conn.get_backend_pid()
    with auto.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
    wait_for(lambda: sup.lane.connected and sup.lane.conn.get_backend_pid() != first_pid, timeout=15,
             message="the urgent lane to reconnect")
    with sup.state_lock:   # notices sent while it was away are lost to it: the loop's claims look
        assert "gates" in sup.claimer.urgent_left
    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
    wait_for(lambda: urgent_id in [job.id for job in list(child.inflight)], timeout=10,
             message="the reconnected lane to hand out the priority-1 job")
    gates.held.touch()
    _all_reported(sup, child, pump)
    assert [job_id for job_id, _ in gates.starts()] == [a_id, urgent_id, b_id, c_id]
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    assert all(job_row(dsn, job_id)["state"] == "completed" for job_id in (a_id, b_id, c_id, urgent_id))


def test_a_rush_claim_takes_priority_1_jobs_only(loopless_supervisor, dsn) -> None:
    """What a rush claims (URGENT_ONLY): the priority-1 jobs, even one
    enqueued with a past run_at, and nothing of the other levels, so a
    supervisor beaten to the urgent job takes no backlog job it did not ask for."""
    from awa_pool.worker.claimer import URGENT_ONLY

    sup = loopless_supervisor
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    ids = enqueue_jobs(dsn, [Job("noop", {}, queue="gates", priority=p) for p in (2, 3, 4)]
                       + [Job("noop", {}, queue="gates", priority=1, run_at=past)])
    got = sup.claimer._claim_statement("gates", 0, 4, URGENT_ONLY, rush=True)
    assert [job.id for job in got] == [ids[3]]
    assert sup.claimer._claim_statement("gates", 0, 4, URGENT_ONLY, rush=True) == []
    assert [job_row(dsn, job_id)["state"] for job_id in ids[:3]] == ["available"] * 3


def test_a_rush_serves_a_child_asking_for_a_refill_of_short_jobs_only(loopless_supervisor, dsn, tmp_path) -> None:
    """A child running its last queued job asks for a refill: with short
    jobs, a new priority-1 job goes to it at once and runs after the job
    running now; with long ones it waits for the first child to free up."""
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    (a_id,) = enqueue_jobs(dsn, [gates.job(held=True, priority=2)])
    child, pump = _ready_child(sup)
    sup.children.assign(child, "gates", _claim(sup, 1), sup.claimer._urgency("gates"))
    wait_for(lambda: pump() and child.running_job()[0] == a_id and child.refill_wanted, timeout=30,
             message="job A to start and its child to ask for a refill")
    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])

    sup.claimer.record_job_time("gates", 5.0)   # long jobs: no early claim
    sup.claimer.rush(["gates"])
    assert sup.claimer._rush(time.monotonic()) == 0 and len(child.inflight) == 1

    sup.claimer.record_job_time("gates", 0.001)   # short ones (the average moves slowly)
    for _ in range(60):
        sup.claimer.record_job_time("gates", 0.001)
    sup.claimer.rushed_at.clear()
    sup.claimer.rush(["gates"])
    assert sup.claimer._rush(time.monotonic()) == 1
    assert [job.id for job in child.inflight] == [a_id, urgent_id]
    gates.held.touch()
    wait_for(lambda: pump() and not child.inflight, timeout=30, message="every job to be reported")
    assert [job_id for job_id, _ in gates.starts()] == [a_id, urgent_id]


def test_the_state_lock_lets_the_lane_go_before_the_loops_next_statement() -> None:
    """The lane waiting for the lock claims before the statement the loop
    lets go of it for: that statement (most likely a claim of a full batch)
    would otherwise take the urgent job first."""
    import threading

    from awa_pool.worker.urgent_lane import StateLock

    lock, order = StateLock(), []

    def lane() -> None:
        with lock.first():
            order.append("lane")

    with lock:
        thread = threading.Thread(target=lane)
        thread.start()
        wait_for(lambda: lock._urgent == 1, timeout=5, message="the lane to wait for the lock")
        order.append("loop")
        with lock.released():
            order.append("statement")
        order.append("loop again")
    thread.join(5)
    assert order == ["loop", "lane", "statement", "loop again"]
    with lock.released():   # not held by this thread: a no-op
        order.append("outside")


def test_a_rush_gives_an_idle_child_the_urgent_job_and_the_lane_its_switch_interval(
        loopless_supervisor, dsn, tmp_path) -> None:
    """An idle child takes the new priority-1 job at once (not after the
    loop's next plan and claim). While the lane runs, the supervisor's GIL
    switch interval is short; a forked child and the stopped lane give the
    program's back."""
    import sys

    from awa_pool.worker import urgent_lane

    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    child, pump = _ready_child(sup)
    before = sys.getswitchinterval()
    _start_lane(sup)
    assert sys.getswitchinterval() == pytest.approx(min(before, urgent_lane.SWITCH_INTERVAL_S))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # a forked child, as the supervisor's are
        os.write(write_end, repr(sys.getswitchinterval()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert float(os.read(read_end, 64)) == pytest.approx(before)
    os.close(read_end)
    os.close(write_end)
    other = sup.children.spawn(1)   # not ready yet, so not idle
    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
    wait_for(lambda: [job.id for job in list(child.inflight) + list(other.inflight)] == [urgent_id],
             timeout=10, message="the lane to hand the job to an idle child")
    sup.lane.stop()
    sup.lane = None
    assert sys.getswitchinterval() == pytest.approx(before)
    wait_for(lambda: pump() and not child.inflight, timeout=30, message="the job to be reported")
    assert [job_id for job_id, _ in gates.starts()] == [urgent_id]


def test_a_backlog_claim_leaves_new_priority_1_jobs_to_the_lane_unless_a_rush_left_some(
        loopless_supervisor, dsn) -> None:
    """While the lane listens, a claim past a backlog's cursor skips
    priority 1: a new priority-1 job must not wait for a batch claim that
    takes milliseconds. Once a rush leaves such jobs behind (no child to
    give one to), the backlog claims look at priority 1 again until one
    comes back without more; the claim from the start finds them too."""
    from awa_pool.worker.claimer import LOOK_FROM_START_EVERY_S

    sup = loopless_supervisor
    claimer = sup.claimer
    claimer.lane_up = lambda: True
    backlog = enqueue_jobs(dsn, [Job("noop", {}, queue="gates", priority=2) for _ in range(8)])
    now = time.monotonic()

    def claim_ids(want: int):
        return [job.id for job in claimer._claim_lane("gates", 0, want, now)]

    assert claim_ids(2) == backlog[:2]            # full: the queue has a backlog, and a cursor
    (urgent_id,) = enqueue_jobs(dsn, [Job("noop", {}, queue="gates", priority=1)])
    assert claim_ids(2) == backlog[2:4]           # past the cursor: level 1 is the lane's
    assert job_row(dsn, urgent_id)["state"] == "available"

    claimer.rush(["gates"])
    assert claimer._rush(now) == 0                 # no child to give it to: left behind
    assert "gates" in claimer.urgent_left
    assert claim_ids(2) == [urgent_id, backlog[4]]
    assert claim_ids(2) == backlog[5:7] and "gates" not in claimer.urgent_left   # none left

    (released_id,) = enqueue_jobs(dsn, [Job("noop", {}, queue="gates", priority=1)])
    assert claim_ids(1) == [backlog[7]]           # (a job made available without a notice)
    claimer.looked_from_start[("gates", 0)] = now - LOOK_FROM_START_EVERY_S
    assert claim_ids(1) == [released_id]          # the claim from the start takes it

    claimer.lane_up = lambda: False               # no lane: every claim looks at level 1
    more = enqueue_jobs(dsn, [Job("noop", {}, queue="gates", priority=p) for p in (2, 2, 1)])
    assert claim_ids(1) == [more[2]]
    assert claim_ids(2) == more[:2]
