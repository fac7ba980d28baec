"""Handlers for the job-feature tests: callbacks, progress, cancellation,
dead letters, batches. Like apps.basic, each records its executions under
$AWA_TEST_LOG_DIR; a handler that must wait for the test waits for a file
there (`release(name)` on the test side), never for a fixed time."""
from __future__ import annotations

import json
import os
import random
import threading
import time

import psycopg2

import awa_pool
from apps.basic import record

GATE_TIMEOUT_S = 40.0


def gate_path(name: str) -> str:
    return os.path.join(os.environ.get("AWA_TEST_LOG_DIR") or ".", f"gate-{name}")


def wait_gate(name: str, timeout: float = GATE_TIMEOUT_S) -> bool:
    """Block until the test opens gate `name` (bounded)."""
    deadline = time.monotonic() + timeout
    path = gate_path(name)
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# -- callbacks ---------------------------------------------------------------------

@awa_pool.task("cb_wait", pass_context=True)
def cb_wait(ctx, timeout: float = 3600, label: str = "") -> object:
    """Park on a callback; when resumed, return what the callback carried."""
    record("cb_wait", ctx.id, f"attempt={ctx.attempt} result={json.dumps(ctx.callback_result)}")
    if ctx.callback_result is not None:
        return {"resumed_with": ctx.callback_result, "attempt": ctx.attempt}
    callback = ctx.register_callback(timeout=timeout)
    return awa_pool.WaitForCallback(callback)


@awa_pool.task("cb_plan", pass_context=True)
def cb_plan(ctx, plan: list) -> object:
    """Per attempt, one step: `wait` parks on a callback, `raise` registers a
    callback and then fails, `block` waits for gate `<id>-<attempt>` and
    completes, `early` registers a callback, waits for that gate, then parks.
    A run that got a callback result returns it."""
    step = plan[min(ctx.attempt, len(plan)) - 1]
    record("cb_plan", ctx.id, f"attempt={ctx.attempt} step={step}")
    if ctx.callback_result is not None:
        return {"callback_result": ctx.callback_result, "attempt": ctx.attempt}
    if step == "early":
        callback = ctx.register_callback(timeout=3600)
        wait_gate(f"{ctx.id}-{ctx.attempt}")
        return awa_pool.WaitForCallback(callback)
    if step == "wait":
        return awa_pool.WaitForCallback(ctx.register_callback(timeout=3600))
    if step == "raise":
        ctx.register_callback(timeout=3600)
        raise RuntimeError("failed after registering a callback")
    if step == "block":
        wait_gate(f"{ctx.id}-{ctx.attempt}")
        return {"finished_attempt": ctx.attempt}
    raise ValueError(f"unknown step {step!r}")


# -- progress ----------------------------------------------------------------------

@awa_pool.task("progress_spam", pass_context=True)
def progress_spam(ctx, calls: int = 10_000, seconds: float = 3.0) -> dict:
    """Call set_progress `calls` times, spread over about `seconds`."""
    record("progress_spam", ctx.id)
    pause = seconds / calls
    started = time.monotonic()
    for i in range(1, calls + 1):
        ctx.set_progress(100.0 * i / calls, "spamming", i=i)
        # pace by the clock so a slow machine does not stretch the run
        ahead = started + i * pause - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    return {"calls": calls}


@awa_pool.task("progress_hold", pass_context=True)
def progress_hold(ctx) -> str:
    """Report progress, then hold until the test has seen it."""
    ctx.set_progress(40, "downloading", row=400)
    record("progress_hold", ctx.id)
    wait_gate(f"progress-{ctx.id}")
    ctx.set_progress(100, "done", row=1000)
    return "held"


