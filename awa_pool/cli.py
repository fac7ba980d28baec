"""The awa-pool command line (typer). The only module that prints or exits.

User mistakes (bad URL, unreachable database, bad JSON, unknown queue...)
end with one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional

import typer

from . import db, embedded
from .errors import AwaError
from .version import __version__

try:  # typer >= 0.24 vendors click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer
    import click.exceptions as click_exceptions  # type: ignore[no-redef]

_ABORTS = tuple({cls for cls in (getattr(click_exceptions, "Abort", None), getattr(typer, "Abort", None))
                 if cls is not None})

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="awa_pool: a Postgres job queue with a pre-fork worker pool.")

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
    typer.echo(json.dumps(value, default=str, indent=2, ensure_ascii=False))


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


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=_version_callback,
                                      is_eager=True, help="Show the version and exit.")) -> None:
    """awa_pool: a Postgres job queue with a pre-fork worker pool."""


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
def start(workers: int = typer.Option(os.cpu_count() or 1, "--workers", "-w", help="Child processes."),
          app_module: Optional[str] = typer.Option(None, "--app", "-a",
                                                   help="Module(s) declaring the tasks (comma-separated)."),
          queue: List[str] = typer.Option([], "--queue", "-q",
                                          help="NAME[=WEIGHT][,min=N][,max=N][,rate=R/s][,aging=S][,dlq] "
                                               "(repeatable; default: every queue the tasks name)."),
          shutdown_timeout: str = typer.Option("30s", "--shutdown-timeout"),
          connect_timeout: str = typer.Option("30s", "--connect-timeout"),
          max_tasks_per_child: Optional[int] = typer.Option(None, "--max-tasks-per-child"),
          max_memory_per_child: Optional[str] = typer.Option(None, "--max-memory-per-child",
                                                              help="Like 512MB or 2GB; a plain number is MB."),
          max_crashes: int = typer.Option(3, "--max-crashes", help="Crashes before a job is failed as poison."),
          retention_completed: str = typer.Option("24h", "--retention-completed"),
          retention_failed: str = typer.Option("7d", "--retention-failed"),
          metrics_port: Optional[int] = typer.Option(None, "--metrics-port"),
          log_level: str = typer.Option("info", "--log-level"),
          log_format: str = typer.Option("text", "--log-format", help="text or json."),
          migrate_first: bool = typer.Option(False, "--migrate", help="Apply pending migrations first."),
          database_url: Optional[str] = DB_URL) -> None:
    """Run a supervisor with its pool of child processes."""
    from .config import PoolConfig, parse_duration, parse_queues, parse_size
    from .logs import configure_logging
    from .migrate import migrate as apply_migrations
    from .supervisor import Supervisor
    from .tasks import import_app

    configure_logging(log_level, log_format)
    config = PoolConfig(
        dsn=resolve_url(database_url), app=app_module, workers=workers, queues=parse_queues(queue),
        shutdown_timeout=parse_duration(shutdown_timeout, what="--shutdown-timeout"),
        connect_timeout=parse_duration(connect_timeout, what="--connect-timeout"),
        max_tasks_per_child=max_tasks_per_child,
        max_memory_per_child=(parse_size(max_memory_per_child, what="--max-memory-per-child")
                              if max_memory_per_child else None),
        max_crashes=max_crashes,
        retention_completed=parse_duration(retention_completed, what="--retention-completed"),
        retention_failed=parse_duration(retention_failed, what="--retention-failed"),
        metrics_port=metrics_port)
    if app_module:
        import_app(app_module)  # fail fast, with the import error, before touching the database
    if migrate_first:
        conn = db.connect(config.dsn, retry_for=config.connect_timeout)
        try:
            apply_migrations(conn)
        finally:
            conn.close()
    code = Supervisor(config).run()
    if code:
        raise typer.Exit(code)


@app.command()
def enqueue(kind: str = typer.Argument(..., help="The job kind."),
            args: str = typer.Option("{}", "--args", help="Job args as a JSON object."),
            queue: Optional[str] = typer.Option(None, "--queue", "-q"),
            priority: Optional[int] = typer.Option(None, "--priority", "-p", help="1 (highest) to 4."),
            delay: Optional[float] = typer.Option(None, "--delay", help="Seconds from now."),
            max_attempts: Optional[int] = typer.Option(None, "--max-attempts"),
            timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds."),
            tag: List[str] = typer.Option([], "--tag", help="A tag (repeatable)."),
            database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Enqueue one job and print its id."""
    from .job import Job
    from .producer import enqueue as enqueue_job

    parsed = parse_json_object(args, "--args")
    options = {name: value for name, value in (
        ("queue", queue), ("priority", priority), ("max_attempts", max_attempts),
        ("timeout", timeout)) if value is not None}
    job = Job(kind, parsed, delay=delay, tags=tag, **options)
    with connection(database_url) as conn:
        job_id = enqueue_job(conn, job)
        conn.commit()
    if json_out:
        emit_json({"id": job_id})
    else:
        say(str(job_id))


@app.command()
def health(database_url: Optional[str] = DB_URL) -> None:
    """Exit 0 when the database is reachable and the schema is current."""
    with connection(database_url):
        say("ok")


def parse_json_object(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise UserError(f"{what} must be a JSON object like '{{\"key\": 1}}', got {type(value).__name__}")
    return value


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
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    text = db.redact(" ".join(str(message).split()))
    typer.echo(f"error: {text}", err=True)
    sys.exit(code)
