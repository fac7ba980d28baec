"""A child process: receive jobs over the pipe, run them, send outcomes back.

Holds no queue SQL and never uses a database connection inherited from the
supervisor (their sockets are pointed at /dev/null right after fork). It
leaves only through os._exit, so no inherited object's finalizer can run.
It dies with its supervisor: parent-death signal, plus end of file on the
pipe.
"""
from __future__ import annotations

import ctypes
import json
import os
import random
import select
import signal
import sys
import time
import traceback
from typing import Any, List, Optional, Sequence

from .worker.execute import run as run_job
from .worker.outcomes import EXIT_CRASHED, EXIT_HOOK_FAILED, EXIT_ORPHANED, RELEASED
from .worker.protocol import (DONE, LOW, PROGRESS, READY, REPLY, REQUEST, RUN, STOP, ClaimedJob, Outcome,
                              StatusBlock, recv_blocking, send)
from .core.tasks import child_start_hooks
from .core.tracing import flush as flush_spans

FLUSH_AFTER_S = 0.002   # send buffered outcomes at least this often during a batch
PROGRESS_EVERY_S = 0.05  # at most one progress message per job per interval
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: pipe EOF still ends the child
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(EXIT_ORPHANED)


def _init_process(parent_pid: int, close_fds: Sequence[int], neutralize_fds: Sequence[int]) -> None:
    _die_with_parent(parent_pid)
    # The supervisor manages shutdown; a Ctrl-C or SIGTERM to the process
    # group must not kill a child in the middle of a job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    random.seed()
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    if neutralize_fds:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in neutralize_fds:
            try:
                os.dup2(devnull, fd)  # keeps the fd number taken; drops the socket
            except OSError:
                pass
        os.close(devnull)


class _ProcFile:
    """A /proc/self file kept open: opening it cost more than reading it.
    Open it after fork (before, /proc/self names the parent). A handler may
    close descriptors or get one's number back for a file of its own, so
    each use checks the descriptor still names this file, else reopens."""

    def __init__(self, path: str, flags: int) -> None:
        self.path, self.flags = path, flags
        self.fd = -1
        self.identity = (0, 0)

    def descriptor(self) -> int:
        if self.fd >= 0:
            try:
                st = os.fstat(self.fd)
                if (st.st_dev, st.st_ino) == self.identity:
                    return self.fd
            except OSError:
                pass
        self.fd = os.open(self.path, self.flags | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)
        return self.fd


class MemoryGauge:
    """This process's peak RSS since the last reset and its RSS now (bytes)."""

    def __init__(self) -> None:
        self.status = _ProcFile("/proc/self/status", os.O_RDONLY)
        self.clear_refs = _ProcFile("/proc/self/clear_refs", os.O_WRONLY)

    def read(self) -> "tuple[Optional[int], Optional[int]]":
        try:
            data = os.pread(self.status.descriptor(), 8192, 0)
        except OSError:
            return None, None
        values = []
        for key in (b"VmHWM:", b"VmRSS:"):
            start = data.find(key)
            if start < 0:
                values.append(None)
                continue
            end = data.find(b"kB", start)
            values.append(int(data[start + len(key):end]) * 1024)
        return values[0], values[1]

    def reset_peak(self) -> None:
        try:
            os.write(self.clear_refs.descriptor(), b"5")  # "5" resets VmHWM to the RSS now
        except OSError:
            pass


class PipeChannel:
    """The JobContext's way out: progress and requests over the pipe."""

    def __init__(self, down_fd: int, up_fd: int, status: StatusBlock) -> None:
        self.down_fd = down_fd
        self.up_fd = up_fd
        self.status = status
        self.next_request = 0
        self.stop_requested = False
        self.queued_runs: List[tuple] = []  # RUN messages read while awaiting a reply
        self.last_progress: dict = {}

    def progress(self, job_id: int, lease: int, progress_json: str) -> None:
        now = time.monotonic()
        if now - self.last_progress.get(job_id, 0.0) >= PROGRESS_EVERY_S:
            self.last_progress[job_id] = now
            send(self.up_fd, (PROGRESS, job_id, lease, progress_json))

    def request(self, job_id: int, lease: int, method: str, payload: Any) -> Any:
        self.next_request += 1
        request_id = self.next_request
        send(self.up_fd, (REQUEST, request_id, job_id, lease, method, payload))
        while True:
            message = recv_blocking(self.down_fd)
            if message is None:
                os._exit(0)  # the supervisor is gone
            if message[0] == STOP:
                self.stop_requested = True
            elif message[0] == RUN:
                self.queued_runs.append(message)  # a next batch, queued behind this one
            elif message[0] == REPLY and message[1] == request_id:
                ok, value = message[2], message[3]
                if not ok:
                    raise value if isinstance(value, BaseException) else RuntimeError(str(value))
                return value

    def cancel_requested(self, job_id: int) -> bool:
        return self.status.cancel_requested_for(job_id)


