"""One child process as the supervisor's table (Children) tracks it: how
it is forked, what is known of it, and the words for its death."""
from __future__ import annotations

import os
import signal
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import multiprocess

from ..child import child_main
from . import ownership
from .inflight import InFlight
from .outcomes import EXIT_HOOK_FAILED
from .placement import TAKE_BACK_AFTER_S
from .protocol import ClaimedJob, FrameReader, Outbox, StatusBlock


_fork = multiprocess.get_context("fork")


@ownership.owned
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

    @property
    def queued_jobs(self) -> List[Optional[ClaimedJob]]:
        """The jobs it holds behind the first one (which may be running), as
        kept to be sent again (None: too big to keep)."""
        return [job.claimed for job in self.inflight[1:]]


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


def fork_child(slot: int, close_fds: Sequence[int], neutralize_fds: Sequence[int], result_max_bytes: int,
               recycle_after: Optional[int]) -> ChildHandle:
    """Fork a child with its two pipes and status block. `close_fds`: fds
    the child closes at once (its siblings' pipes, the signal pipe);
    `neutralize_fds`: the supervisor's database sockets, which it points at
    /dev/null (closing them would end the supervisor's sessions)."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    status = StatusBlock()
    process = _fork.Process(
        target=child_main, name=f"awa-pool-child-{slot}", daemon=False,
        args=(os.getpid(), down_r, up_w, status, list(close_fds) + [down_w, up_r], list(neutralize_fds),
              result_max_bytes))
    with warnings.catch_warnings():
        # Python 3.12+ warns when a process with threads forks: the child
        # inherits their locks in whatever state they were. The completer's,
        # leader's and watchdog's threads own only their database
        # connections; a child never touches those (their sockets are pointed
        # at /dev/null at once), logging re-creates its locks at fork, and the
        # child leaves through os._exit, so nothing of theirs runs.
        warnings.filterwarnings("ignore", message=".*multi-threaded.*fork.*", category=DeprecationWarning)
        process.start()
    os.close(down_r)
    os.close(up_w)
    grow_pipe(down_w)
    os.set_blocking(down_w, False)
    os.set_blocking(up_r, False)
    return ChildHandle(slot=slot, process=process, pid=process.pid, down_fd=down_w, up_fd=up_r,
                       reader=FrameReader(up_r), outbox=Outbox(down_w), status=status,
                       recycle_after=recycle_after)
