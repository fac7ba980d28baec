"""Handlers for the pool tests. Each records what happened in a file under
$AWA_TEST_LOG_DIR (one line per execution) so tests can count executions
without touching the queue's tables."""
from __future__ import annotations

import ctypes
import os
import signal
import time

import awa_pool

def record(kind: str, job_id: int, extra: str = "") -> None:
    log_dir = os.environ.get("AWA_TEST_LOG_DIR")   # read each time: in-process pools of several tests
    if log_dir:
        fd = os.open(os.path.join(log_dir, f"exec-{os.getpid()}.log"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{kind} {job_id} {os.getpid()} {time.time():.6f} {extra}\n".encode())
        finally:
            os.close(fd)


def _ctx():
    return awa_pool.current_context()


@awa_pool.task("noop")
def noop(**_args) -> None:
    record("noop", _ctx().id)


@awa_pool.task("add")
def add(a: int, b: int) -> dict:
    record("add", _ctx().id)
    return {"sum": a + b}


@awa_pool.task("fail", max_attempts=2)
def fail(message: str = "boom") -> None:
    record("fail", _ctx().id)
    raise ValueError(message)


@awa_pool.task("retry_then_ok", pass_context=True)
def retry_then_ok(ctx, times: int = 1, delay: float = 0) -> str:
    record("retry_then_ok", ctx.id, str(ctx.attempt))
    if ctx.attempt <= times:
        raise awa_pool.Retry(delay=delay, reason=f"attempt {ctx.attempt}")
    return "ok"


@awa_pool.task("snooze_once", pass_context=True)
def snooze_once(ctx, delay: float = 0.2) -> None:
    record("snooze_once", ctx.id, str(ctx.attempt))
    if not (ctx.metadata or {}).get("never") and ctx.progress is None:
        ctx.set_progress(50, "snoozed once", snoozed=True)
        raise awa_pool.Snooze(delay)


@awa_pool.task("cancel_me")
def cancel_me() -> None:
    record("cancel_me", _ctx().id)
    raise awa_pool.Cancel("not needed any more")


@awa_pool.task("exit_hard")
def exit_hard(code: int = 3) -> None:
    record("exit_hard", _ctx().id)
    os._exit(code)


@awa_pool.task("self_kill")
def self_kill() -> None:
    record("self_kill", _ctx().id)
    os.kill(os.getpid(), signal.SIGKILL)


@awa_pool.task("segfault")
def segfault() -> None:
    record("segfault", _ctx().id)
    ctypes.string_at(0)


@awa_pool.task("sleep")
def sleep(seconds: float = 1.0) -> None:
    record("sleep_start", _ctx().id)
    time.sleep(seconds)
    record("sleep", _ctx().id)


@awa_pool.task("slow", timeout=1.0)
def slow(seconds: float = 30.0) -> None:
    record("slow", _ctx().id)
    time.sleep(seconds)


@awa_pool.task("hang_with_timeout", timeout=3.0)
def hang_with_timeout(seconds: float = 120.0) -> None:
    record("hang_start", _ctx().id)
    time.sleep(seconds)


@awa_pool.task("cpu")
def cpu(seconds: float = 1.0) -> dict:
    record("cpu_start", _ctx().id)
    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n += 1
    record("cpu", _ctx().id)
    return {"pid": os.getpid(), "loops": n}


_leak = []


@awa_pool.task("leak")
def leak(megabytes: int = 50) -> dict:
    record("leak", _ctx().id)
    _leak.append(bytearray(megabytes * 1024 * 1024))
    return {"pid": os.getpid()}


@awa_pool.task("spike")
def spike(megabytes: int = 60) -> dict:
    """Touch this much memory for a moment, then give it back."""
    block = bytearray(megabytes * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])
    del block
    return {"pid": os.getpid()}


@awa_pool.task("whoami")
def whoami() -> dict:
    record("whoami", _ctx().id)
    return {"pid": os.getpid()}


@awa_pool.task("progress", pass_context=True)
def progress(ctx, steps: int = 3, fail_at: int = -1) -> dict:
    start = ((ctx.progress or {}).get("metadata") or {}).get("step", 0)
    record("progress", ctx.id, f"start={start}")
    for step in range(start, steps):
        if step == fail_at and ctx.attempt == 1:
            raise RuntimeError("failing mid-way")
        ctx.set_progress(100.0 * (step + 1) / steps, f"step {step + 1}", step=step + 1)
    return {"resumed_from": start}


@awa_pool.task("bad_result")
def bad_result() -> object:
    record("bad_result", _ctx().id)
    return {"not json": {1, 2}}


@awa_pool.task("queue_a", queue="a")
def queue_a(ms: int = 0) -> None:
    record("queue_a", _ctx().id)
    time.sleep(ms / 1000)


@awa_pool.task("queue_b", queue="b")
def queue_b(ms: int = 0) -> None:
    record("queue_b", _ctx().id)
    time.sleep(ms / 1000)


@awa_pool.task("spin")
def spin(seconds: float = 1.0) -> dict:
    """Burn CPU until `seconds` of wall time have passed (robust on a loaded machine)."""
    record("spin_start", _ctx().id)
    started = time.monotonic()
    cpu_started = time.process_time()
    n = 0
    while time.monotonic() - started < seconds:
        n += 1
    record("spin", _ctx().id)
    return {"pid": os.getpid(), "cpu": time.process_time() - cpu_started}
