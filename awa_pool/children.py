"""The supervisor's table of child processes: spawn (multiprocess, fork),
hand out batches, read their messages, reap them and name each death.

No database code: outcomes go back to the supervisor, which owns the queue.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import multiprocess

from .child import EXIT_HOOK_FAILED, child_main
from .protocol import (DONE, LOW, PROGRESS, READY, REQUEST, RUN, RUN_FRAME_BYTES, STOP, FrameReader,
                       Outbox, Outcome, StatusBlock)

log = logging.getLogger(__name__)

_fork = multiprocess.get_context("fork")


@dataclass
class InFlight:
    """A job handed to a child and not yet reported back."""

    id: int
    lease: int
    kind: str
    queue: str
    timeout_s: Optional[float]
    position: int  # in the child's stream of jobs (see StatusBlock.skip)


@dataclass
class ChildHandle:
    slot: int
    process: "multiprocess.Process"
    pid: int
    down_fd: int
    up_fd: int
    reader: FrameReader
    outbox: Outbox
    status: StatusBlock
    started_at: float
    recycle_after: Optional[int]
    ready: bool = False
    queue: Optional[str] = None
    inflight: List[InFlight] = field(default_factory=list)
    tasks_done: int = 0
    rss: Optional[int] = None
    stopping: bool = False
    kill_reason: Optional[Tuple[str, str]] = None  # (outcome, error) for the running job
    cancel_deadline: Optional[float] = None
    next_position: int = 0         # stream position of the next job sent to it
    refill_wanted: bool = False    # half its batch has started: queue the next one
    shortest_timeout: Optional[float] = None  # of the jobs sent since it was last idle

    @property
    def tasks_left(self) -> int:
        """Jobs this child may still take before it is recycled."""
        if self.recycle_after is None:
            return 1 << 30
        return self.recycle_after - self.tasks_done - len(self.inflight)

    @property
    def busy(self) -> bool:
        return bool(self.inflight)

    @property
    def idle(self) -> bool:
        return self.ready and not self.inflight and not self.stopping

    def running_job(self) -> Tuple[int, float]:
        """(job id, monotonic start) of the job running now, (0, _) if none."""
        return self.status.running()


F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20


def _grow_pipe(fd: int) -> None:
    """A next batch is written while the child still runs the current one:
    a 1 MB pipe lets the write complete without waiting for the child."""
    try:
        import fcntl

        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, OSError):
        pass  # not Linux, or over the system's limit: refills stay small


def _frames(rows: Sequence[tuple]) -> List[list]:
    """Split a batch into RUN frames of at most ~RUN_FRAME_BYTES of job
    payload each (a frame always holds at least one job)."""
    frames: List[list] = [[]]
    size = 0
    for row in rows:
        # args, metadata, progress and callback result: the JSON texts
        row_bytes = sum(len(row[i] or "") for i in (3, 10, 13, 14))
        if frames[-1] and size + row_bytes > RUN_FRAME_BYTES:
            frames.append([])
            size = 0
        frames[-1].append(row)
        size += row_bytes
    return frames


def describe_exit(exitcode: Optional[int]) -> str:
    """A child's death, in words (for job errors and logs)."""
    if exitcode is None:
        return "child process vanished"
    if exitcode < 0:
        signum = -exitcode
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        text = f"child process killed by {name} ({signum})"
        if signum == signal.SIGKILL:
            text += " (if no one sent it, the kernel's out-of-memory killer did)"
        elif signum == signal.SIGSEGV:
            text += " (segmentation fault in the handler or a C extension)"
        return text
    if exitcode == EXIT_HOOK_FAILED:
        return "child process exited: an on_child_start hook failed"
    return f"child process exited with code {exitcode}"


