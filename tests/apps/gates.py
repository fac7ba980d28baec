"""A handler that runs until the test opens its gate (a file appears), for
tests that must hold a child inside a job at a chosen point. Each start is
recorded with its lease in a log file named by the job's args."""
from __future__ import annotations

import os
import time

import awa_pool

GATE_QUEUE = "gates"


@awa_pool.task("gate", queue=GATE_QUEUE, pass_context=True)
def gate(ctx, gate: str, log: str, limit_s: float = 60.0) -> dict:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"start {ctx.id} {ctx.lease}\n".encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + limit_s
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise RuntimeError(f"gate {gate} never opened")
        time.sleep(0.005)  # the job's own work: waiting for the test to open its gate
    return {"lease": ctx.lease}
