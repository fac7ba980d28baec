"""The awa-pool command line (typer). The only module that prints or exits.

User mistakes (bad URL, unreachable database, bad JSON, unknown queue, job
or periodic job...) end with one line on stderr starting with "error: " and
a non-zero exit, never a traceback. Tables are for people; `--json` is for
scripts. Formatting lives in cli_output.py and top.py, queries in stats.py
and admin.py.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psycopg2
import typer

from . import cli_output as out
from . import db, embedded
from .config import PoolConfig
from .errors import AwaError
from .version import __version__

try:  # typer >= 0.24 vendors click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer
    import click.exceptions as click_exceptions  # type: ignore[no-redef]

_ABORTS = tuple({cls for cls in (getattr(click_exceptions, "Abort", None), getattr(typer, "Abort", None))
                 if cls is not None})

ENQUEUE_CHUNK = 1000   # jobs per enqueue_many call in bulk mode (one progress step each)

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="awa_pool: a Postgres job queue with a pre-fork worker pool.")
jobs_app = typer.Typer(no_args_is_help=True, help="Inspect and operate on jobs.")
queues_app = typer.Typer(help="Per-queue counts, throughput and lag; pause and resume.")
dlq_app = typer.Typer(no_args_is_help=True, help="The dead-letter queue (queues started with the dlq option).")
cron_app = typer.Typer(no_args_is_help=True, help="Periodic jobs (registered when a pool starts).")
app.add_typer(jobs_app, name="jobs")
app.add_typer(queues_app, name="queues")
app.add_typer(dlq_app, name="dlq")
app.add_typer(cron_app, name="cron")

DB_URL = typer.Option(None, "--database-url", envvar=None, metavar="URL",
                      help="Postgres URL (default: $AWA_DATABASE_URL, $DATABASE_URL, "
                           "else the embedded server).")
JSON_OUT = typer.Option(False, "--json", help="Machine-readable JSON output.")


class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


def say(message: str) -> None:
    typer.echo(message)


def note(message: str) -> None:
    typer.echo(message, err=True)


def emit_json(value: Any) -> None:
    typer.echo(out.to_json(value))


def resolve_url(database_url: Optional[str]) -> str:
    """The configured URL, or the embedded server's (announced in one line)."""
    url = db.configured_url(database_url)
    if url:
        return db.check_url(url)
    url = embedded.start()
    note(f"using the embedded Postgres (data in {embedded.default_data_dir()})")
    return url


@contextmanager
def connection(database_url: Optional[str], *, autocommit: bool = False,
               require_schema: bool = True) -> Iterator[Any]:
    from .migrate import require_current

    conn = db.connect(resolve_url(database_url), autocommit=autocommit, connect_timeout=5)
    try:
        if require_schema:
            require_current(conn)
        yield conn
    finally:
        conn.close()


def _version_callback(value: bool) -> None:
    if value:
        say(f"awa-pool {__version__}")
        raise typer.Exit()


def _duration(value: Optional[str], what: str) -> Optional[float]:
    from .config import parse_duration

    return None if value is None else parse_duration(value, what=what)


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=_version_callback,
                                      is_eager=True, help="Show the version and exit.")) -> None:
    """awa_pool: a Postgres job queue with a pre-fork worker pool."""


# -- schema and health -----------------------------------------------------------

@app.command()
def migrate(check: bool = typer.Option(False, "--check", help="Only report; exit 1 when behind."),
            database_url: Optional[str] = DB_URL) -> None:
    """Create or upgrade the awa schema (advisory-locked, idempotent)."""
    from .migrate import LATEST_VERSION, migrate as apply_migrations, pending

    with connection(database_url, require_schema=False) as conn:
        if check:
            missing = pending(conn)
            if missing:
                names = ", ".join(f"{version:04d}_{name}" for version, name in missing)
                raise UserError(f"schema is behind: {len(missing)} migration(s) pending ({names})")
            say(f"schema is up to date (version {LATEST_VERSION})")
            return
        applied = apply_migrations(conn)
        if applied:
            say(f"applied {len(applied)} migration(s); schema is at version {LATEST_VERSION}")
        else:
            say(f"schema is up to date (version {LATEST_VERSION})")


