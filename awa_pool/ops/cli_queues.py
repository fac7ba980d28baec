"""awa-pool queues ... and awa-pool cron ...: per-queue statistics, pausing,
the fleet-wide policy (set, show); periodic jobs."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

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


def _cleared(text: Optional[str], parse: Callable[[str], Any]) -> Any:
    """A CLI value where `none` clears the setting (SPEC §11)."""
    return None if text.strip().lower() == "none" else parse(text)


def _limit(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise UserError(f"expected a positive integer or none, got {text.strip()[:40]!r}") from None


@queues_app.command("set")
def queues_set(ctx: typer.Context, name: str = typer.Argument(..., metavar="QUEUE"),
               rate: Optional[str] = typer.Option(None, "--rate", metavar="R/s",
                                                  help="Job starts per second across the fleet (10/s, 30/m; none clears)."),
               dlq: Optional[bool] = typer.Option(None, "--dlq/--no-dlq",
                                                  help="Dead-letter the queue's exhausted jobs, or not."),
               global_max: Optional[str] = typer.Option(None, "--global-max", metavar="N",
                                                        help="At most N of its jobs running across the fleet (none clears)."),
               shards: Optional[str] = typer.Option(None, "--shards", metavar="N",
                                                    help="Lanes, each strict FIFO (1-64; 1 = the whole queue)."),
               force: bool = FORCE, database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Change a queue's fleet-wide policy (stored in the database, so producers
    and every supervisor agree; running supervisors apply it within seconds).
    Settings not given stay as they are."""
    from ..api.queue_policy import set_queue

    settings: Dict[str, Any] = {}
    if rate is not None:
        settings["rate"] = _cleared(rate, str)
    if dlq is not None:
        settings["dlq"] = dlq
    if global_max is not None:
        settings["global_max"] = _cleared(global_max, _limit)
    if shards is not None:
        settings["shards"] = _cleared(shards, _limit)
    if not settings:
        raise UserError("nothing to set: give --rate, --dlq/--no-dlq, --global-max or --shards")
    with connection(_group_url(ctx, database_url)) as conn:
        _require_known_queue(conn, name, force)
        policy = set_queue(conn, name, **settings)
        conn.commit()
    if json_out:
        emit_json(out.policy_json(policy))
    else:
        say(f"queue {name!r} set: " + out.policy_line(policy))


@queues_app.command("show")
def queues_show(ctx: typer.Context, name: str = typer.Argument(..., metavar="QUEUE"),
                database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """A queue's fleet-wide policy and its jobs by state."""
    from ..api.queue_policy import QueuePolicy, queue_policy
    from .stats import queue_stats

    with connection(_group_url(ctx, database_url)) as conn:
        _require_known_queue(conn, name, False)
        policy = queue_policy(conn, name) or QueuePolicy(queue=name)
        stats = next((row for row in queue_stats(conn) if row.queue == name), None)
    if json_out:
        emit_json(dict(out.policy_json(policy), stats=out.queue_json(stats) if stats else None))
    else:
        say(out.queue_page(policy, stats))


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
