"""The pipe framing and the shared status block, across a real fork."""
from __future__ import annotations

import os
import select
import socket
import time

import awa_pool
from awa_pool.child import child_main
from awa_pool.worker.protocol import (DONE, LOW, READY, RUN, STOP, FrameReader, ClaimedJob, Outcome, StatusBlock,
                               encode, recv_blocking, send)


def test_frames_survive_partial_reads_and_big_messages():
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    reader = FrameReader(read_fd)
    big = "x" * 200_000
    pid = os.fork()
    if pid == 0:  # child: write three frames, one larger than the pipe buffer
        try:
            os.close(read_fd)
            send(write_fd, (RUN, [(1, "k")]))
            send(write_fd, (DONE, [Outcome(1, 1, "completed", result=big)], 123))
            send(write_fd, (RUN, []))
        finally:
            os._exit(0)
    os.close(write_fd)
    messages = []
    while not reader.eof:
        select.select([read_fd], [], [], 5)
        messages.extend(reader.read_available())
    os.waitpid(pid, 0)
    assert [m[0] for m in messages] == [RUN, DONE, RUN]
    assert messages[1][1][0].result == big and messages[1][2] == 123
    os.close(read_fd)


def test_blocking_receive_sees_end_of_file():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, encode((RUN, [1, 2])))
    os.close(write_fd)
    assert recv_blocking(read_fd) == (RUN, [1, 2])
    assert recv_blocking(read_fd) is None
    os.close(read_fd)


def test_status_block_is_shared_across_fork():
    status = StatusBlock()
    assert not status.cancel_requested_for(5)
    status.request_cancel(5)
    status.request_cancel(6)  # a second cancel does not erase the first
    pid = os.fork()
    if pid == 0:
        ok = status.cancel_requested_for(5) and status.cancel_requested_for(6)
        ok = ok and status.start(42, 0, 1.5)
        os._exit(0 if ok else 1)
    _, result = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(result) == 0
    assert status.running() == (42, 1.5)
    for job_id in range(10, 10 + StatusBlock.CANCEL_SLOTS):
        status.request_cancel(job_id)
    assert not status.cancel_requested_for(5)  # the ring keeps the latest few
    assert all(status.cancel_requested_for(j) for j in range(10, 10 + StatusBlock.CANCEL_SLOTS))
    status.close()


def test_take_back_never_touches_a_started_job():
    status = StatusBlock()
    assert status.start(1, 0, 0.0)             # position 0 runs
    assert status.take_back(0, 5) == 1         # positions 1..4 come back, never 0
    assert not status.start(2, 1, 0.0)         # the child skips them
    assert not status.start(5, 4, 0.0)
    assert status.start(9, 5, 0.0)             # later positions are untouched
    assert status.take_back(0, 6) is None      # nothing left that has not started
    status.close()


def test_take_back_races_the_child_without_losing_or_doubling_a_job():
    """A child starts positions 0..N-1 as fast as it can while the parent
    takes back a suffix: every position ends started exactly once or taken
    back exactly once."""
    for _ in range(50):
        status = StatusBlock()
        read_fd, write_fd = os.pipe()
        total = 200
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            started = [p for p in range(total) if status.start(p + 1, p, 0.0)]
            os.write(write_fd, ",".join(map(str, started)).encode() or b"-")
            os._exit(0)
        os.close(write_fd)
        first = status.take_back(0, total)
        data = b""
        while True:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            data += chunk
        os.close(read_fd)
        os.waitpid(pid, 0)
        started = set() if data == b"-" else {int(x) for x in data.decode().split(",")}
        taken = set(range(first, total)) if first is not None else set()
        assert started.isdisjoint(taken)
        assert started | taken == set(range(total))
        status.close()


def test_outbox_never_blocks_and_keeps_order_behind_a_full_pipe():
    from awa_pool.worker.protocol import Outbox

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    outbox = Outbox(write_fd)
    big = "y" * 3_000_000  # far more than a pipe holds
    outbox.post((RUN, [big]))
    outbox.post((RUN, ["second"]))
    assert outbox.pending  # the writer came back with most of it still queued
    received = []
    reader = FrameReader(read_fd)
    os.set_blocking(read_fd, False)
    deadline = 200
    while len(received) < 2 and deadline:
        deadline -= 1
        select.select([read_fd], [write_fd] if outbox.pending else [], [], 1)
        outbox.flush()
        received.extend(reader.read_available())
    assert [m[1] for m in received] == [[big], ["second"]]
    assert not outbox.pending
    os.close(read_fd)
    try:
        outbox.post((RUN, ["nobody reads"]))
        raised = False
    except BrokenPipeError:
        raised = True
    assert raised  # a vanished reader is reported, not hidden
    os.close(write_fd)


