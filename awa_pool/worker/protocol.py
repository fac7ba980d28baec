"""The pipe protocol between a supervisor and its children. No I/O policy
here beyond framing: messages are tuples, pickled (pipes are private to one
supervisor and its own forks), each frame prefixed with its length.

Down (supervisor -> child):
    (RUN, [job, ...])                 run these jobs in order (a batch may come
                                      in several RUN frames, run in order)
    (REPLY, request_id, ok, value)    answer to a REQUEST
    (STOP,)                           exit after the current batch
Up (child -> supervisor):
    (READY, pid)                      start hooks ran; ready for work
    (DONE, [outcome, ...], rss)       outcomes in run order, child RSS now
    (PROGRESS, job_id, lease, json)   latest progress of a running job
    (REQUEST, request_id, job_id, lease, method, payload)
    (LOW,)                            half of the current batch has started:
                                      a next batch may be queued behind it
"""
from __future__ import annotations

import collections
import errno
import os
import pickle
import struct
from typing import Any, Deque, List, NamedTuple, Optional, Sequence, Tuple

RUN, REPLY, STOP = 1, 2, 3
READY, DONE, PROGRESS, REQUEST, LOW = 10, 11, 12, 13, 14

_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 30          # PostgreSQL's largest field: one job always fits
RUN_FRAME_BYTES = 32 << 20   # a batch of big jobs goes down in several RUN frames


class ClaimedJob(NamedTuple):
    """A claimed job, as the supervisor tracks it and the child runs it.

    Built in one place only, `fetcher.claim`, from awa.claim's columns, whose
    names must equal these fields (checked there): a column added to the
    claim cannot silently shift what every reader sees.
    """

    id: int
    kind: str
    queue: str
    args: str            # JSON text: the child parses it, not the supervisor
    priority: int
    attempt: int
    max_attempts: int
    lease: int
    timeout_s: Optional[float]   # effective: the job's own, else its task's declared one
    tags: Optional[List[str]]
    metadata: str        # JSON text
    created_at: float    # epoch seconds
    run_at: float
    progress: Optional[str]
    callback_result: Optional[str]
    batch_id: Optional[int]

    @property
    def payload_bytes(self) -> int:
        """Size of its JSON texts: what it weighs in a RUN frame."""
        return (len(self.args or "") + len(self.metadata or "") + len(self.progress or "")
                + len(self.callback_result or ""))


def frames(jobs: Sequence[ClaimedJob]) -> List[List[ClaimedJob]]:
    """Split a batch into RUN frames of at most ~RUN_FRAME_BYTES of job
    payload each (a frame always holds at least one job)."""
    split: List[List[ClaimedJob]] = [[]]
    size = 0
    for job in jobs:
        weight = job.payload_bytes
        if split[-1] and size + weight > RUN_FRAME_BYTES:
            split.append([])
            size = 0
        split[-1].append(job)
        size += weight
    return split


class Outcome(NamedTuple):
    """How one attempt ended. `outcome` is one of the SQL outcome names."""

    job_id: int
    lease: int
    outcome: str                     # completed, failed, fatal, retry, snooze, cancel, wait, ...
    result: Optional[str] = None     # JSON text of the handler's return value
    error: Optional[str] = None
    traceback: Optional[str] = None
    delay_s: Optional[float] = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss: Optional[int] = None
    progress: Optional[str] = None   # JSON text of the last progress


def encode(message: Tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[written:]


def send(fd: int, *messages: Tuple[Any, ...]) -> None:
    """Write messages in one write: the reader wakes once for all of them."""
    write_all(fd, b"".join([encode(message) for message in messages]))


class Outbox:
    """Messages for a non-blocking pipe. What the pipe does not take now
    waits here, in order, and goes out when the pipe is writable again: the
    supervisor never blocks on a busy child (blocked on a full pipe while
    that child blocks sending it outcomes, both would wait forever)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.chunks: Deque[memoryview] = collections.deque()

    @property
    def pending(self) -> bool:
        return bool(self.chunks)

    def post(self, message: Tuple[Any, ...]) -> None:
        """Queue a message and write what the pipe takes now. BrokenPipeError
        (the reader is gone) goes to the caller."""
        self.chunks.append(memoryview(encode(message)))
        self.flush()

    def flush(self) -> None:
        chunks = self.chunks
        while chunks:
            try:
                written = os.write(self.fd, chunks[0])
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            if written == len(chunks[0]):
                chunks.popleft()
            else:
                chunks[0] = chunks[0][written:]

    def clear(self) -> None:
        self.chunks.clear()


def _read_exact(fd: int, size: int) -> Optional[bytes]:
    chunks = []
    while size:
        try:
            chunk = os.read(fd, min(size, 1 << 20))
        except InterruptedError:
            continue
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def recv_blocking(fd: int) -> Optional[Tuple[Any, ...]]:
    """Read one message; None at end of file (the other side is gone)."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes exceeds the protocol limit")
    body = _read_exact(fd, size)
    if body is None:
        return None
    return pickle.loads(body)


