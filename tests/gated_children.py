"""Children of a loopless supervisor running apps.gates jobs: the test
decides when each job may finish (its gate file) and reads the order they
started in (test_overtake, test_take_back_pairing). The supervisor is
started but not running, so its step() reads notifications, reaps
children and enforces their deadlines without claiming or handing out:
the test does that."""
from __future__ import annotations

import time

from awa_pool import Job
from awa_pool.supervisor import Supervisor
from helpers import enqueue_jobs, wait_for


def _claim(sup: Supervisor, limit: int):
    return sup.claimer.claim("gates", limit, time.monotonic())


def _urgency(sup: Supervisor):
    return sup.claimer.urgency("gates", time.time())


HELD = 60.0   # the patience of jobs these tests hand out: they take back what they mean to themselves


def _assign(sup: Supervisor, child, jobs, urgent: bool = True) -> None:
    """Hand jobs to a child as the hand-out does (with their urgency, so a
    more urgent batch overtakes), with a patience long enough that the
    loop's own deadline check never takes back what the test queued."""
    sup.children.assign(child, "gates", jobs, _urgency(sup) if urgent else None, HELD)


class _Gates:
    """Jobs of apps.gates whose starts land in one log, in order."""

    def __init__(self, tmp_path) -> None:
        self.log = tmp_path / "starts.log"
        self.log.touch()
        self.open = tmp_path / "open"
        self.open.touch()
        self.held = tmp_path / "held"   # job A's gate: closed until the test opens it

    def job(self, held: bool = False, **fields) -> Job:
        return Job("gate", {"gate": str(self.held if held else self.open), "log": str(self.log)}, **fields)

    def starts(self):
        return [tuple(map(int, line.split()[1:])) for line in self.log.read_text().splitlines()]


def _ready_child(sup: Supervisor):
    child = sup.children.spawn(0)
    sup.events.watch_child(child)   # as the loop does for the children it forks

    def pump():
        # what the loop does with a child's messages (the whole turn would
        # also enforce deadlines, and take back what these tests queue)
        outcomes, _ = sup.children.read(child)
        sup.completer.add([finished.outcome for finished in outcomes])
        return True

    wait_for(lambda: pump() and child.ready, timeout=30, message="the child to say it is ready")
    return child, pump


def _running_a_then_two(sup: Supervisor, gates: _Gates, dsn: str, priority: int):
    """A child running job A (held at its gate) with B and C queued behind
    it, all of this priority: (child, pump, (A, B, C))."""
    ids = enqueue_jobs(dsn, [gates.job(held=True, priority=priority), gates.job(priority=priority),
                             gates.job(priority=priority)])
    child, pump = _ready_child(sup)
    _assign(sup, child, _claim(sup, 3))
    wait_for(lambda: pump() and child.running_job()[0] == ids[0], timeout=30, message="job A to start")
    return child, pump, tuple(ids)
