"""A child-start hook that always fails: the supervisor must not respawn forever."""
from __future__ import annotations

import awa_pool


@awa_pool.on_child_start
def broken() -> None:
    raise RuntimeError("cannot load the model")


@awa_pool.task("hooked")
def hooked() -> None:
    pass
