"""A slow handler that reports which process ran it, for the lease-guard test
(no periodic declarations here)."""
from __future__ import annotations

import os
import time

import awa_pool
from apps.basic import record


@awa_pool.task("sleep_whoami", queue="lease")
def sleep_whoami(seconds: float = 2.0) -> dict:
    ctx = awa_pool.current_context()
    record("sleep_whoami_start", ctx.id)
    time.sleep(seconds)
    record("sleep_whoami", ctx.id)
    return {"pid": os.getpid(), "attempt": ctx.attempt}