@app.command()
def health(database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Exit 0 when the database is reachable and the schema is current (for probes)."""
    from .migrate import LATEST_VERSION

    with connection(database_url):
        if json_out:
            emit_json({"ok": True, "schema_version": LATEST_VERSION})
        else:
            say(f"ok: database reachable, schema at version {LATEST_VERSION}")


# -- running a supervisor --------------------------------------------------------

def _seconds_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


_POOL_DEFAULTS = PoolConfig(dsn="")


def _default(name: str) -> str:
    """PoolConfig's default for an option, for --help (the one source of defaults)."""
    return f"default {_seconds_text(getattr(_POOL_DEFAULTS, name))}"


@app.command()
def start(workers: Optional[int] = typer.Option(None, "--workers", "-w", help="Child processes (default: CPU count)."),
          app_module: Optional[str] = typer.Option(None, "--app", "-a",
                                                   help="Module(s) declaring the tasks (comma-separated)."),
          queue: List[str] = typer.Option([], "--queue", "-q",
                                          help="NAME[=WEIGHT][,min=N][,max=N][,rate=R/s][,aging=S][,dlq] "
                                               "(repeatable; default: every queue the tasks name)."),
          shutdown_timeout: Optional[str] = typer.Option(None, "--shutdown-timeout",
                                                         help=_default("shutdown_timeout")),
          connect_timeout: Optional[str] = typer.Option(None, "--connect-timeout", help=_default("connect_timeout")),
          max_tasks_per_child: Optional[int] = typer.Option(None, "--max-tasks-per-child"),
          max_memory_per_child: Optional[str] = typer.Option(None, "--max-memory-per-child",
                                                              help="Like 512MB or 2GB; a plain number is MB."),
          max_crashes: Optional[int] = typer.Option(
              None, "--max-crashes", help=f"Crashes before a job is failed as poison "
                                          f"(default {_POOL_DEFAULTS.max_crashes})."),
          retention_completed: Optional[str] = typer.Option(None, "--retention-completed",
                                                            help=_default("retention_completed")),
          retention_failed: Optional[str] = typer.Option(None, "--retention-failed",
                                                         help=_default("retention_failed")),
          metrics_port: Optional[int] = typer.Option(None, "--metrics-port",
                                                     help="Serve Prometheus metrics on this port (0 picks one)."),
          log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
          log_format: str = typer.Option("text", "--log-format", help="text or json."),
          migrate_first: bool = typer.Option(False, "--migrate", help="Apply pending migrations first."),
          database_url: Optional[str] = DB_URL) -> None:
    """Run a supervisor with its pool of child processes (SIGTERM drains)."""
    from .config import parse_duration, parse_size
    from .logs import configure_logging
    from .migrate import migrate as apply_migrations
    from .pool import Pool
    from .tasks import import_app

    configure_logging(log_level, log_format)
    given: Dict[str, Any] = {"max_tasks_per_child": max_tasks_per_child, "max_crashes": max_crashes,
                             "metrics_port": metrics_port}
    for name, text in (("shutdown_timeout", shutdown_timeout), ("connect_timeout", connect_timeout),
                       ("retention_completed", retention_completed), ("retention_failed", retention_failed)):
        if text is not None:
            given[name] = parse_duration(text, what="--" + name.replace("_", "-"))
    if max_memory_per_child:
        given["max_memory_per_child"] = parse_size(max_memory_per_child, what="--max-memory-per-child")
    pool = Pool(resolve_url(database_url), app=app_module, workers=workers, queues=queue,
                **{name: value for name, value in given.items() if value is not None})
    if app_module:
        import_app(app_module)  # fail fast, with the import error, before touching the database
    if migrate_first:
        conn = db.connect(pool.config.dsn, retry_for=pool.config.connect_timeout)
        try:
            apply_migrations(conn)
        finally:
            conn.close()
    code = pool.run()
    if code:
        raise typer.Exit(code)


# -- producing ---------------------------------------------------------------------

@app.command()
def enqueue(kind: Optional[str] = typer.Argument(None, help="The job kind (omit with --file)."),
            args: Optional[str] = typer.Option(None, "--args", help="Job args as a JSON object."),
            file: Optional[str] = typer.Option(
                None, "--file", "-f", metavar="JOBS.jsonl",
                help="Bulk: one JSON object per line with kind, args, queue, priority, delay, run_at, "
                     "max_attempts, timeout, tags, metadata, ordering_key, unique ('-' reads stdin). "
                     "All lines are checked first, then inserted in one transaction."),
            queue: Optional[str] = typer.Option(None, "--queue", "-q"),
            priority: Optional[int] = typer.Option(None, "--priority", "-p", help="1 (highest) to 4."),
            delay: Optional[str] = typer.Option(None, "--delay", help="Run after this long (30, 5m, 2h)."),
            max_attempts: Optional[int] = typer.Option(None, "--max-attempts"),
            timeout: Optional[str] = typer.Option(None, "--timeout", help="Per-attempt limit (300, 5m)."),
            tag: List[str] = typer.Option([], "--tag", help="A tag (repeatable)."),
            app_module: Optional[str] = typer.Option(None, "--app", "-a",
                                                     help="Import the tasks to apply their declared defaults."),
            database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Enqueue one job (KIND --args) or many (--file) and print the id(s).

    With --file, the other options are defaults for lines that do not set them."""
    from .jobfile import job_from_object
    from .producer import enqueue as enqueue_job
    from .tasks import import_app

    if (kind is None) == (file is None):
        raise UserError("give a job KIND (with --args), or --file with one job per line, but not both")
    if file is not None and args is not None:
        raise UserError("--args goes with KIND; in --file mode each line carries its own args")
    defaults: Dict[str, Any] = {key: value for key, value in (
        ("queue", queue), ("priority", priority), ("max_attempts", max_attempts),
        ("delay", _duration(delay, "--delay")), ("timeout", _duration(timeout, "--timeout")),
        ("tags", tag or None)) if value is not None}
    if app_module:
        import_app(app_module)
    if file is not None:
        _enqueue_file(file, defaults, database_url, json_out)
        return
    assert kind is not None
    job = job_from_object({"kind": kind, "args": parse_json_object(args or "{}", "--args")}, defaults)
    with connection(database_url) as conn:
        job_id = enqueue_job(conn, job)
        conn.commit()
    if json_out:
        emit_json({"id": job_id})
    else:
        say(str(job_id))


def _enqueue_file(file: str, defaults: Dict[str, Any], database_url: Optional[str], json_out: bool) -> None:
    """Check every line first, then insert in chunks in one transaction,
    with a progress bar on stderr."""
    from .jobfile import parse_lines, read_lines
    from .producer import enqueue_many

    source = "stdin" if file == "-" else file
    lines = sys.stdin.read().splitlines() if file == "-" else read_lines(file)
    jobs = parse_lines(lines, source, defaults)
    started = time.monotonic()
    ids: List[int] = []
    with connection(database_url) as conn:
        with typer.progressbar(length=len(jobs), label=f"enqueueing {len(jobs)} jobs",
                               file=sys.stderr, show_pos=True) as bar:
            for offset in range(0, len(jobs), ENQUEUE_CHUNK):
                chunk = jobs[offset:offset + ENQUEUE_CHUNK]
                ids.extend(enqueue_many(conn, chunk))
                bar.update(len(chunk))
        conn.commit()
    elapsed = time.monotonic() - started
    if json_out:
        emit_json({"count": len(ids), "ids": ids})
    else:
        say(f"enqueued {len(ids)} job(s) from {source} in {elapsed:.1f}s "
            f"(ids {min(ids)}..{max(ids)})")


def parse_json_object(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise UserError(f"{what} must be a JSON object like '{{\"key\": 1}}', got {type(value).__name__}")
    return value


# -- jobs ----------------------------------------------------------------------------

@jobs_app.command("list")
def jobs_list(state: Optional[str] = typer.Option(None, "--state", "-s", help="Only jobs in this state."),
              queue: Optional[str] = typer.Option(None, "--queue", "-q"),
              kind: Optional[str] = typer.Option(None, "--kind", "-k"),
              older_than: Optional[str] = typer.Option(None, "--older-than", help="Created before this long "
                                                                                 "ago (30m, 2h, 7d)."),
              newer_than: Optional[str] = typer.Option(None, "--newer-than", help="Created within this long."),
              limit: int = typer.Option(100, "--limit", "-n", min=1),
              database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """List jobs, newest first."""
    from .admin import list_jobs

    older = _duration(older_than, "--older-than")
    newer = _duration(newer_than, "--newer-than")
    with connection(database_url) as conn:
        records = list_jobs(conn, state=state, queue=queue, kind=kind, limit=limit,
                            older_than=older, newer_than=newer)
    if json_out:
        emit_json(records)
    else:
        say(out.jobs_table(records))


@jobs_app.command("show")
def jobs_show(job_id: int = typer.Argument(..., metavar="ID"),
              database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Everything about one job: args, state, attempts with wall/CPU/RSS, errors, progress, result."""
    from .admin import get_job

    with connection(database_url) as conn:
        record = get_job(conn, job_id)
    if record is None:
        raise UserError(f"no job with id {job_id}")
    if json_out:
        emit_json(record)
    else:
        say(out.job_detail(record))


@jobs_app.command("retry")
def jobs_retry(job_ids: List[int] = typer.Argument(..., metavar="ID..."),
               database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Run failed, cancelled, scheduled or retryable jobs again now."""
    from .admin import retry_job

    _act_on_jobs(job_ids, retry_job, {"scheduled", "retryable", "failed", "cancelled"},
                 {"available", "scheduled"}, ("retry", "retried"), database_url, json_out)


@jobs_app.command("cancel")
def jobs_cancel(job_ids: List[int] = typer.Argument(..., metavar="ID..."),
                reason: str = typer.Option("cancelled by an operator", "--reason"),
                database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Cancel jobs that have not finished (a running one is told, then its child killed)."""
    from .admin import cancel_job

    _act_on_jobs(job_ids, lambda conn, job_id: cancel_job(conn, job_id, reason),
                 {"scheduled", "available", "running", "retryable", "waiting_external"},
                 {"cancelled"}, ("cancel", "cancelled"), database_url, json_out)


def _act_on_jobs(job_ids: List[int], action: Any, applies_to: set, results_in: set,
                 verbs: Tuple[str, str], database_url: Optional[str], json_out: bool) -> None:
    """Apply a retry/cancel to each job in one transaction; report jobs that
    are unknown or in a state the action does not apply to as one error.
    A job counts as changed when it was in `applies_to` before and is in
    `results_in` after (a job that finished in between is reported)."""
    from .admin import get_job

    verb, done = verbs
    results, refused = [], []
    with connection(database_url) as conn:
        for job_id in job_ids:
            record = get_job(conn, job_id)
            if record is None:
                refused.append(f"no job with id {job_id}")
                results.append({"id": job_id, "state": None, "changed": False})
                continue
            before = record.state.value
            after = action(conn, job_id)
            now = after.value if after is not None else before
            changed = before in applies_to and now in results_in
            results.append({"id": job_id, "state": now, "changed": changed, "previous_state": before})
            if not changed:
                refused.append(f"job {job_id} is {now}: nothing to {verb}")
        conn.commit()
    if json_out:
        emit_json(results)
    else:
        for entry in results:
            if entry["changed"]:
                say(f"job {entry['id']} {done} (now {entry['state']})")
    if refused:
        summary = refused[0] if len(refused) == 1 else \
            f"{len(refused)} of {len(job_ids)} job(s) not {done}: " + "; ".join(refused)
        raise UserError(summary)


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
    from .admin import pause_queue

    with connection(_group_url(ctx, database_url)) as conn:
        _require_known_queue(conn, name, force)
        pause_queue(conn, name)
        conn.commit()
    say(f"queue {name!r} paused: no new job starts from it; running jobs finish")


@queues_app.command("resume")
def queues_resume(ctx: typer.Context, name: str = typer.Argument(..., metavar="QUEUE"), force: bool = FORCE,
                  database_url: Optional[str] = DB_URL) -> None:
    """Start jobs from a paused queue again."""
    from .admin import resume_queue

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
    from .admin import set_queue_shards

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


# -- dead-letter queue -------------------------------------------------------------

@dlq_app.command("list")
def dlq_list_cmd(queue: Optional[str] = typer.Option(None, "--queue", "-q"),
                 kind: Optional[str] = typer.Option(None, "--kind", "-k"),
                 limit: int = typer.Option(100, "--limit", "-n", min=1),
                 database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Dead-lettered jobs, most recent first."""
    from .admin import dlq_list

    with connection(database_url) as conn:
        records = dlq_list(conn, queue=queue, kind=kind, limit=limit)
    if json_out:
        emit_json(records)
    else:
        say(out.dlq_table(records))


DLQ_ALL = typer.Option(False, "--all", help="Act on the whole dead-letter queue (no filter).")


def _dlq_filters(job_ids: Optional[List[int]], queue: Optional[str], kind: Optional[str],
                 all_: bool, verb: str) -> Dict[str, Any]:
    if not job_ids and queue is None and kind is None and not all_:
        raise UserError(f"dlq {verb} with no filter would {verb} the whole dead-letter queue: "
                        "give job ids, --queue or --kind, or --all")
    return {"ids": job_ids or None, "queue": queue, "kind": kind}


@dlq_app.command("retry")
def dlq_retry_cmd(job_ids: Optional[List[int]] = typer.Argument(None, metavar="[ID...]"),
                  queue: Optional[str] = typer.Option(None, "--queue", "-q"),
                  kind: Optional[str] = typer.Option(None, "--kind", "-k"), all_: bool = DLQ_ALL,
                  database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Give dead-lettered jobs fresh attempts (filters combine with AND)."""
    from .admin import dlq_retry

    filters = _dlq_filters(job_ids, queue, kind, all_, "retry")
    with connection(database_url) as conn:
        count = dlq_retry(conn, **filters)
        conn.commit()
    if json_out:
        emit_json({"retried": count})
    else:
        say(f"retried {count} dead-lettered job(s)")


@dlq_app.command("purge")
def dlq_purge_cmd(job_ids: Optional[List[int]] = typer.Argument(None, metavar="[ID...]"),
                  queue: Optional[str] = typer.Option(None, "--queue", "-q"),
                  kind: Optional[str] = typer.Option(None, "--kind", "-k"), all_: bool = DLQ_ALL,
                  database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Delete dead-lettered jobs for good (filters combine with AND)."""
    from .admin import dlq_purge

    filters = _dlq_filters(job_ids, queue, kind, all_, "purge")
    with connection(database_url) as conn:
        count = dlq_purge(conn, **filters, all=all_)
        conn.commit()
    if json_out:
        emit_json({"purged": count})
    else:
        say(f"purged {count} dead-lettered job(s)")


# -- periodic jobs -----------------------------------------------------------------

@cron_app.command("list")
def cron_list(database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Registered periodic jobs with their last and next fire."""
    from .periodic_admin import list_schedules

    with connection(database_url) as conn:
        schedules = list_schedules(conn)
    if json_out:
        emit_json(schedules)
    else:
        say(out.schedules_table(schedules))


@cron_app.command("pause")
def cron_pause(name: str = typer.Argument(..., metavar="NAME"), database_url: Optional[str] = DB_URL) -> None:
    """Stop firing a periodic job (trigger still works)."""
    from .periodic_admin import pause_schedule

    with connection(database_url) as conn:
        pause_schedule(conn, name)
        conn.commit()
    say(f"periodic job {name!r} paused")


@cron_app.command("resume")
def cron_resume(name: str = typer.Argument(..., metavar="NAME"), database_url: Optional[str] = DB_URL) -> None:
    """Fire a paused periodic job again from its next tick (missed ticks are skipped)."""
    from .periodic_admin import resume_schedule

    with connection(database_url) as conn:
        resume_schedule(conn, name)
        conn.commit()
    say(f"periodic job {name!r} resumed")


@cron_app.command("trigger")
def cron_trigger(name: str = typer.Argument(..., metavar="NAME"), database_url: Optional[str] = DB_URL,
                 json_out: bool = JSON_OUT) -> None:
    """Enqueue a periodic job's job now, even when paused; prints the job id."""
    from .periodic_admin import trigger_schedule

    with connection(database_url) as conn:
        job_id = trigger_schedule(conn, name)
        conn.commit()
    if json_out:
        emit_json({"id": job_id})
    else:
        say(str(job_id))


# -- kinds and top -------------------------------------------------------------------

@app.command()
def kinds(kind: Optional[str] = typer.Option(None, "--kind", "-k", help="Only this kind."),
          since: Optional[str] = typer.Option(None, "--since", help="Only attempts that finished within "
                                                                     "this long (1h, 7d)."),
          database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Per kind: runs, failures, crashes, timeouts and p50/p95 wall, CPU and peak RSS.

    Counts cover every attempt still on record (terminal jobs are kept for
    the retention period); percentiles and RSS MAX each kind's latest 1,000
    finished jobs. With --since, both only what finished in that window.
    FAILURES counts attempts that raised, retried or were lost; percentiles
    only use attempts whose handler returned or raised."""
    from .stats import KIND_SAMPLE, kind_stats

    since_s = _duration(since, "--since")
    with connection(database_url) as conn:
        rows = kind_stats(conn, kind=kind, since_s=since_s)
    if json_out:
        emit_json(rows)
    else:
        say(out.kinds_table(rows, window=since, sample=KIND_SAMPLE))


@app.command()
def top(interval: float = typer.Option(1.0, "--interval", "-n", min=0.1, help="Seconds between frames."),
        once: bool = typer.Option(False, "--once", help="Print one frame and exit."),
        database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Live view of queues, supervisors, children and throughput (q or Ctrl-C quits).

    When stdout is not a terminal (or with --once), prints one frame and exits."""
    from .migrate import require_current
    from .top import Snapshot, render, run_live

    url = resolve_url(database_url)
    conn = db.connect(url, connect_timeout=5)
    try:
        require_current(conn)
        if once or json_out or not sys.stdout.isatty():
            snapshot = Snapshot.collect(conn)
            if json_out:
                emit_json(snapshot.as_json())
            else:
                say("\n".join(render(snapshot, title=db.describe(url), width=1000, height=1000,
                                     interval=interval, frame=1, color=False)))
            return
        conn = run_live(url, conn, interval, stream=sys.stdout, keys=sys.stdin)
    finally:
        if conn is not None and not conn.closed:
            conn.close()


# -- least privilege -------------------------------------------------------------------

@app.command()
def grant(producer: List[str] = typer.Option([], "--producer", metavar="ROLE",
                                           help="Let ROLE enqueue and nothing else (repeatable)."),
          worker: List[str] = typer.Option([], "--worker", metavar="ROLE",
                                         help="Let ROLE run supervisors, leader maintenance included (repeatable)."),
          revoke: List[str] = typer.Option([], "--revoke", metavar="ROLE",
                                         help="Take back every privilege ROLE holds on the awa schema (repeatable)."),
          database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Grant least-privilege roles: a producer may only enqueue; a worker may run supervisors.

    The roles must exist (CREATE ROLE name LOGIN). Granting is idempotent; run
    it again after `awa-pool migrate`. Prints what each role may use afterwards."""
    from . import grants

    if not (producer or worker or revoke):
        raise UserError("give --producer ROLE, --worker ROLE or --revoke ROLE")
    done: List[Tuple[str, str]] = []
    with connection(database_url) as conn:
        for role in revoke:
            grants.revoke(conn, role)
            done.append((role, "revoked"))
        for profile, roles in (("producer", producer), ("worker", worker)):
            for role in roles:
                grants.grant(conn, role, profile)
                done.append((role, profile))
        report = [(role, profile, grants.privileges(conn, role)) for role, profile in done]
        conn.commit()
    if json_out:
        emit_json([{"role": role, "profile": profile,
                    "privileges": [{"kind": p.kind, "name": p.name, "privileges": p.privileges} for p in held]}
                   for role, profile, held in report])
        return
    for role, profile, held in report:
        if profile == "revoked":
            say(f"role {role}: every privilege on the awa schema revoked")
            continue
        say(f"role {role}: {profile} privileges granted; it may now use:")
        functions = [p.name for p in held if p.kind == "function"]
        for p in held:
            if p.kind != "function":
                say(f"  {p.kind:9} {p.name}: {p.privileges}")
        if len(functions) <= 5:
            for name in functions:
                say(f"  function  {name}: EXECUTE")
        else:
            say(f"  functions EXECUTE on {len(functions)} functions of the awa schema")


# -- entry point -----------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the awa-pool console script."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="awa-pool", standalone_mode=False)
    except click_exceptions.UsageError as exc:
        _fail(exc.format_message(), 2)
    except _ABORTS:
        _fail("aborted", 130)
    except click_exceptions.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except (UserError, AwaError, ValueError, TypeError) as exc:
        _fail(str(exc), 1)
    except psycopg2.Error as exc:
        _fail(f"database error: {db.first_line(exc)}", 1)
    except BrokenPipeError:  # `awa-pool jobs list | head`: the reader left; nothing to report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)
    except OSError as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    text = db.redact(" ".join(str(message).split()))
    typer.echo(f"error: {text}", err=True)
    sys.exit(code)
