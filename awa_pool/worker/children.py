"""The supervisor's table of child processes, and the only writer of their
state: spawn (multiprocess, fork), hand out batches, read their messages,
the deadlines of what they run (timeouts, take-back of queued jobs, cancel
grace), recycling, stopping, reaping, and naming each death.

No database code: what it decides comes back as Outcomes for the supervisor
to route (to the completer) and queue names to wake.
"""
from __future__ import annotations

import logging
import math
import os
import random
import signal
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import multiprocess

from ..child import child_main
from .child_handle import TAKE_BACK_AFTER_S, ChildHandle, describe_exit, grow_pipe
from .inflight import Finished, InFlight
from .protocol import (DONE, LOW, PROGRESS, READY, REQUEST, RUN, STOP, ClaimedJob, FrameReader, Outbox,
                       Outcome, StatusBlock, frames)

log = logging.getLogger(__name__)

RESEND_MAX_BYTES = 64 << 10  # a queued job this small is kept, so a more urgent one can overtake it
OVERDUE_RETRY_S = 0.02    # an overdue check that could not act is retried this soon, not spun on

_fork = multiprocess.get_context("fork")


@dataclass
class Released:
    """Jobs handed back unstarted (outcome "released"): the completer puts
    them back in their queues, which the claimer should look at again."""

    outcomes: List[Outcome] = field(default_factory=list)
    queues: Set[str] = field(default_factory=set)

    def extend(self, other: "Released") -> None:
        self.outcomes.extend(other.outcomes)
        self.queues |= other.queues


@dataclass
class Checked:
    """What one deadline check did: children killed for a timeout, jobs
    taken back from behind long runners."""

    timed_out: int = 0
    released: Released = field(default_factory=Released)


@dataclass
class Reaped:
    """A dead child's last word: outcomes it sent before dying plus one for
    each job it still held, its exit code and the death in words."""

    outcomes: List[Finished]
    exitcode: Optional[int]
    cause: str
    expected: bool              # it exited after being asked to stop
    kill_reason: Optional[Tuple[str, str]]


