"""Schema migrations: numbered SQL files applied in order, once each.

Concurrent migrators serialize on a transaction-scoped advisory lock, so
several processes running `migrate` at once end with one correct schema.
Each migration runs in the same transaction as its version record.
"""
from __future__ import annotations

import logging
from typing import Any, List, Tuple

from .db import LOCK_CLASS, LOCK_MIGRATE, psycopg2_connection
from .errors import SchemaMissing
from .sql import QUERIES, load_migrations

log = logging.getLogger(__name__)

MIGRATIONS: List[Tuple[int, str, str]] = load_migrations()
LATEST_VERSION = MIGRATIONS[-1][0]


def applied_versions(conn: Any) -> List[int]:
    """Versions recorded in the database ([] when it has no awa schema)."""
    with psycopg2_connection(conn).cursor() as cur:
        cur.execute(QUERIES["migrations_table_exists"])
        if not cur.fetchone()[0]:
            return []
        cur.execute(QUERIES["applied_versions"])
        return [row[0] for row in cur.fetchall()]


def pending(conn: Any) -> List[Tuple[int, str]]:
    """(version, name) of the migrations this database still needs."""
    done = set(applied_versions(conn))
    return [(version, name) for version, name, _ in MIGRATIONS if version not in done]


def migrate(conn: Any) -> List[int]:
    """Apply every pending migration and commit; returns the versions applied.

    Takes its own transaction on `conn` (commits it), unlike the producer
    and admin functions, because DDL must not ride along with caller work.
    """
    raw = psycopg2_connection(conn)
    if raw.autocommit:
        raise ValueError("migrate() needs a connection that is not in autocommit mode")
    applied: List[int] = []
    try:
        with raw.cursor() as cur:
            # Lock first: even CREATE SCHEMA IF NOT EXISTS races without it.
            cur.execute(QUERIES["migrate_lock"], {"class": LOCK_CLASS, "key": LOCK_MIGRATE})
            cur.execute(QUERIES["bootstrap_migrations"])
            cur.execute(QUERIES["applied_versions"])
            done = {row[0] for row in cur.fetchall()}
            for version, name, text in MIGRATIONS:
                if version in done:
                    continue
                log.info("applying migration %04d_%s", version, name)
                cur.execute(text)
                cur.execute(QUERIES["record_migration"], {"version": version, "name": name})
                applied.append(version)
        raw.commit()
    except BaseException:
        raw.rollback()
        raise
    return applied


def require_current(conn: Any) -> None:
    """Raise SchemaMissing unless every migration has been applied."""
    missing = pending(conn)
    raw = psycopg2_connection(conn)
    if not raw.autocommit:
        raw.rollback()
    if missing:
        first = f"{missing[0][0]:04d}_{missing[0][1]}"
        raise SchemaMissing(
            f"the database schema is behind ({len(missing)} migration(s) pending, from {first}): "
            "run 'awa-pool migrate'")
