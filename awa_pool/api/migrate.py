"""Schema migrations: numbered SQL files applied in order, once each.

Concurrent migrators serialize on a transaction-scoped advisory lock, so
several processes running `migrate` at once end with one correct schema.
Each migration runs in the same transaction as its version record. On a
bare driver connection `migrate` commits; on a Django or SQLAlchemy handle
the framework owns the transaction, and the caller commits.
"""
from __future__ import annotations

import logging
from typing import Any, List, Tuple

from ..core.db import LOCK_CLASS, LOCK_MIGRATE
from .drivers import adapt
from ..core.errors import SchemaMissing
from ..core.sql import QUERIES, load_migrations

log = logging.getLogger(__name__)

MIGRATIONS: List[Tuple[int, str, str]] = load_migrations()
LATEST_VERSION = MIGRATIONS[-1][0]


def applied_versions(conn: Any) -> List[int]:
    """Versions recorded in the database ([] when it has no awa schema)."""
    with adapt(conn).cursor() as cur:
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
    """Apply every pending migration; returns the versions applied.

    On a psycopg2 or psycopg 3 connection or cursor it commits (unlike the
    producer and admin functions: DDL must not ride along with caller work)
    and rolls back on error. With Django's connection (inside atomic()) or an
    SQLAlchemy Connection or Session, the framework owns the transaction:
    the migrations join it and the caller commits.
    """
    link = adapt(conn)
    if link.autocommit:
        hint = " (with Django, call it inside transaction.atomic())" if link.framework == "django" else ""
        raise ValueError(f"migrate() needs a connection that is not in autocommit mode{hint}")
    if link.framework is not None:
        return _apply(link)
    try:
        applied = _apply(link)
        link.commit()
    except BaseException:
        link.rollback()
        raise
    return applied


def _apply(link: Any) -> List[int]:
    applied: List[int] = []
    with link.cursor() as cur:
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
    return applied


def require_current(conn: Any) -> None:
    """Raise SchemaMissing unless every migration has been applied."""
    missing = pending(conn)
    link = adapt(conn)
    if not link.autocommit:
        link.rollback()
    if missing:
        first = f"{missing[0][0]:04d}_{missing[0][1]}"
        raise SchemaMissing(
            f"the database schema is behind ({len(missing)} migration(s) pending, from {first}): "
            "run 'awa-pool migrate'")