class Children:
    """All children of one supervisor."""

    def __init__(self, count: int, *, result_max_bytes: int, max_tasks_per_child: Optional[int],
                 inherited_fds: Callable[[], Tuple[Sequence[int], Sequence[int]]]) -> None:
        self.count = count
        self.result_max_bytes = result_max_bytes
        self.max_tasks_per_child = max_tasks_per_child
        self.inherited_fds = inherited_fds  # () -> (fds to close, db socket fds to neutralize)
        self.by_slot: Dict[int, ChildHandle] = {}
        self.spawned = 0
        self.recycled = 0

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
        process.start()
        os.close(down_r)
        os.close(up_w)
        _grow_pipe(down_w)
        os.set_blocking(down_w, False)
        os.set_blocking(up_r, False)
        recycle_after = None
        if self.max_tasks_per_child:
            # jitter so children started together do not all recycle together
            recycle_after = self.max_tasks_per_child + random.randint(0, max(0, self.max_tasks_per_child // 10))
        child = ChildHandle(slot=slot, process=process, pid=process.pid, down_fd=down_w, up_fd=up_r,
                            reader=FrameReader(up_r), outbox=Outbox(down_w), status=status,
                            started_at=time.monotonic(),
                            recycle_after=recycle_after)
        self.by_slot[slot] = child
        self.spawned += 1
        return child

    def all(self) -> List[ChildHandle]:
        return list(self.by_slot.values())

    def idle(self) -> List[ChildHandle]:
        return [child for child in self.by_slot.values() if child.idle]

    def busy_by_queue(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for child in self.by_slot.values():
            if child.inflight and child.queue:
                counts[child.queue] = counts.get(child.queue, 0) + 1
        return counts

    def inflight_leases(self) -> Dict[int, int]:
        return {job.id: job.lease for child in self.by_slot.values() for job in child.inflight}

    # -- work ----------------------------------------------------------------
    def assign(self, child: ChildHandle, queue: str, rows: Sequence[tuple],
               timeouts: Sequence[Optional[float]]) -> None:
        """Send a batch of claimed rows (awa.claim columns) to an idle child;
        `timeouts` are the effective per-job timeouts (row or task default)."""
        child.queue = queue
        start = child.next_position
        child.inflight.extend(InFlight(row[0], row[7], row[1], row[2], timeout, start + i)
                              for i, (row, timeout) in enumerate(zip(rows, timeouts)))
        child.next_position = start + len(rows)
        child.refill_wanted = False
        shortest = min((t for t in timeouts if t), default=None)
        if shortest is not None and (child.shortest_timeout is None or shortest < child.shortest_timeout):
            child.shortest_timeout = shortest
        if not self.post(child, *((RUN, frame) for frame in _frames(rows))):
            # It died since it reported idle; the reaper releases these jobs
            # (none of them started) when its sentinel fires.
            log.warning("child %d is gone; %d claimed job(s) go back to the queue", child.pid, len(rows))

    def post(self, child: ChildHandle, *messages: tuple) -> bool:
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

    def read(self, child: ChildHandle) -> Tuple[List[Outcome], List[tuple]]:
        """Messages from a child: (outcomes reported, other messages)."""
        outcomes: List[Outcome] = []
        others: List[tuple] = []
        for message in child.reader.read_available():
            tag = message[0]
            if tag == DONE:
                reported = message[1]
                child.rss = message[2]
                done_ids = {o.job_id for o in reported}
                child.inflight = [job for job in child.inflight if job.id not in done_ids]
                if not child.inflight:
                    child.refill_wanted = False  # idle: the planner hands it out again
                    child.shortest_timeout = None
                child.tasks_done += sum(1 for o in reported if o.outcome != "released")
                outcomes.extend(reported)
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
        self.post(child, message)

    def kill(self, child: ChildHandle, outcome: str, error: str) -> None:
        """SIGKILL a child; its running job gets `outcome` with `error`."""
        if child.kill_reason is None:
            child.kill_reason = (outcome, error)
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self, child: ChildHandle) -> None:
        """Ask an idle child to exit (recycling, shutdown)."""
        child.stopping = True
        self.post(child, (STOP,))

    def should_recycle(self, child: ChildHandle, max_memory: Optional[int]) -> Optional[str]:
        if child.recycle_after is not None and child.tasks_done >= child.recycle_after:
            return f"ran {child.tasks_done} jobs (max tasks per child)"
        if max_memory is not None and child.rss is not None and child.rss > max_memory:
            return f"RSS {child.rss // (1024 * 1024)} MB is over the {max_memory // (1024 * 1024)} MB limit"
        return None

    def is_dead(self, child: ChildHandle) -> bool:
        return child.process.exitcode is not None

    def reap(self, child: ChildHandle) -> Tuple[List[Outcome], Optional[int], str]:
        """Collect a dead child: outcomes it sent before dying, then one for
        each job it still held: the job it was running gets the crash (or the
        kill reason); jobs it never started are released. Returns (outcomes,
        exit code, description)."""
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
                outcomes.append(Outcome(job.id, job.lease, outcome, error=error))
            else:
                outcomes.append(Outcome(job.id, job.lease, "released"))
        child.inflight = []
        self._close(child)
        del self.by_slot[child.slot]
        return outcomes, exitcode, cause

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

    def signal_all(self, signum: int) -> None:
        for child in self.by_slot.values():
            try:
                os.kill(child.pid, signum)
            except ProcessLookupError:
                pass

    def sentinels(self) -> Iterable[Tuple[int, ChildHandle]]:
        for child in self.by_slot.values():
            yield child.process.sentinel, child