class Children:
    """All children of one supervisor."""

    def __init__(self, count: int, *, result_max_bytes: int, max_tasks_per_child: Optional[int],
                 max_memory_per_child: Optional[int] = None,
                 inherited_fds: Callable[[], Tuple[Sequence[int], Sequence[int]]] = lambda: ((), ())) -> None:
        self.count = count
        self.result_max_bytes = result_max_bytes
        self.max_tasks_per_child = max_tasks_per_child
        self.max_memory_per_child = max_memory_per_child
        self.inherited_fds = inherited_fds  # () -> (fds to close, db socket fds to neutralize)
        self.by_slot: Dict[int, ChildHandle] = {}
        self.overtakes = 0   # refills whose urgent jobs overtook jobs a child held queued

    # -- lifecycle -----------------------------------------------------------
    def spawn(self, slot: int) -> ChildHandle:
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        status = StatusBlock()
        close_fds, neutralize = self.inherited_fds()
        siblings = [fd for child in self.by_slot.values() for fd in (child.down_fd, child.up_fd)]
        close_in_child = list(close_fds) + siblings + [down_w, up_r]
        process = _fork.Process(
            target=child_main, name=f"awa-pool-child-{slot}", daemon=False,
            args=(os.getpid(), down_r, up_w, status, close_in_child, list(neutralize),
                  self.result_max_bytes))
        with warnings.catch_warnings():
            # Python 3.12+ warns when a process with threads forks: the child
            # inherits their locks in whatever state they were. The completer's
            # and leader's threads own only their database connections and
            # queues; a child never touches those (their sockets are pointed
            # at /dev/null at once), logging re-creates its locks at fork, and
            # the child leaves through os._exit, so nothing of theirs runs.
            warnings.filterwarnings("ignore", message=".*multi-threaded.*fork.*", category=DeprecationWarning)
            process.start()
        os.close(down_r)
        os.close(up_w)
        grow_pipe(down_w)
        os.set_blocking(down_w, False)
        os.set_blocking(up_r, False)
        recycle_after = None
        if self.max_tasks_per_child:
            # jitter so children started together do not all recycle together
            recycle_after = self.max_tasks_per_child + random.randint(0, max(0, self.max_tasks_per_child // 10))
        child = ChildHandle(slot=slot, process=process, pid=process.pid, down_fd=down_w, up_fd=up_r,
                            reader=FrameReader(up_r), outbox=Outbox(down_w), status=status,
                            recycle_after=recycle_after)
        self.by_slot[slot] = child
        return child

    def empty_slots(self) -> List[int]:
        return [slot for slot in range(self.count) if slot not in self.by_slot]

    def current(self, child: ChildHandle) -> bool:
        """Is this handle still the live child of its slot (not reaped)?"""
        return self.by_slot.get(child.slot) is child

    # -- reads -----------------------------------------------------------------
    def all(self) -> List[ChildHandle]:
        return list(self.by_slot.values())

    def idle(self) -> List[ChildHandle]:
        return [child for child in self.by_slot.values() if child.idle]

    def any_busy(self) -> bool:
        return any(child.inflight for child in self.by_slot.values())

    def busy_by_queue(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for child in self.by_slot.values():
            if child.inflight and child.queue:
                counts[child.queue] = counts.get(child.queue, 0) + 1
        return counts

    def inflight_leases(self) -> Dict[int, int]:
        return {job.id: job.lease for child in self.by_slot.values() for job in child.inflight}

    def held_ids(self) -> List[int]:
        return [job.id for child in self.by_slot.values() for job in child.inflight]

    def summary(self) -> Dict[str, object]:
        """Counts for the heartbeat's stats (and `awa-pool top`)."""
        children = self.all()
        return {"children": len(children), "busy": sum(1 for c in children if c.busy),
                "idle": sum(1 for c in children if c.idle), "busy_by_queue": self.busy_by_queue(),
                "rss": {str(c.pid): c.rss for c in children if c.rss}}

    # -- work ----------------------------------------------------------------
    def assign(self, child: ChildHandle, queue: str, jobs: Sequence[ClaimedJob],
               urgency: Optional[Callable[[ClaimedJob], int]] = None, patience: float = 0.0) -> None:
        """Send a batch of claimed jobs to a child (idle, or asking for a
        refill). With `urgency` (a job's effective priority: lower runs
        first), a refill's jobs more urgent than some the child holds queued
        overtake those (see _overtake). `patience`: how long a job of this
        queue may run before the jobs queued behind it are taken back (at
        least TAKE_BACK_AFTER_S)."""
        if urgency is not None:
            jobs = self._overtake(child, jobs, urgency)
        child.queue = queue
        child.patience = max(TAKE_BACK_AFTER_S, patience)
        start = child.next_position
        child.inflight.extend(InFlight(job.id, job.lease, job.kind, job.queue, job.timeout_s, start + i,
                                       job.attempt, job if job.payload_bytes <= RESEND_MAX_BYTES else None)
                              for i, job in enumerate(jobs))
        child.next_position = start + len(jobs)
        child.refill_wanted = False
        child.lowest_priority = max(child.lowest_priority, max(job.priority for job in jobs))
        shortest = min((job.timeout_s for job in jobs if job.timeout_s), default=None)
        if shortest is not None and (child.shortest_timeout is None or shortest < child.shortest_timeout):
            child.shortest_timeout = shortest
        if not self._post(child, *((RUN, frame) for frame in frames(jobs))):
            # It died since it reported idle; the reaper releases these jobs
            # (none of them started) when its sentinel fires.
            log.warning("child %d is gone; %d claimed job(s) go back to the queue", child.pid, len(jobs))

    def _overtake(self, child: ChildHandle, jobs: Sequence[ClaimedJob],
                  urgency: Callable[[ClaimedJob], int]) -> Sequence[ClaimedJob]:
        """A refill arrives while the child still holds queued jobs (a batch
        of up to max_batch_per_child short ones). If it brings a job more
        urgent than one of those, take the queued ones back and return them
        merged with the refill, most urgent first (the held ones first among
        equals): the urgent job then waits only for the job running now, not
        for the whole batch. A held job too big to have been kept
        (RESEND_MAX_BYTES) keeps the order as it is."""
        if not jobs or not child.holds_less_urgent(urgency(jobs[0]), urgency):  # most urgent first
            return jobs
        moved = self.withdraw(child, len(child.inflight))
        if moved:
            self.overtakes += 1
        return sorted(moved + list(jobs), key=urgency)

    def withdraw(self, child: ChildHandle, count: int) -> List[ClaimedJob]:
        """Take back up to the last `count` jobs the child holds queued, to be
        sent again (to it, or to another child: same leases). The child
        skips its copies and reports them released; `overtaken` drops those
        reports. Only jobs kept for sending again (RESEND_MAX_BYTES) can be:
        [] if one is not, or if all have started."""
        if count <= 0 or not child.inflight or any(job.claimed is None for job in child.inflight[1:]):
            return []  # (a count read a moment ago may be 0 now: the child started its next job)
        start = child.inflight[max(0, len(child.inflight) - count)].position
        first = child.status.take_back(start, child.next_position, timeout=0.005)
        if first is None:
            return []
        moved = [job for job in child.inflight if job.position >= first]
        child.inflight = [job for job in child.inflight if job.position < first]
        for job in moved:
            key = (job.id, job.lease)
            child.overtaken[key] = child.overtaken.get(key, 0) + 1
        return [job.claimed for job in moved]

    def fullest(self, eligible: Callable[[str], bool]) -> Tuple[Optional[ChildHandle], int]:
        """The busy child holding the most jobs queued behind the one it
        runs, all of one eligible queue and kept for sending again, and how
        many ((None, 0): none holds any)."""
        best, most = None, 0
        for child in self.by_slot.values():
            if (len(child.inflight) < 2 or child.stopping or child.kill_reason is not None
                    or not eligible(child.inflight[-1].queue)):
                continue
            queued = self.unstarted(child)
            if queued > most and child.running_job()[0] and all(
                    job.claimed is not None and job.queue == child.inflight[-1].queue
                    for job in child.inflight[1:]):
                best, most = child, queued
        return best, most

    def serving(self, queue: str) -> List[ChildHandle]:
        """Children whose latest jobs are of this queue and that may take more."""
        return [child for child in self.by_slot.values()
                if child.inflight and child.inflight[-1].queue == queue and not child.stopping
                and child.kill_reason is None and child.tasks_left > 0]

    def wanting_refill(self) -> Dict[str, List[ChildHandle]]:
        """Children half-way through a batch that may take a next one, by queue."""
        wanting: Dict[str, List[ChildHandle]] = {}
        for child in self.by_slot.values():
            if child.refill_wanted and self.refillable(child):
                wanting.setdefault(child.inflight[-1].queue, []).append(child)
        return wanting

    def refillable(self, child: ChildHandle) -> bool:
        """Busy, and may take more jobs behind those it holds."""
        return bool(child.inflight and not child.stopping and child.kill_reason is None
                    and child.tasks_left > 0 and self._recycle_reason(child) is None)

    @staticmethod
    def unstarted(child: ChildHandle) -> int:
        """How many of the jobs the child holds it has not started yet."""
        last = child.status.last_started()
        return sum(1 for job in child.inflight if job.position > last)

    def _post(self, child: ChildHandle, *messages: tuple) -> bool:
        """Send messages to a child without ever blocking on it (what its
        pipe cannot take now waits in its outbox); False if it is gone."""
        try:
            for message in messages:
                child.outbox.post(message)
        except OSError:  # BrokenPipeError: it died; the reaper will handle it
            child.outbox.clear()
            return False
        return True

    def flush(self, child: ChildHandle) -> None:
        """Its pipe is writable again: send what waits in its outbox."""
        try:
            child.outbox.flush()
        except OSError:
            child.outbox.clear()

    def read(self, child: ChildHandle) -> Tuple[List[Finished], List[tuple]]:
        """Messages from a child: (outcomes reported with their jobs, other messages)."""
        outcomes: List[Finished] = []
        others: List[tuple] = []
        for message in child.reader.read_available():
            tag = message[0]
            if tag == DONE:
                reported = message[1]
                child.rss = message[2]
                # By job and lease: a job taken back can come back to this
                # child under a new lease before the child reports the old
                # one released, and that report must not end the new attempt.
                held = {(job.id, job.lease): job for job in child.inflight}
                for o in reported:
                    key = (o.job_id, o.lease)
                    if o.outcome == "released" and key in child.overtaken:
                        # a stale copy skipped: the job was sent again and the
                        # copy reported after this one is the real attempt
                        left = child.overtaken.pop(key) - 1
                        if left:
                            child.overtaken[key] = left
                        continue
                    outcomes.append(Finished(o, held.pop(key, None) or child.taken_back.pop(key, None)))
                child.inflight = list(held.values())
                if not child.inflight:
                    child.refill_wanted = False  # idle: the planner hands it out again
                    child.shortest_timeout = None
                    child.lowest_priority = 0
                child.tasks_done += sum(1 for o in reported if o.outcome != "released")
            elif tag == READY:
                child.ready = True
            elif tag == LOW:
                child.refill_wanted = True
            elif tag in (PROGRESS, REQUEST):
                others.append(message)
            else:
                log.warning("child %d sent an unknown message %r", child.pid, tag)
        return outcomes, others

    def reply(self, child: ChildHandle, message: tuple) -> None:
        self._post(child, message)

    # -- deadlines -------------------------------------------------------------
    def check(self, now: float) -> Checked:
        """Act on every deadline that passed: kill the child of a job past
        its timeout, take back jobs queued behind one that runs long, kill
        a child whose cancelled handler outlived its grace."""
        checked = Checked()
        for child in self.by_slot.values():
            if not child.busy or child.kill_reason is not None:
                continue
            job_id, started = child.running_job()
            if job_id:
                job = next((j for j in child.inflight if j.id == job_id), None)
                if job is not None and job.timeout_s and now - started > job.timeout_s:
                    checked.timed_out += 1
                    self.kill(child, "timeout", f"timed out after {job.timeout_s:g}s: "
                                                "the child running it was killed")
                    continue
                if now - started > child.patience and child.inflight[-1].id != job_id:
                    checked.released.extend(self.take_back(child, f"job {job_id} runs long"))
            if child.cancel_deadline is not None and now >= child.cancel_deadline:
                child.cancel_deadline = None
                if job_id and child.status.cancel_requested_for(job_id):
                    self.kill(child, "released", "cancelled: the handler did not stop "
                                                 "within the grace period")
        return checked

    def next_check(self, now: float) -> float:
        """When check() may next have something to do: a running job's
        timeout, the take-back of jobs queued behind it, a cancel's grace. A
        job that has not started yet starts no earlier than now, so its
        bounds are never late; waking early only means checking again."""
        due = math.inf
        for child in self.by_slot.values():
            if not child.busy or child.kill_reason is not None:
                continue
            job_id, started = child.running_job()
            if child.shortest_timeout:
                due = min(due, now + child.shortest_timeout)  # jobs still queued in it
                running = next((j for j in child.inflight if j.id == job_id), None) if job_id else None
                if running is not None and running.timeout_s:
                    due = min(due, started + running.timeout_s)
            if job_id and child.inflight[-1].id != job_id:  # jobs queued behind the running one
                due = min(due, started + child.patience)
            elif not job_id and len(child.inflight) > 1:     # between jobs: the next starts from now
                due = min(due, now + child.patience)
            if child.cancel_deadline is not None:
                due = min(due, child.cancel_deadline)
        # Overdue: acted on right after this wait; should acting fail (a
        # take-back finding the child's status locked) it is retried, not spun on.
        return due if due > now else now + OVERDUE_RETRY_S

    def take_back(self, child: ChildHandle, why: str) -> Released:
        """Take back the jobs queued in a child that have not started (behind
        a job that runs long, or at shutdown). The child skips them; a job
        it already started stays."""
        released = Released()
        if not child.inflight:
            return released
        first = child.status.take_back(child.inflight[0].position, child.next_position)
        if first is None:
            return released
        stolen = [job for job in child.inflight if job.position >= first]
        child.inflight = [job for job in child.inflight if job.position < first]
        child.refill_wanted = False
        child.taken_back.update(((job.id, job.lease), job) for job in stolen)
        released.outcomes.extend(Outcome(job.id, job.lease, "released") for job in stolen)
        released.queues.update(job.queue for job in stolen)
        if stolen:
            log.debug("took back %d queued job(s) from child %d (%s)", len(stolen), child.pid, why)
        return released

    def take_back_all(self, why: str) -> Released:
        released = Released()
        for child in self.by_slot.values():
            released.extend(self.take_back(child, why))
        return released

    def request_cancel(self, job_id: int, grace_deadline: float) -> List[ChildHandle]:
        """Tell the children holding this job that it was cancelled (once);
        returns those newly told. Past the grace deadline, check() kills a
        child whose handler still runs it."""
        told = []
        for child in self.by_slot.values():
            if child.holds(job_id) and not child.status.cancel_requested_for(job_id):
                child.status.request_cancel(job_id)
                child.cancel_deadline = grace_deadline
                told.append(child)
        return told

    # -- stopping --------------------------------------------------------------
    def _recycle_reason(self, child: ChildHandle) -> Optional[str]:
        if child.recycle_after is not None and child.tasks_done >= child.recycle_after:
            return f"ran {child.tasks_done} jobs (max tasks per child)"
        limit = self.max_memory_per_child
        if limit is not None and child.rss is not None and child.rss > limit:
            return f"RSS {child.rss // (1024 * 1024)} MB is over the {limit // (1024 * 1024)} MB limit"
        return None

    def recycle_if_due(self, child: ChildHandle) -> Optional[str]:
        """Stop an idle child that ran its quota or grew past the memory
        limit; returns why, or None."""
        reason = self._recycle_reason(child) if child.idle else None
        if reason:
            self.stop(child)
        return reason

    def kill(self, child: ChildHandle, outcome: str, error: str) -> None:
        """SIGKILL a child; its running job gets `outcome` with `error`."""
        if child.kill_reason is None:
            child.kill_reason = (outcome, error)
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self, child: ChildHandle) -> None:
        """Ask a child to exit after its current batch (recycling, shutdown)."""
        child.stopping = True
        self._post(child, (STOP,))

    def stop_idle(self) -> None:
        for child in self.all():
            if not child.busy and not child.stopping:
                self.stop(child)

    def interrupt(self) -> None:
        """Shutdown's last step: kill the children still running jobs (those
        jobs go back as available), stop the others."""
        for child in self.all():
            if child.busy:
                self.kill(child, "interrupted", "interrupted by supervisor shutdown")
            elif not child.stopping:
                self.stop(child)

    def kill_all(self) -> None:
        """Kill every child at once (the supervisor is exiting)."""
        for child in self.by_slot.values():
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def reap(self, child: ChildHandle) -> Reaped:
        """Collect a dead child: outcomes it sent before dying, then one for
        each job it still held: the job it was running gets the crash (or the
        kill reason); jobs it never started are released."""
        outcomes, _ = self.read(child)
        # The sentinel fires as the child's fds close, a moment before it can be reaped.
        child.process.join(timeout=5)
        exitcode = child.process.exitcode
        cause = describe_exit(exitcode)
        running_id, _ = child.running_job()
        for job in child.inflight:
            if job.id == running_id:
                if child.kill_reason is not None:
                    outcome, error = child.kill_reason
                else:
                    outcome, error = "crash", cause
                outcomes.append(Finished(Outcome(job.id, job.lease, outcome, error=error), job))
            else:
                outcomes.append(Finished(Outcome(job.id, job.lease, "released"), job))
        child.inflight = []
        self._close(child)
        del self.by_slot[child.slot]
        return Reaped(outcomes, exitcode, cause, child.stopping, child.kill_reason)

    def _close(self, child: ChildHandle) -> None:
        for fd in (child.down_fd, child.up_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        child.status.close()
        try:
            child.process.close()
        except ValueError:
            pass
