"""The lease protocol under a stateful property test: hypothesis drives one
real supervisor (its children, claims, placement and settling, against a
real database) through random interleavings of claims, refills, each
child's outcomes (done, failed, crashed), take-backs, overtakes (priority-1
jobs behind queued ones), cancels, timeouts, SIGKILLed children, ended
database sessions, rescues and reconciles, and after every step checks:

- a job's lease is held by at most one child;
- every job the database runs under this supervisor is on exactly one
  child's books under the database's lease (or its outcome is still being
  written: the check first lets the completer write everything);
- a child holds a stale lease only for a job the test rescued or
  cancelled under it, and its outcome changes nothing;
- no attempt (job and lease) starts twice, and no job is lost.

It found the take-back pairing defect (fixed in 0deb1bd) when run on the
code before that commit: see the resolving note of issue 37."""
from __future__ import annotations

import errno
import itertools
import os
import time
from pathlib import Path
from typing import Dict, Set, Tuple

import psycopg2
import pytest
from hypothesis import HealthCheck, Verbosity, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import awa_pool
from awa_pool import Job
from helpers import wait_for

TERMINAL = {"completed", "failed", "cancelled"}
ROLES = ("main", "listen", "completer", "leader")
EXAMPLES = int(os.environ.get("AWA_MACHINE_EXAMPLES", "100"))
STEPS = int(os.environ.get("AWA_MACHINE_STEPS", "25"))
VERBOSITY = Verbosity.verbose if os.environ.get("AWA_MACHINE_VERBOSE") else Verbosity.normal
_queues = itertools.count(1)


