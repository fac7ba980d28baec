"""Tasks whose kinds and queues are hostile strings (quotes, semicolons,
backslashes, SQL comment and placeholder syntax, control characters,
unicode), for tests/test_hostile_input.py. Each handler returns what it was
given so the test can compare it byte for byte."""
from __future__ import annotations

from typing import Callable

import awa_pool
from apps.basic import record

HOSTILE = [
    "'; DROP TABLE awa.jobs_hot; --",
    "q\"uote's\"); SELECT pg_sleep(30); --",
    "back\\slash \\' \\\\ \\x41 \\N \\0",
    "semi;colon;; COMMIT; ROLLBACK;",
    "tab\tnew\nline\rcarriage",
    "ctrl \x01\x02\x1b[31mred\x1b[0m \x7f\x08",
    "unicode žluťoučký kůň 🐍 中文 \u202eRTL\u202c \u200bZWSP \ufeffBOM",
    "%s %(id)s {} {0} $1 $$ :name ? @p",
    "*/ /* -- # ` ~ \\g \\! psql",
    "E'\\x27' U&'\\0041' $tag$ body $tag$",
    " leading and trailing ",
    "a" * 200,
]


def _handler(kind: str) -> Callable[..., dict]:
    def handler(**args) -> dict:
        ctx = awa_pool.current_context()
        record("hostile", ctx.id)
        return {"kind": ctx.kind, "queue": ctx.queue, "tags": list(ctx.tags), "metadata": ctx.metadata,
                "args": args}

    handler.__qualname__ = f"hostile_{HOSTILE.index(kind)}"
    return handler


for _name in HOSTILE:
    awa_pool.task(_name, queue=_name)(_handler(_name))
