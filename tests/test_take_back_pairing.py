"""A job taken back from a child and handed to that same child again under a
new lease: the child's late "released" for the old lease must not make the
supervisor forget the new attempt, which the child is running. The chaos run
found the consequence: the supervisor's reconcile released that job while its
child ran it, so it ran twice with no fault to explain it."""
from __future__ import annotations

from awa_pool import Job
from gated_children import _assign, _claim, _ready_child
from helpers import enqueue_jobs, job_row, wait_for


def test_a_late_release_of_an_old_lease_leaves_the_new_attempt_held(loopless_supervisor, dsn, tmp_path) -> None:
    sup = loopless_supervisor
    log = tmp_path / "starts.log"
    gate_a, gate_j = tmp_path / "open-a", tmp_path / "open-j"
    a_id, j_id = enqueue_jobs(dsn, [Job("gate", {"gate": str(gate_a), "log": str(log)}),
                                    Job("gate", {"gate": str(gate_j), "log": str(log)})])
    child, pump = _ready_child(sup)

    # A and J go to the child in one batch; A runs long, so J is taken back.
    first = _claim(sup, 2)
    assert [job.id for job in first] == [a_id, j_id]
    old_lease = first[1].lease
    _assign(sup, child, first, urgent=False)
    wait_for(lambda: pump() and child.running_job()[0] == a_id, timeout=30, message="job A to start")
    released = sup.children.take_back(child, "job A runs long")
    assert [(o.job_id, o.lease, o.outcome) for o in released.outcomes] == [(j_id, old_lease, "released")]
    sup.completer.add(released.outcomes)   # as the loop does with jobs a child hands back
    wait_for(lambda: job_row(dsn, j_id)["state"] == "available", timeout=30,
             message="the taken-back job J to be available again")

    # J is claimed again and queued behind A in the same child, under a new lease.
    second = _claim(sup, 1)
    assert [job.id for job in second] == [j_id]
    new_lease = second[0].lease
    assert new_lease != old_lease
    _assign(sup, child, second, urgent=False)

    # A ends; the child skips the old J and reports it released (with A's
    # outcome), then starts the new J, which waits at its gate.
    gate_a.touch()
    wait_for(lambda: pump() and all(job.id != a_id for job in child.inflight)
             and f"start {j_id} {new_lease}" in log.read_text(),
             timeout=30, message="job A to be reported and the new attempt of J to start")
    assert sup.children.inflight_leases() == {j_id: new_lease}, \
        "the release of J's old lease made the supervisor forget J's new attempt, which its child runs"

    # The supervisor's reconcile (every 30 s, and after a reconnect) must
    # leave J alone, once the outcomes read so far are written.
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    sup.reconcile()
    assert sup.completer.drain(10), "the completer did not write its outcomes"
    row = job_row(dsn, j_id)
    assert (row["state"], row["lease"]) == ("running", new_lease), \
        f"reconcile released job J while its child ran it: {row}"

    gate_j.touch()
    row = wait_for(lambda: pump() and sup.completer.drain(1) and (r := job_row(dsn, j_id))["state"] != "running"
                   and r, timeout=30, message="job J to end")
    assert row["state"] == "completed" and row["result"] == {"lease": new_lease}, row
    starts = log.read_text().split("\n")
    assert sorted(filter(None, starts)) == sorted([f"start {a_id} {first[0].lease}", f"start {j_id} {new_lease}"])