def test_a_batch_of_big_jobs_is_split_into_run_frames():
    from awa_pool.worker.protocol import RUN_FRAME_BYTES, frames

    def job(job_id, args_bytes):
        return _spec(job_id)._replace(args="x" * args_bytes)

    small = [job(i, 10) for i in range(5)]
    assert frames(small) == [small]
    half = RUN_FRAME_BYTES // 2 + 1
    big = [job(1, half), job(2, half), job(3, 10), job(4, RUN_FRAME_BYTES * 2)]
    split = frames(big)
    assert [[j.id for j in f] for f in split] == [[1], [2, 3], [4]]  # order kept, one oversize job alone


@awa_pool.task("protocol_test_noop")
def _noop() -> None:
    return None


def _spec(job_id: int) -> ClaimedJob:
    return ClaimedJob(id=job_id, kind="protocol_test_noop", queue="q", args="{}", priority=2, attempt=1,
                      max_attempts=25, lease=job_id * 10, timeout_s=None, tags=None, metadata="{}",
                      created_at=0.0, run_at=0.0, progress=None, callback_result=None, batch_id=None)


@awa_pool.task("protocol_test_busy")
def protocol_test_busy(**_):
    end = time.monotonic() + 0.005   # longer than the child's FLUSH_AFTER_S
    while time.monotonic() < end:
        pass


def _child_writes(batches: list) -> list:
    """Run a forked child on these batches, then STOP; returns its writes,
    each a list of (tag,) or (DONE, [job ids]). A SOCK_SEQPACKET socket
    keeps each write a separate packet."""
    down_r, down_w = os.pipe()
    up_child, up_parent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    status = StatusBlock()
    for message in [(RUN, batch) for batch in batches] + [(STOP,)]:
        send(down_w, message)
    pid = os.fork()
    if pid == 0:
        up_parent.close()
        child_main(os.getppid(), down_r, up_child.fileno(), status, [down_w], [], 1 << 20)
    up_child.close()
    os.close(down_r)
    writes = []
    up_parent.settimeout(10)
    while True:
        packet = up_parent.recv(1 << 20)
        if not packet:
            break
        reader_r, reader_w = os.pipe()
        os.write(reader_w, packet)
        os.close(reader_w)
        writes.append([recv_blocking(reader_r)])
        while (more := recv_blocking(reader_r)) is not None:
            writes[-1].append(more)
        os.close(reader_r)
    os.waitpid(pid, 0)
    os.close(down_w)

    def shape(message: tuple) -> tuple:
        return (message[0], [o.job_id for o in message[1]]) if message[0] == DONE else (message[0],)

    return [[shape(m) for m in write] for write in writes]


def test_a_batch_s_last_outcome_shares_a_write_with_the_next_batch_s_low():
    """One job per batch (long jobs): the outcome of each batch but the last
    goes out with the next batch's LOW, so the supervisor wakes once per job."""
    assert _child_writes([[_spec(1)], [_spec(2)]]) == [
        [(READY,)],
        [(LOW,)],                           # batch 1 starts
        [(DONE, [1]), (LOW,)],              # batch 2 starts: job 1's outcome rides along
        [(DONE, [2])],                      # STOP: what waited goes out
    ]


def test_the_outcome_before_a_batch_s_low_shares_its_write():
    """Two jobs per batch, each longer than FLUSH_AFTER_S: the first job's
    outcome waits for the LOW sent as the second starts (one wake-up of the
    supervisor for both), and the second's goes with the next batch's start."""
    busy = [_spec(n)._replace(kind="protocol_test_busy") for n in range(1, 5)]
    assert _child_writes([busy[:2], busy[2:]]) == [
        [(READY,)],
        [(DONE, [1]), (LOW,)],              # job 2 starts: half of batch 1 has started
        [(DONE, [2])],                      # batch 2 starts
        [(DONE, [3]), (LOW,)],
        [(DONE, [4])],                      # STOP
    ]


def test_a_second_take_back_keeps_the_first_range_the_child_has_not_reached():
    """Jobs taken back and sent again (a more urgent job overtook them) sit
    at new positions; a second take-back before the child reached the old
    ones must not let the child start those old copies."""
    status = StatusBlock()
    assert status.start(1, 0, 0.0)             # position 0 runs
    assert status.take_back(0, 5) == 1         # 1..4 taken back, sent again as 5..8
    assert status.take_back(5, 9) == 1         # taking back 5..8: 1..4 stay skipped
    assert not any(status.start(10 + p, p, 0.0) for p in range(1, 9))
    assert status.start(9, 9, 0.0)
    status.close()
