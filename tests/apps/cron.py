"""Periodic declarations and handlers for the leader and cron tests.

Kept apart from apps.basic so that only tests that start pools with
`--app apps.cron` get the every-second schedule.
"""
from __future__ import annotations

import awa_pool
from apps.basic import record

awa_pool.periodic("every_second", "* * * * * *", "cron_tick", {"source": "apps.cron"},
                  queue="cron", missed_fire_policy="catch_up")


@awa_pool.task("cron_tick", queue="cron", pass_context=True)
def cron_tick(ctx, source: str = "") -> None:
    record("cron_tick", ctx.id, (ctx.metadata or {}).get("awa:fire_at", ""))

