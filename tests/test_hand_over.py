"""A child the claims leave idle takes over jobs another child holds queued
behind a long one (Claimer._hand_over): no claim, the same leases, within
the queue's max, and a child killed after it loses no job."""
from __future__ import annotations

import signal

from gated_children import _claim, _Gates, _ready_child, _running_a_then_two
from helpers import enqueue_jobs, job_row, wait_for


def test_an_idle_child_takes_over_what_another_holds_queued(loopless_supervisor, dsn, tmp_path) -> None:
    """Nothing left to claim, one child idle and another holding jobs queued
    behind a long one: the idle child takes over the later half of them
    (no claim, same leases) and runs them at once, until the busy child
    holds only the job it runs; within the queue's max, and for jobs of
    10 ms and more. Every job runs once."""
    from awa_pool.core.config import QueueConfig

    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    ids = enqueue_jobs(dsn, [gates.job(held=True)] + [gates.job() for _ in range(4)])
    busy, pump_busy = _ready_child(sup)
    claimed = _claim(sup, 5)
    leases = {job.id: job.lease for job in claimed}
    sup.children.assign(busy, "gates", claimed)
    wait_for(lambda: pump_busy() and busy.running_job()[0] == ids[0], timeout=30, message="job A to start")
    idle = sup.children.spawn(1)
    wait_for(lambda: sup._on_child_readable(idle) or idle.ready, timeout=30, message="the second child")
    sup.claimer.no_work("gates")   # nothing left to claim
    claims = sup.claimer.claims
    sup.claimer.job_seconds["gates"] = 0.001
    sup.claimer.hand_out()
    assert not idle.inflight, "jobs of a millisecond queued behind a running one are not taken over"
    sup.claimer.job_seconds["gates"] = 1.0   # long jobs (the test's quick ones pull the average down slowly)

    sup.claimer.queues["gates"] = QueueConfig(max=1)
    sup.claimer.hand_out()
    assert [job.id for job in busy.inflight] == ids and not idle.inflight, "the queue's max is one child"
    assert sup.children.withdraw(busy, 0) == [], "a count read before the child started its next job"

    sup.claimer.queues["gates"] = QueueConfig()
    sup.claimer.hand_out()
    assert [job.id for job in busy.inflight] == ids[:3] and [job.id for job in idle.inflight] == ids[3:]

    def taken_over_all() -> bool:
        sup._on_child_readable(idle)
        sup._on_child_readable(busy)
        sup.claimer.hand_out()
        return len(busy.inflight) == 1 and not idle.inflight

    wait_for(taken_over_all, timeout=30, message="the idle child to run every job queued behind A")
    assert sup.claimer.claims == claims, "taking over needs no claim"
    assert sup.stats()["counters"]["handovers"] == 4
    assert sorted(gates.starts()) == sorted((i, leases[i]) for i in ids), \
        "each job starts once, under the lease it was claimed with, while A still runs"
    gates.held.touch()
    wait_for(lambda: pump_busy() and not busy.inflight, timeout=30, message="job A and the released copies")
    assert busy.overtaken == {}, "the busy child reported every copy it skipped"
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    assert sorted(gates.starts()) == sorted((i, leases[i]) for i in ids), "no job ran twice"
    for job_id, lease in leases.items():
        row = job_row(dsn, job_id)
        assert (row["state"], row["attempt"], row["result"]) == ("completed", 1, {"lease": lease}), row


def test_a_child_killed_after_a_hand_over_loses_no_job(loopless_supervisor, dsn, tmp_path) -> None:
    """SIGKILL the busy child after an idle one took over its queued jobs:
    those still run once on the other child, under their leases; the job
    it ran is retried and the one it still held goes back to the queue."""
    sup = loopless_supervisor
    gates = _Gates(tmp_path)
    busy, pump_busy, (a_id, b_id, c_id) = _running_a_then_two(sup, gates, dsn, priority=2)
    idle = sup.children.spawn(1)
    wait_for(lambda: sup._on_child_readable(idle) or idle.ready, timeout=30, message="the second child")
    sup.claimer.no_work("gates")
    sup.claimer.hand_out()
    assert [job.id for job in busy.inflight] == [a_id, b_id] and [job.id for job in idle.inflight] == [c_id]
    c_lease = idle.inflight[0].lease

    busy.process.kill()
    busy.process.join(timeout=10)
    assert busy.process.exitcode == -signal.SIGKILL
    sup._on_child_exit(busy)   # what the loop does when the child's sentinel fires
    wait_for(lambda: sup._on_child_readable(idle) or not idle.inflight, timeout=30, message="job C on the other child")
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    row = job_row(dsn, c_id)
    assert (row["state"], row["attempt"], row["result"]) == ("completed", 1, {"lease": c_lease}), row
    assert job_row(dsn, b_id)["state"] == "available", "the job the dead child held unstarted goes back"
    assert job_row(dsn, a_id)["state"] in ("retryable", "available"), "the crashed job is retried"
    assert sorted(start[0] for start in gates.starts()) == sorted([a_id, c_id]), "C ran once, B never started"
