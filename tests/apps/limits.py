"""Handlers for the fleet-wide limit tests: each records when it starts and
ends (tests/apps/basic.py's record file), so a test can replay how many of
a queue's jobs ran at once across every supervisor."""
from __future__ import annotations

import time

import awa_pool
from apps.basic import record


@awa_pool.task("hold", queue="gpu")
def hold(seconds: float = 0.3, first_attempt_s: float = 0.0) -> None:
    """Run `seconds` (the first attempt `first_attempt_s` instead, when given)."""
    ctx = awa_pool.current_context()
    record("hold_start", ctx.id)
    time.sleep(first_attempt_s if first_attempt_s and ctx.attempt == 1 else seconds)
    record("hold_end", ctx.id)
