"""Handlers for the multi-host tests (tests/multihost, scripts/hosts.py).

Every execution appends one line to a file under $AWA_TEST_LOG_DIR (no
database traffic): `<kind> <job id> <pid> <time> <attempt>:<lease>:<supervisor pid>`,
so a test can tell which host ran which attempt, and whether an attempt ran
twice, whatever the database says. Results name the same attempt, so a
completed job shows which execution's outcome was kept.
"""
from __future__ import annotations

import os
import time

import awa_pool
from apps.basic import record

QUEUE = "hosts"


def _attempt() -> str:
    ctx = awa_pool.current_context()
    return f"{ctx.attempt}:{ctx.lease}:{os.getppid()}"


def _result() -> dict:
    ctx = awa_pool.current_context()
    return {"pid": os.getpid(), "supervisor_pid": os.getppid(), "attempt": ctx.attempt, "lease": ctx.lease}


@awa_pool.task("host_noop", queue=QUEUE)
def host_noop() -> None:
    """The drain benchmark's job: nothing to do, nothing recorded."""


@awa_pool.task("host_sleep", queue=QUEUE)
def host_sleep(seconds: float = 1.0) -> dict:
    ctx = awa_pool.current_context()
    record("host_sleep_start", ctx.id, _attempt())
    time.sleep(seconds)
    record("host_sleep", ctx.id, _attempt())
    return _result()


@awa_pool.task("host_work", queue=QUEUE)
def host_work(seconds: float = 0.0) -> dict:
    """A short job that records its execution (exactly-once checks)."""
    ctx = awa_pool.current_context()
    if seconds:
        time.sleep(seconds)
    record("host_work", ctx.id, _attempt())
    return _result()
