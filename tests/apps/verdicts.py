"""A handler that waits for the test's verdict on each attempt: the test
writes one byte into the FIFO named by the job and its lease (d: done,
f: fail, c: crash), so a test decides how and when every attempt ends.
Each start is recorded (job id, lease, pid) in the log its args name."""
from __future__ import annotations

import os

import awa_pool

QUEUE = "machine"


def verdict_path(folder: str, job_id: int, lease: int) -> str:
    return os.path.join(folder, f"{job_id}-{lease}")


@awa_pool.task("verdict", queue=QUEUE, pass_context=True)
def verdict(ctx, folder: str) -> dict:
    fd = os.open(os.path.join(folder, "starts.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{ctx.id} {ctx.lease} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    path = verdict_path(folder, ctx.id, ctx.lease)
    try:
        os.mkfifo(path)
    except FileExistsError:
        pass
    with open(path, "rb") as fifo:   # blocks until the test opens it to write
        said = fifo.read(1)
    if said == b"f":
        raise RuntimeError("the test said fail")
    if said == b"c":
        os._exit(3)
    return {"lease": ctx.lease}