class Reporter:
    """Outcomes on their way to the supervisor. They go out at least every
    FLUSH_AFTER_S during a batch; the last ones of a batch wait for the next
    batch's start when one is already queued, so they share its LOW (or its
    first) write and the supervisor wakes once for both."""

    def __init__(self, up_fd: int, memory: MemoryGauge) -> None:
        self.up_fd = up_fd
        self.memory = memory
        self.pending: List[Outcome] = []
        self.last_flush = time.monotonic()

    def flush(self, *also: tuple) -> None:
        """Send what is pending (the peak RSS since the previous flush rides
        on each outcome) followed by `also`, in one write."""
        if not self.pending:
            if also:
                send(self.up_fd, *also)
            return
        peak, current = self.memory.read()
        outcomes = [o._replace(peak_rss=peak) for o in self.pending] if peak is not None else self.pending
        send(self.up_fd, (DONE, outcomes, current), *also)
        self.pending = []
        self.memory.reset_peak()
        self.last_flush = time.monotonic()


def _next_batch_waiting(channel: PipeChannel) -> bool:
    """Is a message (a next batch, most likely) already there to read?"""
    if channel.queued_runs:
        return True
    readable, _, _ = select.select([channel.down_fd], [], [], 0)
    return bool(readable)


def _run_batch(jobs: List[ClaimedJob], first_position: int, channel: PipeChannel, status: StatusBlock,
               reporter: Reporter, result_max_bytes: int) -> None:
    low_at = len(jobs) // 2  # tell the supervisor when half the batch has started
    if low_at > 0:
        reporter.flush()  # the previous batch's last outcomes, if they waited (else with the LOW)
    for index, job in enumerate(jobs):
        if status.cancel_requested_for(job.id) or not status.start(
                job.id, first_position + index, time.monotonic()):
            # cancelled, or taken back by the supervisor, before it started
            reporter.pending.append(Outcome(job.id, job.lease, RELEASED))
            if index == low_at:
                reporter.flush()  # no LOW to carry what waited for it
            continue
        if index == low_at:
            # after the start: the supervisor counts the jobs not started by
            # the StatusBlock, and one that asks with none left is refilled
            reporter.flush((LOW,))
        outcome = run_job(job, channel, result_max_bytes=result_max_bytes)
        status.clear_running()
        channel.last_progress.pop(job.id, None)
        reporter.pending.append(outcome)
        # The outcome just before the LOW goes with it, at the next job's
        # start: one write, one wake-up of the supervisor for both.
        if (time.monotonic() - reporter.last_flush >= FLUSH_AFTER_S and index < len(jobs) - 1
                and index + 1 != low_at):
            reporter.flush()
    if not _next_batch_waiting(channel):
        reporter.flush()


def child_main(parent_pid: int, down_fd: int, up_fd: int, status: StatusBlock,
               close_fds: Sequence[int], neutralize_fds: Sequence[int], result_max_bytes: int) -> None:
    """Entry point of a forked child. Never returns."""
    try:
        _init_process(parent_pid, close_fds, neutralize_fds)
        channel = PipeChannel(down_fd, up_fd, status)
        try:
            for hook in child_start_hooks():
                hook()
        except BaseException:
            sys.stderr.write("awa_pool child %d: on_child_start hook failed:\n%s"
                             % (os.getpid(), traceback.format_exc()))
            sys.stderr.flush()
            os._exit(EXIT_HOOK_FAILED)
        memory = MemoryGauge()
        memory.reset_peak()  # what the fork and the start hooks used is no job's
        reporter = Reporter(up_fd, memory)
        send(up_fd, (READY, os.getpid()))
        position = 0  # this child's stream position of the next job it receives
        while True:
            if channel.queued_runs:
                message = channel.queued_runs.pop(0)
            elif channel.stop_requested:
                break
            else:
                message = recv_blocking(down_fd)
            if message is None or message[0] == STOP:
                break
            if message[0] == RUN:
                _run_batch(message[1], position, channel, status, reporter, result_max_bytes)
                position += len(message[1])
            else:
                reporter.flush()  # what waited for a next batch that did not come
        reporter.flush()
    except BrokenPipeError:
        pass  # the supervisor is gone
    except BaseException:
        try:
            sys.stderr.write("awa_pool child %d crashed:\n%s" % (os.getpid(), traceback.format_exc()))
            sys.stderr.flush()
        finally:
            os._exit(EXIT_CRASHED)
    try:
        flush_spans()  # os._exit skips the tracing SDK's own flush at exit
        _flush_sentry()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


def _flush_sentry() -> None:
    """Send the events sentry-sdk still queues (its own flush runs at exit,
    which os._exit skips); nothing when no one set it up in this child."""
    sentry = sys.modules.get("sentry_sdk")
    if sentry is None or not getattr(sentry, "is_initialized", lambda: False)():
        return
    try:
        sentry.flush(timeout=2.0)
    except Exception:  # reporting must not keep a child from exiting
        pass


def dumps_progress(progress: Any) -> str:
    return json.dumps(progress, separators=(",", ":"))