def make_machine(dsn: str, folder: Path, driver_class):
    class ProtocolMachine(RuleBasedStateMachine):
        @initialize()
        def start(self) -> None:
            self.queue = f"machine-{os.getpid()}-{next(_queues)}"
            self.folder = folder / self.queue
            self.folder.mkdir()
            self.conn = psycopg2.connect(dsn)
            self.conn.autocommit = True
            self.driver = driver_class(dsn, self.queue)
            self.enqueued: Set[int] = set()
            self.stale: Set[Tuple[int, int]] = set()   # (job, lease) rescued or cancelled under a child
            wait_for(lambda: self._turn() and all(child.ready for child in self.driver.children()), timeout=30,
                     message="both children to be ready")
            # every interleaving starts from two busy children with batches queued
            self.enqueue(count=8, priority=2, timeout=None)
            wait_for(lambda: self._turn() and len(self.driver.books()) >= 2, timeout=10,
                     message="the first claims")

        def teardown(self) -> None:
            if hasattr(self, "driver"):
                self.driver.close()
                self.conn.close()

        def _turn(self) -> bool:
            self.driver.turn()
            return True

        # -- what happens ------------------------------------------------------------
        @rule(count=st.integers(1, 6), priority=st.sampled_from([1, 2, 2, 3]), timeout=st.sampled_from([None, 5.0]))
        def enqueue(self, count: int, priority: int, timeout) -> None:
            jobs = [Job("verdict", {"folder": str(self.folder)}, queue=self.queue, priority=priority,
                        timeout=timeout, max_attempts=1000) for _ in range(count)]
            self.enqueued.update(awa_pool.enqueue_many(self.conn, jobs))

        @rule(turns=st.integers(1, 3))
        def loop_turns(self, turns: int) -> None:
            for _ in range(turns):
                self.driver.turn()

        @rule(slot=st.integers(0, 1), said=st.sampled_from("ddfc"))
        def decide(self, slot: int, said: str) -> None:
            """The job a child runs now ends as the test says."""
            child = self._child(slot)
            job_id = child and self.driver.running(child)
            if job_id and self._tell(job_id, child.pid, said):
                # the loop reads what the child reports (or reaps it): turns
                # until its status moves on, for at most a second
                deadline = time.monotonic() + 1.0
                while self.driver.running(child) == job_id and time.monotonic() < deadline:
                    self.driver.turn()
                self.driver.turn()

        @rule(slot=st.integers(0, 1), count=st.integers(1, 3))
        def refill(self, slot: int, count: int) -> None:
            child = self._child(slot)
            if child is not None:
                self.driver.refill(child, count)

        @rule(slot=st.integers(0, 1))
        def take_back(self, slot: int) -> None:
            child = self._child(slot)
            if child is not None:
                self.driver.take_back(child)

        @rule(seconds=st.sampled_from([2.0, 6.0]))
        def time_passes(self, seconds: float) -> None:
            """Deadlines a turn this much later would find: cancel grace (1 s), timeouts (5 s)."""
            self.driver.later(seconds)

        @rule(slot=st.integers(0, 1))
        def sigkill_child(self, slot: int) -> None:
            child = self._child(slot)
            if child is not None:
                try:
                    os.kill(child.pid, 9)
                except ProcessLookupError:
                    pass

        @rule(role=st.sampled_from(ROLES))
        def end_a_session(self, role: str) -> None:
            pid = self.driver.backend_pid(role)
            if pid:
                with self.conn.cursor() as cur:
                    cur.execute("SELECT pg_terminate_backend(%s)", (pid,))

        @rule(pick=st.integers(0, 1 << 16), rescue=st.booleans())
        def rescue_or_cancel(self, pick: int, rescue: bool) -> None:
            """The leader's rescue (the path of every rescue: awa.finish_attempt)
            or an operator's cancel takes a job a child holds. (Every draw has
            the same shape whatever the books hold: the processes' timing
            must not change what hypothesis draws.)"""
            held = sorted(self.driver.books())
            if not held:
                return
            job_id, lease = held[pick % len(held)]
            with self.conn.cursor() as cur:
                if rescue:
                    cur.execute("SELECT awa.finish_attempt(%s, %s, 'deadline', 'rescued by the test')",
                                (job_id, lease))
                else:
                    cur.execute("SELECT awa.cancel_job(%s)", (job_id,))
            self.stale.add((job_id, lease))

        @rule()
        def reconcile(self) -> None:
            self.driver.reconcile()

        # -- what must hold ------------------------------------------------------------
        @invariant()
        def the_books_agree_with_the_database(self) -> None:
            books = self.driver.books()   # asserts no (job, lease) is on two children's books
            assert self.driver.settle(), f"the completer could not write {self.driver.pending()} outcome(s)"
            books = self.driver.books()
            with self.conn.cursor() as cur:
                cur.execute("SELECT id, state::text, lease, supervisor_id FROM awa.jobs WHERE queue = %s",
                            (self.queue,))
                rows = {row[0]: row[1:] for row in cur.fetchall()}
            assert set(rows) == self.enqueued, f"jobs lost: {sorted(self.enqueued - set(rows))}"
            current = {job_id: lease for (job_id, lease) in books if rows[job_id][1] == lease}
            holders: Dict[int, int] = {}
            for job_id, lease in books:
                if rows[job_id][1] == lease:
                    assert job_id not in holders, f"job {job_id}: two children hold its current lease"
                    holders[job_id] = lease
            for job_id, (state, lease, owner) in rows.items():
                if state == "running" and owner == self.driver.supervisor_id:
                    assert current.get(job_id) == lease, (
                        f"job {job_id} runs under lease {lease} in the database, but no child holds it: {books}")
            for job_id, lease in books:
                state, db_lease, _ = rows[job_id]
                if (job_id, lease) not in self.stale:
                    assert state == "running" and db_lease == lease, (
                        f"a child holds job {job_id} lease {lease}; the database has it {state} "
                        f"under lease {db_lease}")
            attempts = [start[:2] for start in self._starts()]
            assert len(attempts) == len(set(attempts)), "an attempt (job, lease) started twice"

        # -- helpers -------------------------------------------------------------------
        def _child(self, slot: int):
            children = self.driver.children()
            return children[slot] if slot < len(children) else None

        def _starts(self):
            """(job id, lease, pid) of every attempt started, in order."""
            log = self.folder / "starts.log"
            lines = log.read_text().splitlines() if log.exists() else []
            return [tuple(map(int, line.split())) for line in lines]

        def _tell(self, job_id: int, pid: int, said: str) -> bool:
            """Write the verdict into the FIFO of the attempt this child runs,
            once its handler opened it for reading."""
            deadline = time.monotonic() + 1.0
            while True:
                leases = [lease for job, lease, by in self._starts() if job == job_id and by == pid]
                try:
                    if leases:
                        fd = os.open(self.folder / f"{job_id}-{leases[-1]}", os.O_WRONLY | os.O_NONBLOCK)
                        break
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ENXIO):
                        raise
                if time.monotonic() > deadline:
                    return False   # it never got there (it died meanwhile)
                time.sleep(0.002)   # the handler opens its FIFO within milliseconds of starting
            try:
                os.write(fd, said.encode())
            finally:
                os.close(fd)
            return True

    return ProtocolMachine


@pytest.mark.timeout(240)
def test_the_lease_protocol_holds_in_every_interleaving(dsn, tmp_path) -> None:
    from protocol_driver import Driver

    machine = make_machine(dsn, tmp_path, Driver)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=False,
        suppress_health_check=list(HealthCheck), print_blob=True, verbosity=VERBOSITY))
