"""One child process as the supervisor's table (Children) tracks it, and
the words for a child's death."""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import multiprocess

from ..child import EXIT_HOOK_FAILED
from .inflight import InFlight
from .protocol import ClaimedJob, FrameReader, Outbox, StatusBlock


TAKE_BACK_AFTER_S = 0.1   # jobs queued behind one running longer than this are taken back (at least)


@dataclass
class ChildHandle:
    """One child, as Children tracks it. Others read these fields; only
    Children writes them."""

    slot: int
    process: "multiprocess.Process"
    pid: int
    down_fd: int
    up_fd: int
    reader: FrameReader
    outbox: Outbox
    status: StatusBlock
    recycle_after: Optional[int]
    ready: bool = False
    queue: Optional[str] = None
    inflight: List[InFlight] = field(default_factory=list)
    taken_back: Dict[Tuple[int, int], InFlight] = field(default_factory=dict)  # (id, lease): until reported
    # (id, lease) -> how many stale copies of it the child will still skip
    # and report "released": jobs sent again behind a more urgent one
    overtaken: Dict[Tuple[int, int], int] = field(default_factory=dict)
    tasks_done: int = 0
    rss: Optional[int] = None
    stopping: bool = False
    kill_reason: Optional[Tuple[str, str]] = None  # (outcome, error) for the running job
    cancel_deadline: Optional[float] = None
    next_position: int = 0         # stream position of the next job sent to it
    refill_wanted: bool = False    # half its batch has started: queue the next one
    shortest_timeout: Optional[float] = None  # of the jobs sent since it was last idle
    lowest_priority: int = 0       # the largest priority number sent since it was last idle
    # a job queued behind one that has run longer than this is taken back;
    # set from its queue's usual job time (Children.assign)
    patience: float = TAKE_BACK_AFTER_S

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

    def holds(self, job_id: int) -> bool:
        return any(job.id == job_id for job in self.inflight)

    def holds_less_urgent(self, than: int, urgency: Callable[[ClaimedJob], int]) -> bool:
        """Does it hold queued jobs, each kept for sending again, of which
        one is less urgent than `than`?"""
        if len(self.inflight) < 2 or than >= self.lowest_priority:
            return False  # nothing queued, or nothing less urgent (aging only makes jobs more urgent)
        queued = self.inflight[1:]  # the first may be running
        return all(job.claimed is not None for job in queued) and than < max(
            urgency(job.claimed) for job in queued)


F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20


def grow_pipe(fd: int) -> None:
    """A next batch is written while the child still runs the current one:
    a 1 MB pipe lets the write complete without waiting for the child."""
    try:
        import fcntl

        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, OSError):
        pass  # not Linux, or over the system's limit: refills stay small


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
