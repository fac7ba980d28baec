"""What every awa-pool command shares: the database URL and --json options,
the one-line user error, printing, and opening a connection (the embedded
server when no URL is configured). Only the cli*.py modules print or exit.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import typer

from . import cli_output as out
from ..core import db, embedded

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
    from ..api.migrate import require_current

    conn = db.connect(resolve_url(database_url), autocommit=autocommit, connect_timeout=5)
    try:
        if require_schema:
            require_current(conn)
        yield conn
    finally:
        conn.close()


def duration(value: Optional[str], what: str) -> Optional[float]:
    from ..core.config import parse_duration

    return None if value is None else parse_duration(value, what=what)


def parse_json_object(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise UserError(f"{what} must be a JSON object like '{{\"key\": 1}}', got {type(value).__name__}")
    return value
