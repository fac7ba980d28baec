"""The pipe framing and the shared status block, across a real fork."""
from __future__ import annotations

import os

from awa_pool.protocol import DONE, RUN, FrameReader, Outcome, StatusBlock, encode, recv_blocking, send


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
        import select

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
        code = 0 if status.cancel_requested_for(5) and status.cancel_requested_for(6) else 1
        status.set_running(42, 1.5)
        status.set_stop_after(41)
        os._exit(code)
    _, result = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(result) == 0
    assert status.running() == (42, 1.5)
    assert status.stop_after() == 41
    for job_id in range(10, 10 + StatusBlock.CANCEL_SLOTS):
        status.request_cancel(job_id)
    assert not status.cancel_requested_for(5)  # the ring keeps the latest few
    assert all(status.cancel_requested_for(j) for j in range(10, 10 + StatusBlock.CANCEL_SLOTS))
    status.close()
