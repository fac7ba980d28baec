"""Handler failures to Sentry from awa_pool's children (docs/errors.md).

In your app module (the one `awa-pool start --app` imports):

    import awa_pool
    from sentry_errors import init_sentry

    awa_pool.on_child_start(init_sentry)

Each child sets sentry-sdk up after the fork (a network client must not
be shared across a fork). A handler's exception reaches Sentry through
its logging integration, from the child's `awa_pool.handler` logger, with
the exception's own frames; each event is tagged with the job's kind, id
and attempt. WARNING is a failed attempt that will be retried, ERROR one
that failed the job for good.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

import sentry_sdk
from sentry_sdk.integrations.logging import LoggingIntegration

import awa_pool


def tag_with_job(event: Dict[str, Any], hint: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """before_send: the running job's kind, id and attempt as tags (any
    event sent while a handler runs, not only awa_pool's)."""
    ctx = awa_pool.current_context()
    if ctx is not None:
        event.setdefault("tags", {}).update(
            {"awa.kind": ctx.kind, "awa.job_id": str(ctx.id), "awa.attempt": str(ctx.attempt),
             "awa.queue": ctx.queue})
    return event


def init_sentry(*, every_attempt: bool = False, **options: Any) -> None:
    """sentry_sdk.init for a child. `every_attempt`: an event for each
    failed attempt, not only for the jobs that failed for good."""
    logging_events = LoggingIntegration(level=logging.INFO,
                                        event_level=logging.WARNING if every_attempt else logging.ERROR)
    options.setdefault("dsn", os.environ.get("SENTRY_DSN"))
    sentry_sdk.init(integrations=[logging_events], before_send=tag_with_job, **options)