@awa_pool.task("progress_crash", pass_context=True, max_attempts=3)
def progress_crash(ctx, rows: int = 10, crash_at: int = 7, pause_s: float = 0.0) -> dict:
    """Checkpoint every row (each takes `pause_s`); on the first attempt die
    hard at `crash_at`."""
    start = ((ctx.progress or {}).get("metadata") or {}).get("row", 0)
    record("progress_crash", ctx.id, f"attempt={ctx.attempt} start={start}")
    for row in range(start, rows):
        if ctx.attempt == 1 and row == crash_at:
            os._exit(9)  # no outcome: the child just dies
        time.sleep(pause_s)
        ctx.set_progress(100.0 * (row + 1) / rows, "row", row=row + 1)
    return {"resumed_from": start, "attempt": ctx.attempt}


# -- cancellation ------------------------------------------------------------------

@awa_pool.task("cooperative", pass_context=True)
def cooperative(ctx, limit_s: float = 30.0) -> str:
    """Work until asked to cancel, then stop cleanly."""
    record("cooperative_start", ctx.id)
    deadline = time.monotonic() + limit_s
    while not ctx.cancel_requested:
        if time.monotonic() > deadline:
            return "never cancelled"
        time.sleep(0.005)
    record("cooperative_saw_cancel", ctx.id)
    return "stopped on request"


@awa_pool.task("stubborn", pass_context=True)
def stubborn(ctx, seconds: float = 60.0) -> str:
    """Ignore cancellation (the grace period must end it)."""
    record("stubborn_start", ctx.id)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
    record("stubborn_finished", ctx.id)
    return "finished anyway"


@awa_pool.task("finish_and_cancel", pass_context=True)
def finish_and_cancel(ctx, dsn: str, offset_ms: float) -> dict:
    """Return at once while a thread of ours cancels this very job about
    `offset_ms` later (negative: just before returning), on its own
    connection; records what cancel_job answered."""
    job_id = ctx.id
    late = offset_ms >= 1000  # long after: connect then, not hold a connection meanwhile
    conn = None if late else psycopg2.connect(dsn)
    go = threading.Event()

    def cancel() -> None:
        nonlocal conn
        go.wait(5)
        if offset_ms > 0:
            time.sleep(offset_ms / 1000.0)
        if conn is None:
            conn = psycopg2.connect(dsn)
        conn.autocommit = True
        try:
            answer = awa_pool.cancel_job(conn, job_id, reason="race")
            record("cancel_answer", job_id, answer.value if answer is not None else "None")
        finally:
            conn.close()

    thread = threading.Thread(target=cancel, daemon=True)
    thread.start()
    go.set()
    if offset_ms < 0:
        thread.join(5)
    record("finish_and_cancel", job_id)
    return {"job": job_id}


# -- dead letters and batches --------------------------------------------------------

@awa_pool.task("flaky", pass_context=True)
def flaky(ctx, gate: str) -> dict:
    """Fail until the test opens `gate`."""
    record("flaky", ctx.id, f"attempt={ctx.attempt}")
    if not os.path.exists(gate_path(gate)):
        raise ConnectionError(f"gate {gate} closed")
    return {"ok_on_attempt": ctx.attempt}


@awa_pool.task("member", pass_context=True, max_attempts=1)
def member(ctx, i: int, fail: bool = False, gate: str = "", jitter_ms: float = 0) -> dict:
    record("member", ctx.id, str(i))
    if gate:
        wait_gate(gate)
    if jitter_ms:
        time.sleep(random.uniform(0, jitter_ms) / 1000.0)
    if fail:
        raise ValueError(f"member {i} failed")
    return {"i": i, "square": i * i}


@awa_pool.task("reduce", pass_context=True)
def reduce(ctx) -> dict:
    """A batch follow-up: summarize the members' records."""
    records = ctx.batch_results()
    record("reduce", ctx.id, str(len(records)))
    return {
        "ids": [r.id for r in records],
        "states": [r.state.value for r in records],
        "results": [r.result for r in records],
        "errors": [len(r.errors) for r in records],
    }


@awa_pool.task("tick")
def tick(n: int = 0) -> dict:
    record("tick", awa_pool.current_context().id, str(n))
    return {"n": n}