class FrameReader:
    """Non-blocking reader: feed it what the pipe has, get whole messages."""

    __slots__ = ("fd", "buffer", "eof", "scratch")

    READ_BYTES = 1 << 18

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.eof = False
        # Reads land in this reused buffer: os.read would allocate (and
        # shrink) a fresh bytes object of the full read size on every call.
        self.scratch = memoryview(bytearray(self.READ_BYTES))

    def read_available(self) -> List[Tuple[Any, ...]]:
        """Drain the pipe (it must be non-blocking) and parse complete frames."""
        while True:
            try:
                got = os.readv(self.fd, [self.scratch])
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EIO):
                    self.eof = True
                    break
                raise
            if not got:
                self.eof = True
                break
            self.buffer += self.scratch[:got]
            if got < self.READ_BYTES:
                break
        return self._parse()

    def _parse(self) -> List[Tuple[Any, ...]]:
        messages = []
        buffer = self.buffer
        offset = 0
        size_len = _HEADER.size
        while len(buffer) - offset >= size_len:
            (size,) = _HEADER.unpack_from(buffer, offset)
            end = offset + size_len + size
            if len(buffer) < end:
                break
            messages.append(pickle.loads(bytes(buffer[offset + size_len:end])))
            offset = end
        if offset:
            del buffer[:offset]
        return messages


class StatusBlock:
    """A few words of memory shared between a supervisor and one child.

    The child records which job it is running, since when, and that job's
    position in its stream of jobs (0, 1, 2...): the supervisor enforces
    timeouts and names the victim of a crash without a message per job. The
    supervisor posts cancel requests, and can take back queued jobs that
    have not started: the child skips the positions in [skip_from, skip_to).
    A lock makes the child's "is it skipped? then I start it" one step, so
    a job is either taken back or started, never both.
    """

    CANCEL_SLOTS = 4
    SIZE = 48 + 8 * CANCEL_SLOTS
    _WORD = struct.Struct("q")
    _STARTED = struct.Struct("d")
    # offset 0: job id running now (0 = none)      8: its start, time.monotonic()
    # offset 16: skip_from                          24: skip_to
    # offset 32: cancel requests posted so far     40: stream position last started
    # offsets 48..: job ids whose cancel was requested (a small ring, so a
    # second cancel in one batch does not erase the first)

    def __init__(self) -> None:
        import mmap
        import multiprocessing

        self.memory = mmap.mmap(-1, self.SIZE)  # anonymous and shared across fork
        self._WORD.pack_into(self.memory, 40, -1)
        self.lock = multiprocessing.get_context("fork").Lock()

    # -- child side ------------------------------------------------------------
    def start(self, job_id: int, position: int, started: float) -> bool:
        """Start the job at this stream position unless it was taken back."""
        with self.lock:
            memory = self.memory
            if self._WORD.unpack_from(memory, 16)[0] <= position < self._WORD.unpack_from(memory, 24)[0]:
                return False
            self._STARTED.pack_into(memory, 8, started)
            self._WORD.pack_into(memory, 0, job_id)
            self._WORD.pack_into(memory, 40, position)
            return True

    def clear_running(self) -> None:
        self._WORD.pack_into(self.memory, 0, 0)

    # -- supervisor side -------------------------------------------------------
    def running(self) -> Tuple[int, float]:
        return self._WORD.unpack_from(self.memory, 0)[0], self._STARTED.unpack_from(self.memory, 8)[0]

    def last_started(self) -> int:
        """The stream position of the last job the child started (-1: none yet)."""
        return self._WORD.unpack_from(self.memory, 40)[0]

    def take_back(self, first: int, end: int, timeout: float = 0.05) -> Optional[int]:
        """Take back the not-yet-started positions from `first` to `end`:
        returns the first position taken back (jobs from there on will be
        skipped: those of an earlier take-back the child has not reached
        yet stay skipped), or None if nothing could be (all started, or the
        lock is unavailable: a child killed while holding it)."""
        if not self.lock.acquire(timeout=timeout):
            return None
        try:
            memory, word = self.memory, self._WORD
            last_started = word.unpack_from(memory, 40)[0]
            start = max(first, last_started + 1)
            if start >= end:
                return None
            skip_from, skip_to = word.unpack_from(memory, 16)[0], word.unpack_from(memory, 24)[0]
            if skip_from < skip_to and last_started < skip_to:
                # The child has not passed an earlier range yet: keep skipping
                # it (every position between the two is unstarted too, since
                # the child starts positions in order).
                start = min(start, skip_from)
            word.pack_into(memory, 24, end)
            word.pack_into(memory, 16, start)
            return start
        finally:
            self.lock.release()

    def request_cancel(self, job_id: int) -> None:
        slot = self._WORD.unpack_from(self.memory, 32)[0]
        self._WORD.pack_into(self.memory, 48 + 8 * (slot % self.CANCEL_SLOTS), job_id)
        self._WORD.pack_into(self.memory, 32, slot + 1)

    def cancel_requested_for(self, job_id: int) -> bool:
        memory = self.memory
        if not self._WORD.unpack_from(memory, 32)[0]:
            return False  # no cancel was ever posted to this child
        return any(self._WORD.unpack_from(memory, 48 + 8 * i)[0] == job_id
                   for i in range(self.CANCEL_SLOTS))

    def close(self) -> None:
        self.memory.close()
