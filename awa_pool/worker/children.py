"""The supervisor's table of child processes, and the only writer of their
state: spawn (multiprocess, fork), send batches, read their messages, the
deadlines of what they run (timeouts, take-back of queued jobs, cancel
grace), recycling, stopping, reaping, and naming each death.

No database code and no placement policy: what goes where is placement's
(placement.py); what this decides comes back as Outcomes for the
supervisor to route (to the completer) and queue names to wake.
"""
from __future__ import annotations

import logging
import math
import os
import random
import signal
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from . import ownership, placement
from .placement import TAKE_BACK_AFTER_S
from .child_handle import ChildHandle, describe_exit, fork_child
from .inflight import Checked, Finished, InFlight, Reaped, Released
from .outcomes import CRASH, RELEASED, TIMEOUT
from .protocol import DONE, LOW, PROGRESS, READY, REQUEST, RUN, STOP, ClaimedJob, Outcome, frames

log = logging.getLogger(__name__)

RESEND_MAX_BYTES = 64 << 10  # a queued job this small is kept, so a more urgent one can overtake it
OVERDUE_RETRY_S = 0.02    # an overdue check that could not act is retried this soon, not spun on
OVERTAKE_LOCK_WAIT_S = 0.005  # an overtake gives up rather than wait longer on a child's status

