"""The awa-pool command line (typer): the entry point, and the commands that
run, feed and check the queue (start, migrate, health, enqueue, kinds, top,
grant). The job, queue, dead-letter and cron commands are in cli_jobs.py
and cli_queues.py; with cli_common.py these are the only modules that print
or exit.

User mistakes (bad URL, unreachable database, bad JSON, unknown queue, job
or periodic job...) end with one line on stderr starting with "error: " and
a non-zero exit, never a traceback. Tables are for people; `--json` is for
scripts. Formatting lives in cli_output.py and top.py, queries in stats.py
and admin.py.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import psycopg2
import typer

from . import cli_output as out
from ..core import db
from .cli_common import (DB_URL, JSON_OUT, UserError, connection, duration, emit_json, note,
                         parse_json_object, resolve_url, say)
from .cli_jobs import dlq_app, jobs_app
from .cli_queues import cron_app, queues_app
from ..core.config import PoolConfig
from ..core.errors import AwaError
from ..core.version import __version__

try:  # typer >= 0.24 vendors click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer
    import click.exceptions as click_exceptions  # type: ignore[no-redef]

_ABORTS = tuple({cls for cls in (getattr(click_exceptions, "Abort", None), getattr(typer, "Abort", None))
                 if cls is not None})

ENQUEUE_CHUNK = 1000   # jobs per enqueue_many call in bulk mode (one progress step each)

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="awa_pool: a Postgres job queue with a pre-fork worker pool.")
app.add_typer(jobs_app, name="jobs")
app.add_typer(queues_app, name="queues")
app.add_typer(dlq_app, name="dlq")
app.add_typer(cron_app, name="cron")

def _version_callback(value: bool) -> None:
    if value:
        say(f"awa-pool {__version__}")
        raise typer.Exit()


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=_version_callback,
                                      is_eager=True, help="Show the version and exit.")) -> None:
    """awa_pool: a Postgres job queue with a pre-fork worker pool."""


# -- schema and health -----------------------------------------------------------

@app.command()
def migrate(check: bool = typer.Option(False, "--check", help="Only report; exit 1 when behind."),
            database_url: Optional[str] = DB_URL) -> None:
    """Create or upgrade the awa schema (advisory-locked, idempotent)."""
    from ..api.migrate import LATEST_VERSION, migrate as apply_migrations, pending

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
    from ..api.migrate import LATEST_VERSION

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
          health_port: Optional[int] = typer.Option(
              None, "--health-port", help="Serve /livez and /readyz (HTTP probes) on this port (0 picks one)."),
          health_host: str = typer.Option("0.0.0.0", "--health-host",
                                          help="Address the health probes bind (default: every interface)."),
          log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
          log_format: str = typer.Option("text", "--log-format", help="text or json."),
          migrate_first: bool = typer.Option(False, "--migrate", help="Apply pending migrations first."),
          session_database_url: Optional[str] = typer.Option(
              None, "--session-database-url", envvar=db.SESSION_URL_ENV_VAR, metavar="URL", show_envvar=True,
              help="A direct URL for LISTEN and the advisory locks when --database-url goes through a "
                   "transaction-mode pooler."),
          database_url: Optional[str] = DB_URL) -> None:
    """Run a supervisor with its pool of child processes (SIGTERM drains)."""
    from ..core.config import parse_duration, parse_size
    from .logs import configure_logging
    from ..api.migrate import migrate as apply_migrations
    from ..worker.pool import Pool
    from ..core.tasks import import_app

    configure_logging(log_level, log_format)
    given: Dict[str, Any] = {"max_tasks_per_child": max_tasks_per_child, "max_crashes": max_crashes,
                             "metrics_port": metrics_port, "session_dsn": session_database_url,
                             "health_port": health_port, "health_host": health_host}
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
                     "max_attempts, timeout, tags, metadata, ordering_key, unique, expires_in ('-' reads stdin). "
                     "All lines are checked first, then inserted in one transaction."),
            queue: Optional[str] = typer.Option(None, "--queue", "-q"),
            priority: Optional[int] = typer.Option(None, "--priority", "-p", help="1 (highest) to 4."),
            delay: Optional[str] = typer.Option(None, "--delay", help="Run after this long (30, 5m, 2h)."),
            max_attempts: Optional[int] = typer.Option(None, "--max-attempts"),
            timeout: Optional[str] = typer.Option(None, "--timeout", help="Per-attempt limit (300, 5m)."),
            expires_in: Optional[str] = typer.Option(None, "--expires-in",
                                                     help="Cancel it as expired if not started within this "
                                                          "long (30s, 5m)."),
            tag: List[str] = typer.Option([], "--tag", help="A tag (repeatable)."),
            app_module: Optional[str] = typer.Option(None, "--app", "-a",
                                                     help="Import the tasks to apply their declared defaults."),
            database_url: Optional[str] = DB_URL, json_out: bool = JSON_OUT) -> None:
    """Enqueue one job (KIND --args) or many (--file) and print the id(s).

    With --file, the other options are defaults for lines that do not set them."""
    from .jobfile import job_from_object
    from ..api.producer import enqueue as enqueue_job
    from ..core.tasks import import_app

    if (kind is None) == (file is None):
        raise UserError("give a job KIND (with --args), or --file with one job per line, but not both")
    if file is not None and args is not None:
        raise UserError("--args goes with KIND; in --file mode each line carries its own args")
    defaults: Dict[str, Any] = {key: value for key, value in (
        ("queue", queue), ("priority", priority), ("max_attempts", max_attempts),
        ("delay", duration(delay, "--delay")), ("timeout", duration(timeout, "--timeout")),
        ("expires_in", duration(expires_in, "--expires-in")), ("tags", tag or None)) if value is not None}
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
    from ..api.producer import enqueue_many

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

    since_s = duration(since, "--since")
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
    from ..api.migrate import require_current
    from .top import Snapshot, run_live, view

    url = resolve_url(database_url)
    conn = db.connect(url, connect_timeout=5)
    try:
        require_current(conn)
        if once or json_out or not sys.stdout.isatty():
            snapshot = Snapshot.collect(conn)
            if json_out:
                emit_json(snapshot.as_json())
            else:
                say(out.to_text(view(snapshot, title=db.describe(url), interval=interval, frame=1)))
            return
        conn = run_live(url, conn, interval, stream=sys.stdout, keys=sys.stdin)
    finally:
        if conn is not None and not conn.closed:
            conn.close()


# -- web dashboard ---------------------------------------------------------------------

@app.command()
def dashboard(host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (not loopback: "
                                                                   "needs --token or --read-only)."),
              port: int = typer.Option(8025, "--port", min=0, max=65535, help="Port (0 picks a free one)."),
              read_only: bool = typer.Option(False, "--read-only", help="Show no action; refuse every POST."),
              token: Optional[str] = typer.Option(None, "--token", envvar="AWA_DASHBOARD_TOKEN",
                                                  help="Require this token (Bearer header or login form)."),
              base_path: str = typer.Option("", "--base-path", metavar="PATH",
                                            help="Serve under this URL path, e.g. /awa behind a proxy."),
              threads: int = typer.Option(4, "--threads", min=1, max=64, help="Request threads."),
              database_url: Optional[str] = DB_URL) -> None:
    """Serve the web dashboard: queues, jobs, attempts and their cost, kinds, cron, DLQ."""
    try:
        from ..dashboard import create_app
        from ..dashboard.serve import check_exposure, make_server, normalize_base_path
    except ImportError as exc:
        raise UserError(f"the dashboard needs the dashboard extra ({exc.name} is missing): "
                        "pip install 'awa-pool[dashboard]'") from None
    check_exposure(host, token, read_only)
    prefix = normalize_base_path(base_path)
    url = resolve_url(database_url)
    with connection(url):  # unreachable or unmigrated: one line now, not a 503 later
        pass
    server = make_server(create_app(url, read_only=read_only, token=token), host, port, prefix, threads)
    shown_host = f"[{host}]" if ":" in host else host
    mode = " (read-only)" if read_only else ""
    note(f"awa-pool dashboard on http://{shown_host}:{server.effective_port}{prefix}/{mode} "
         f"for {db.describe(url)}; Ctrl-C stops it")
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


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
    from ..api import grants

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
