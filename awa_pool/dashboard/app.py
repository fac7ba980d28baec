"""The dashboard's Flask application: configuration, template helpers and
error pages. The pages live in pages.py, the actions in actions.py; this
module wires them together with the access checks of auth.py.

Errors get a page of their own: 400 (a filter the dashboard cannot apply,
with the reason), 401/403 (token, read-only, CSRF), 404 (unknown job or
page) and 503 (the database is unreachable or not migrated; nothing about
the connection string is shown, and the next request simply tries again).
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any, Optional, Tuple

import psycopg2
from flask import Flask, render_template, request
from werkzeug.exceptions import HTTPException, NotFound

from ..ops.cli_output import age, census_phrase, rate, seconds, size, stamp
from ..core.db import redact
from ..core.errors import DatabaseUnavailable, SchemaMissing
from . import actions, auth, pages
from .connections import Connections
from .kinds import KindTrends
from .throughput import ThroughputMinutes
from .reads import BadFilter

log = logging.getLogger(__name__)

STATE_CLASSES = {
    "available": "st-available", "running": "st-running", "scheduled": "st-scheduled",
    "retryable": "st-retryable", "waiting_external": "st-waiting", "completed": "st-completed",
    "failed": "st-failed", "cancelled": "st-cancelled",
    # attempt outcomes (attempt logs and errors)
    "retry": "st-retryable", "snooze": "st-scheduled", "crash": "st-failed", "timeout": "st-failed",
    "fatal": "st-failed", "lost": "st-failed", "deadline": "st-failed", "callback_timeout": "st-failed",
    "cancel": "st-cancelled", "waiting": "st-waiting",
}


def _moment(value: Any) -> Optional[datetime]:
    """A datetime from a column or from JSON text (attempt logs store ISO text)."""
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def _ago(value: Any) -> str:
    moment = _moment(value)
    return age(moment) if moment is not None else "—"


def _stamp(value: Any) -> str:
    moment = _moment(value)
    return stamp(moment) if moment is not None else "—"


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _number(value: Any) -> str:
    return f"{int(value):,}" if value is not None else "—"


def create_app(dsn: Optional[str] = None, *, read_only: bool = False, token: Optional[str] = None) -> Flask:
    """The dashboard as a WSGI app (Flask), for `awa-pool dashboard` or for
    mounting in a Flask or Django project. Without a dsn it uses the same
    database as the CLI: $AWA_DATABASE_URL, $DATABASE_URL, else the embedded
    server. With a token, every request must carry it; with read_only, no
    action is shown and every POST is refused."""
    from ..core import db, embedded

    if token is not None and not token.strip():
        raise ValueError("the dashboard token must not be empty")
    url = dsn or db.configured_url(None) or embedded.start()
    app = Flask(__name__, static_folder="static", template_folder="templates")
    app.config.update(TEMPLATES_AUTO_RELOAD=False, MAX_CONTENT_LENGTH=64 * 1024)
    app.extensions["awa_connections"] = Connections(db.check_url(url))
    app.extensions["awa_kind_trends"] = KindTrends()
    app.extensions["awa_throughput"] = ThroughputMinutes()
    app.jinja_env.autoescape = True
    app.jinja_env.filters.update(
        ago=_ago, stamp=_stamp, seconds=seconds, size=size, rate=rate, pretty_json=_pretty_json,
        number=_number, census=census_phrase)

    # globals, not a context processor: imported macros see globals only
    app.jinja_env.globals.update(read_only=read_only, csrf_token=auth.csrf_token, state_class=STATE_CLASSES,
                                 csrf_field=auth.CSRF_FIELD)

    auth.install(app, token=token, read_only=read_only)
    pages.register(app, token=token)
    actions.register(app)
    _error_pages(app)
    return app


def _page(status: int, title: str, message: str, *, retry: bool = False) -> Tuple[str, int]:
    return render_template("error.html", status=status, title=title, message=message, retry=retry), status


def _error_pages(app: Flask) -> None:
    @app.errorhandler(BadFilter)
    def _bad_filter(exc: BadFilter) -> Tuple[str, int]:
        return _page(400, "Bad request", str(exc))

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Any:
        if exc.code is None or exc.code < 400:
            return exc
        titles = {400: "Bad request", 401: "Token required", 403: "Forbidden", 404: "Not found",
                  405: "Method not allowed", 413: "Request too large"}
        message = exc.description if isinstance(exc.description, str) else ""
        if exc.code == 404 and message == NotFound.description:
            message = "There is no such page here."
        return _page(exc.code, titles.get(exc.code, exc.name), message)

    @app.errorhandler(DatabaseUnavailable)
    @app.errorhandler(psycopg2.OperationalError)
    @app.errorhandler(psycopg2.InterfaceError)
    def _db_down(exc: Exception) -> Tuple[str, int]:
        # the details (host, port) go to the log, never to the page
        log.warning("dashboard: database unavailable: %s", redact(str(exc).strip().splitlines()[0]
                                                                 if str(exc).strip() else type(exc).__name__))
        app.extensions["awa_connections"].discard_all()
        return _page(503, "Database unavailable",
                     "The dashboard cannot reach its database right now. It tries again on every "
                     "request; this page reloads itself.", retry=True)

    @app.errorhandler(SchemaMissing)
    @app.errorhandler(psycopg2.errors.UndefinedTable)
    @app.errorhandler(psycopg2.errors.UndefinedFunction)
    @app.errorhandler(psycopg2.errors.InvalidSchemaName)
    def _no_schema(exc: Exception) -> Tuple[str, int]:
        log.warning("dashboard: schema missing or behind: %s", redact(str(exc).strip().splitlines()[0]))
        return _page(503, "Schema not ready",
                     "The awa schema is missing or behind in this database: run 'awa-pool migrate'.",
                     retry=True)

    @app.errorhandler(psycopg2.errors.QueryCanceled)
    def _slow(exc: Exception) -> Tuple[str, int]:
        return _page(503, "Query too slow", "The database did not answer within the dashboard's "
                     "statement timeout (10 s). Narrow the filter or try again.")

    @app.errorhandler(psycopg2.Error)
    def _db_error(exc: psycopg2.Error) -> Tuple[str, int]:
        log.error("dashboard: database error: %s", redact(str(exc).strip()))
        return _page(500, "Database error", "The database refused a query; the dashboard's log "
                     "has the details.")

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Any:
        if isinstance(exc, HTTPException):
            return _http(exc)
        log.exception("dashboard: unexpected error on %s %s", request.method, request.path)
        return _page(500, "Internal error", "Something went wrong; the dashboard's log has the details.")
