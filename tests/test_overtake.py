"""An urgent job overtakes the jobs a child holds queued: a refill that
brings a job more urgent than some a child has not started yet takes those
back and sends them again behind it, so the urgent job waits only for the
job running now. Every job still runs exactly once, under the lease it was
claimed with, and a child killed mid-way loses none."""
from __future__ import annotations

import signal
from datetime import datetime, timedelta, timezone

from awa_pool import Job
from gated_children import _assign, _claim, _Gates, _ready_child, _running_a_then_two
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
    _assign(sup, child, first)
    wait_for(lambda: pump() and child.running_job()[0] == a_id, timeout=30, message="job A to start")

    # A refill of equal urgency queues behind: nothing is taken back.
    (same_id,) = enqueue_jobs(dsn, [gates.job(priority=2)])
    same = _claim(sup, 1)
    _assign(sup, child, same)
    assert [job.id for job in child.inflight] == [a_id, aged_id, fresh_id, same_id]
    assert child.overtaken == {}

    # A priority-1 job overtakes what is less urgent, not what is as urgent.
    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
    urgent = _claim(sup, 1)
    leases.update({same_id: same[0].lease, urgent_id: urgent[0].lease})
    _assign(sup, child, urgent)
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
    _assign(sup, child, _claim(sup, 1))
    assert [job.id for job in child.inflight] == [a_id, urgent_id, b_id, c_id]

    child.process.kill()
    child.process.join(timeout=10)
    assert child.process.exitcode == -signal.SIGKILL
    wait_for(lambda: sup.step(0.05) or not sup.children.current(child), timeout=10,
             message="the loop to reap the killed child")
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
    arrives on its own LISTEN session, not at the child's next refill, and
    it overtakes the queued jobs; a new priority-2 job wakes no such early
    claim."""
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    child, pump, (a_id, b_id, c_id) = _running_a_then_two(sup, gates, dsn, priority=2)

    def notified() -> bool:
        sup.step(0.05)   # the loop reads its LISTEN session
        return bool(sup.claimer.with_work)

    sup.claimer.no_work("gates")
    (d_id,) = enqueue_jobs(dsn, [gates.job(priority=2)])
    wait_for(notified, timeout=10, message="the notification of the priority-2 job")
    assert sup.claimer.rushing == set(), "a priority-2 job is no reason to claim early"

    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
    wait_for(lambda: notified() and sup.claimer.rushing, timeout=10,
             message="the notification of the priority-1 job on awa_urgent")
    claims = sup.claimer.claims
    sup.handout.run()   # the loop's hand-out; no child has asked for a refill
    assert sup.claimer.claims == claims + 1
    assert [job.id for job in child.inflight] == [a_id, urgent_id, b_id, c_id]
    assert sup.children.overtakes == 1 and sup.claimer.rushes == 1

    gates.held.touch()
    wait_for(lambda: pump() and not child.inflight, timeout=30, message="every job to be reported")
    assert [job_id for job_id, _ in gates.starts()] == [a_id, urgent_id, b_id, c_id]
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    assert job_row(dsn, d_id)["state"] == "available", "D was never claimed"


def test_a_rush_claim_takes_priority_1_jobs_only(loopless_supervisor, dsn) -> None:
    """What a rush claims: the priority-1 jobs, even one enqueued with a past
    run_at, and nothing of the other levels, so a supervisor beaten to the
    urgent job takes no backlog job it did not ask for."""
    sup = loopless_supervisor
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    ids = enqueue_jobs(dsn, [Job("noop", {}, queue="gates", priority=p) for p in (2, 3, 4)]
                       + [Job("noop", {}, queue="gates", priority=1, run_at=past)])
    assert [job.id for job in sup.claimer.claim_urgent("gates", 4)] == [ids[3]]
    assert sup.claimer.claim_urgent("gates", 4) == []
    assert [job_row(dsn, job_id)["state"] for job_id in ids[:3]] == ["available"] * 3


def test_a_rush_serves_a_child_asking_for_a_refill_of_short_jobs_only(loopless_supervisor, dsn, tmp_path) -> None:
    """A child running its last queued job asks for a refill: with short
    jobs, a new priority-1 job goes to it at once and runs after the job
    running now; with long ones it waits for the first child to free up."""
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    (a_id,) = enqueue_jobs(dsn, [gates.job(held=True, priority=2)])
    child, pump = _ready_child(sup)
    _assign(sup, child, _claim(sup, 1))
    wait_for(lambda: pump() and child.running_job()[0] == a_id and child.refill_wanted, timeout=30,
             message="job A to start and its child to ask for a refill")
    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])

    sup.claimer.times.record("gates", 5.0)   # long jobs: no early claim
    sup.claimer.rush(["gates"])
    sup.handout.run()
    assert len(child.inflight) == 1 and sup.claimer.rushes == 0

    for _ in range(60):   # short ones (the average moves slowly)
        sup.claimer.times.record("gates", 0.001)
    sup.claimer.rushed_at.clear()
    sup.claimer.rush(["gates"])
    sup.handout.run()
    assert [job.id for job in child.inflight] == [a_id, urgent_id]
    gates.held.touch()
    wait_for(lambda: pump() and not child.inflight, timeout=30, message="every job to be reported")
    assert [job_id for job_id, _ in gates.starts()] == [a_id, urgent_id]


def test_a_rush_gives_an_idle_child_the_urgent_job(loopless_supervisor, dsn, tmp_path) -> None:
    """An idle child takes the new priority-1 job in the turn its notice
    arrives, by the rush, and the pool changes no interpreter-wide setting."""
    import sys

    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    before = sys.getswitchinterval()
    child, pump = _ready_child(sup)
    (urgent_id,) = enqueue_jobs(dsn, [gates.job(priority=1)])
    wait_for(lambda: sup.step(0.05) or sup.claimer.rushing, timeout=10,
             message="the notification of the priority-1 job")
    sup.claimer.no_work("gates")   # only the rush may claim it
    sup.handout.run()
    assert [job.id for job in child.inflight] == [urgent_id] and sup.claimer.rushes == 1
    wait_for(lambda: pump() and not child.inflight, timeout=30, message="the job to be reported")
    assert [job_id for job_id, _ in gates.starts()] == [urgent_id]
    assert sys.getswitchinterval() == before