@ownership.owned
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
        self.overtakes = 0   # batches whose urgent jobs went ahead of jobs a child held queued

    # -- lifecycle -----------------------------------------------------------
    def spawn(self, slot: int) -> ChildHandle:
        close_fds, neutralize = self.inherited_fds()
        siblings = [fd for child in self.by_slot.values() for fd in (child.down_fd, child.up_fd)]
        recycle_after = None
        if self.max_tasks_per_child:
            # jitter so children started together do not all recycle together
            recycle_after = self.max_tasks_per_child + random.randint(0, max(0, self.max_tasks_per_child // 10))
        child = fork_child(slot, list(close_fds) + siblings, list(neutralize), self.result_max_bytes,
                           recycle_after)
        if ownership.owner_of(self) is not None:
            ownership.bind(child)
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

    def serving(self, queue: str) -> List[ChildHandle]:
        """Children whose latest jobs are of this queue and that may take more."""
        return [child for child in self.by_slot.values()
                if child.inflight and child.inflight[-1].queue == queue and self._may_take_more(child)]

    def wanting_refill(self) -> Dict[str, List[ChildHandle]]:
        """Children half-way through a batch that may take a next one, by queue."""
        wanting: Dict[str, List[ChildHandle]] = {}
        for child in self.by_slot.values():
            if child.refill_wanted and child.inflight and self._may_take_more(child) \
                    and self._recycle_reason(child) is None:
                wanting.setdefault(child.inflight[-1].queue, []).append(child)
        return wanting

    @staticmethod
    def _may_take_more(child: ChildHandle) -> bool:
        return not child.stopping and child.kill_reason is None and child.tasks_left > 0

    # -- work ----------------------------------------------------------------
    def assign(self, child: ChildHandle, queue: str, jobs: Sequence[ClaimedJob],
               urgency: Optional[placement.Urgency] = None, patience: float = TAKE_BACK_AFTER_S) -> None:
        """Send a batch of claimed jobs to a child (idle, or asking for a
        refill). With `urgency`, a batch that placement says goes ahead of
        the jobs the child holds queued takes those back and sends them
        again behind it (same leases). `patience`: how long a job of this
        queue may run before the jobs queued behind it are taken back."""
        if urgency is not None and placement.overtakes(child.queued_jobs, child.lowest_priority, jobs, urgency):
            # from the first job it may not have started, if that one was kept to be sent again
            first = child.inflight[0] if child.inflight[0].claimed is not None else child.inflight[1]
            held = self._take_back_queued(child, first.position, OVERTAKE_LOCK_WAIT_S)
            if held:
                self.overtakes += 1
                for job in held:
                    key = (job.id, job.lease)
                    child.overtaken[key] = child.overtaken.get(key, 0) + 1
                jobs = placement.merged([job.claimed for job in held], jobs, urgency)
        child.queue = queue
        child.patience = max(TAKE_BACK_AFTER_S, patience)
        start = child.next_position
        child.inflight.extend(InFlight(job.id, job.lease, job.kind, job.queue, job.timeout_s, start + i,
                                       job.attempt, job if job.payload_bytes <= RESEND_MAX_BYTES else None, job.max_attempts)
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

    def _take_back_queued(self, child: ChildHandle, first: int, wait_s: float) -> List[InFlight]:
        """Stop the child from starting the jobs it holds from stream
        position `first` on (those it started already stay), and strike them
        off its books: the caller decides what becomes of them. [] when it
        started them all, or its status could not be had within wait_s."""
        if not child.inflight:
            return []
        taken_from = child.status.take_back(first, child.next_position, timeout=wait_s)
        if taken_from is None:
            return []
        moved = [job for job in child.inflight if job.position >= taken_from]
        child.inflight = [job for job in child.inflight if job.position < taken_from]
        return moved

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
                outcomes.extend(self._reported(child, message[1]))
                child.rss = message[2]
            elif tag == READY:
                child.ready = True
            elif tag == LOW:
                child.refill_wanted = True
            elif tag in (PROGRESS, REQUEST):
                others.append(message)
            else:
                log.warning("child %d sent an unknown message %r", child.pid, tag)
        return outcomes, others

    @staticmethod
    def _reported(child: ChildHandle, reported: Sequence[Outcome]) -> List[Finished]:
        """Pair a child's outcomes with the jobs on its books, by job and
        lease: a job taken back can come back to this child under a new
        lease before the child reports the old copy, and that report must
        not end the new attempt."""
        finished: List[Finished] = []
        held = {(job.id, job.lease): job for job in child.inflight}
        for o in reported:
            key = (o.job_id, o.lease)
            if o.outcome == RELEASED and key in child.overtaken:
                # a copy it skipped: the job was sent again behind an urgent
                # one, and the copy reported after this one is the real attempt
                left = child.overtaken.pop(key) - 1
                if left:
                    child.overtaken[key] = left
                continue
            finished.append(Finished(o, held.pop(key, None) or child.taken_back.pop(key, None)))
        child.inflight = list(held.values())
        if not child.inflight:
            child.refill_wanted = False  # idle: the planner hands it out again
            child.shortest_timeout = None
            child.lowest_priority = 0
        child.tasks_done += sum(1 for o in reported if o.outcome != RELEASED)
        return finished

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
                    self.kill(child, TIMEOUT, f"timed out after {job.timeout_s:g}s: "
                                              "the child running it was killed")
                    continue
                if now - started > child.patience and child.inflight[-1].id != job_id:
                    checked.released.extend(self.take_back(child, f"job {job_id} runs long"))
            if child.cancel_deadline is not None and now >= child.cancel_deadline:
                child.cancel_deadline = None
                if job_id and child.status.cancel_requested_for(job_id):
                    self.kill(child, RELEASED, "cancelled: the handler did not stop within the grace period")
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
        a job that runs long, or at shutdown): they go back to their queue.
        The child skips them; a job it already started stays."""
        released = Released()
        if not child.inflight:
            return released
        stolen = self._take_back_queued(child, child.inflight[0].position, 0.05)
        child.refill_wanted = False
        child.taken_back.update(((job.id, job.lease), job) for job in stolen)
        released.outcomes.extend(Outcome(job.id, job.lease, RELEASED) for job in stolen)
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
                outcome, error = child.kill_reason or (CRASH, cause)
                outcomes.append(Finished(Outcome(job.id, job.lease, outcome, error=error), job))
            else:
                outcomes.append(Finished(Outcome(job.id, job.lease, RELEASED), job))
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
