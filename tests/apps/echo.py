"""Handlers that give back what they were given, for the round-trip and
hostile-input tests: args, metadata, tags and kind as the child saw them,
or a value built in the child (to test the result path)."""
from __future__ import annotations

import os
import time

import awa_pool
from apps.basic import record


def _seen() -> dict:
    ctx = awa_pool.current_context()
    return {"kind": ctx.kind, "queue": ctx.queue, "metadata": ctx.metadata, "tags": list(ctx.tags),
            "pid": os.getpid()}


@awa_pool.task("echo", queue="echo")
def echo(**args) -> dict:
    """Any args at all (every key is accepted): return them as received."""
    record("echo", awa_pool.current_context().id)
    return {"args": args, **_seen()}


@awa_pool.task("echo_value", queue="echo")
def echo_value(value=None, **_ignored) -> object:
    """Return args["value"] as the job's result (any JSON value)."""
    record("echo_value", awa_pool.current_context().id)
    return value


@awa_pool.task("bad_value", queue="echo")
def bad_value(what: str) -> object:
    """Return something that cannot be stored as a result."""
    record("bad_value", awa_pool.current_context().id)
    if what == "nul":
        return {"text": "before\x00after"}
    if what == "surrogate":
        return {"text": "lone \ud800 surrogate"}
    if what == "huge":
        return {"blob": "x" * (2 * 1024 * 1024)}
    if what == "deep":
        value: list = []
        for _ in range(5000):
            value = [value]
        return value
    if what == "nan":
        return {"n": float("nan")}
    if what == "set":
        return {"s": {1, 2}}
    raise ValueError(f"unknown case {what!r}")


@awa_pool.task("sleep_lease", queue="echo")
def sleep_lease(seconds: float = 1.0) -> dict:
    """Sleep, recording the lease this execution runs under."""
    ctx = awa_pool.current_context()
    record("sleep_lease", ctx.id, str(ctx.lease))
    time.sleep(seconds)
    return {"lease": ctx.lease}
