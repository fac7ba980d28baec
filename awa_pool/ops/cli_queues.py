"""awa-pool queues ... and awa-pool cron ...: per-queue statistics, pausing
and sharding; periodic jobs."""
from __future__ import annotations

from typing import Any, Optional

import typer

from . import cli_output as out
from .cli_common import DB_URL, JSON_OUT, UserError, connection, emit_json, say

queues_app = typer.Typer(help="Per-queue counts, throughput and lag; pause and resume.")
cron_app = typer.Typer(no_args_is_help=True, help="Periodic jobs (registered when a pool starts).")


# -- queues --------------------------------------------------------------------------

@queues_app.callback(invoke_without_command=True)
def queues(ctx: typer.Context, database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Per-queue counts, jobs/s over the last minute and lag (oldest available job's age)."""
    from .stats import queue_stats

    ctx.obj = {"database_url": database_url}
    if ctx.invoked_subcommand is not None:
        return
    with connection(database_url) as conn:
        rows = queue_stats(conn)
    if json_out:
        emit_json([out.queue_json(row) for row in rows])
    else:
        say(out.queues_table(rows))


def _group_url(ctx: typer.Context, database_url: Optional[str]) -> Optional[str]:
    return database_url or ((ctx.obj or {}).get("database_url") if isinstance(ctx.obj, dict) else None)


FORCE = typer.Option(False, "--force", help="Act even if no supervisor, setting or job knows the queue yet.")


@queues_app.command("pause")
def queues_pause(ctx: typer.Context, name: str = typer.Argument(..., metavar="QUEUE"), force: bool = FORCE,
                 database_url: Optional[str] = DB_URL) -> None:
    """Stop starting jobs from a queue (running ones finish; enqueueing still works).

    A queue nothing knows (no settings row, no live supervisor serving it, no
    job in it) is refused as a likely typo; --force pauses it ahead of use."""
    from ..api.admin import pause_queue

    with connection(_group_url(ctx, database_url)) as conn:
        _require_known_queue(conn, name, force)
        pause_queue(conn, name)
        conn.commit()
    say(f"queue {name!r} paused: no new job starts from it; running jobs finish")


@queues_app.command("resume")
def queues_resume(ctx: typer.Context, name: str = typer.Argument(..., metavar="QUEUE"), force: bool = FORCE,
                  database_url: Optional[str] = DB_URL) -> None:
    """Start jobs from a paused queue again."""
    from ..api.admin import resume_queue

    with connection(_group_url(ctx, database_url)) as conn:
        _require_known_queue(conn, name, force)
        resume_queue(conn, name)
        conn.commit()
    say(f"queue {name!r} resumed")


@queues_app.command("set")
def queues_set(ctx: typer.Context, name: str = typer.Argument(..., metavar="QUEUE"),
               shards: int = typer.Option(..., "--shards", min=1, max=64,
                                          help="Lanes, each strict FIFO (1 = the whole queue)."),
               force: bool = FORCE, database_url: Optional[str] = DB_URL) -> None:
    """Change a queue's shared settings (stored in the database, so producers
    and every supervisor agree): --shards N splits it into N FIFO lanes."""
    from ..api.admin import set_queue_shards

    with connection(_group_url(ctx, database_url)) as conn:
        _require_known_queue(conn, name, force)
        moved = set_queue_shards(conn, name, shards)
        conn.commit()
    say(f"queue {name!r} now has {shards} lane(s); {moved} waiting job(s) placed in their lanes")


def _require_known_queue(conn: Any, name: str, force: bool) -> None:
    """Unknown = no row in awa.queues, no live supervisor serving it and no
    job (live or retained) in it: most likely a typo."""
    from .stats import queue_known, queue_stats

    if force or queue_known(conn, name):
        return
    known = [row.queue for row in queue_stats(conn)]
    hint = f" (known: {', '.join(known[:10])}{', ...' if len(known) > 10 else ''})" if known else ""
    raise UserError(f"unknown queue {name!r}{hint}; use --force to act on a queue nothing uses yet")


# -- periodic jobs -----------------------------------------------------------------

@cron_app.command("list")
def cron_list(database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Registered periodic jobs with their last and next fire."""
    from ..api.periodic_admin import list_schedules

    with connection(database_url) as conn:
        schedules = list_schedules(conn)
    if json_out:
        emit_json(schedules)
    else:
        say(out.schedules_table(schedules))


@cron_app.command("pause")
def cron_pause(name: str = typer.Argument(..., metavar="NAME"), database_url: Optional[str] = DB_URL) -> None:
    """Stop firing a periodic job (trigger still works)."""
    from ..api.periodic_admin import pause_schedule

    with connection(database_url) as conn:
        pause_schedule(conn, name)
        conn.commit()
    say(f"periodic job {name!r} paused")


@cron_app.command("resume")
def cron_resume(name: str = typer.Argument(..., metavar="NAME"), database_url: Optional[str] = DB_URL) -> None:
    """Fire a paused periodic job again from its next tick (missed ticks are skipped)."""
    from ..api.periodic_admin import resume_schedule

    with connection(database_url) as conn:
        resume_schedule(conn, name)
        conn.commit()
    say(f"periodic job {name!r} resumed")


@cron_app.command("trigger")
def cron_trigger(name: str = typer.Argument(..., metavar="NAME"), database_url: Optional[str] = DB_URL,
                 json_out: bool = JSON_OUT) -> None:
    """Enqueue a periodic job's job now, even when paused; prints the job id."""
    from ..api.periodic_admin import trigger_schedule

    with connection(database_url) as conn:
        job_id = trigger_schedule(conn, name)
        conn.commit()
    if json_out:
        emit_json({"id": job_id})
    else:
        say(str(job_id))
