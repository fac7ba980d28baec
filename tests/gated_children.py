"""Children of a loopless supervisor running apps.gates jobs: the test
decides when each job may finish (its gate file) and reads the order they
started in (test_overtake, test_take_back_pairing). The supervisor is
started but not running, so its step() reads the children's pipes, reaps
them and enforces their deadlines without claiming or handing out: the
test does that."""
from __future__ import annotations

import time

from awa_pool import Job
from awa_pool.supervisor import Supervisor
from helpers import enqueue_jobs, wait_for


def _claim(sup: Supervisor, limit: int):
    return sup.claimer.claim("gates", limit, time.monotonic())


def _urgency(sup: Supervisor):
    return sup.claimer.urgency("gates", time.time())


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
        sup.step(0.01)  # one turn of the loop: the child's messages are read
        return True

    wait_for(lambda: pump() and child.ready, timeout=30, message="the child to say it is ready")
    return child, pump


def _running_a_then_two(sup: Supervisor, gates: _Gates, dsn: str, priority: int):
    """A child running job A (held at its gate) with B and C queued behind
    it, all of this priority: (child, pump, (A, B, C))."""
    ids = enqueue_jobs(dsn, [gates.job(held=True, priority=priority), gates.job(priority=priority),
                             gates.job(priority=priority)])
    child, pump = _ready_child(sup)
    sup.children.assign(child, "gates", _claim(sup, 3), _urgency(sup))
    wait_for(lambda: pump() and child.running_job()[0] == ids[0], timeout=30, message="job A to start")
    return child, pump, tuple(ids)
