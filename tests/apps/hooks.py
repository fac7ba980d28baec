"""A child-start hook that counts its runs per process."""
from __future__ import annotations

import os

import awa_pool
from apps.basic import record

STATE = {"pid": None, "runs": 0}


@awa_pool.on_child_start
def warm_up() -> None:
    STATE["pid"] = os.getpid()
    STATE["runs"] += 1
    record("hook", 0)


@awa_pool.task("hooked")
def hooked() -> dict:
    return {"pid": os.getpid(), "hook_pid": STATE["pid"], "hook_runs": STATE["runs"]}
