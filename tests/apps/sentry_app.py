"""The Sentry recipe of examples/sentry_errors.py, as an app uses it, with
a transport that writes each event to a file instead of sending it (no
network): sentry-sdk's own Transport interface, as its test suite does."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sentry_sdk.transport import Transport

import awa_pool

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from sentry_errors import init_sentry  # noqa: E402


class EventFile(Transport):
    """Each event of an envelope as one JSON line in $AWA_TEST_LOG_DIR."""

    def capture_envelope(self, envelope) -> None:
        path = os.path.join(os.environ["AWA_TEST_LOG_DIR"], f"sentry-{os.getpid()}.jsonl")
        with open(path, "a") as out:
            for item in envelope.items:
                if item.type == "event":
                    out.write(json.dumps(item.payload.json) + "\n")


@awa_pool.on_child_start
def sentry() -> None:
    init_sentry(every_attempt=os.environ.get("AWA_TEST_SENTRY_EVERY") == "1",
                dsn="https://public@sentry.invalid/1", transport=EventFile())


@awa_pool.task("sentry_fail", max_attempts=2)
def sentry_fail(n: int) -> None:
    raise ValueError(f"sentry says {n}")


@awa_pool.task("sentry_ok")
def sentry_ok() -> None:
    return None
