"""Database set-up shared by the scripts in this folder (soak, chaos,
bench_shards, bench_enqueue)."""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg2
from psycopg2 import sql


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at database `name`."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def drop_database(server_url: str, name: str) -> None:
    admin = psycopg2.connect(server_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    finally:
        admin.close()


def create_database(server_url: str, name: str) -> str:
    """Create database `name`; returns the server's version ("PostgreSQL 18.6")."""
    admin = psycopg2.connect(server_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            cur.execute("SELECT version()")
            return cur.fetchone()[0].split(" on ")[0]
    finally:
        admin.close()


def fresh_database(server_url: str, name: str, *, migrate: bool = True) -> str:
    """Drop database `name` if it exists, create it (migrated, unless told
    not to) and return its URL."""
    import awa_pool

    drop_database(server_url, name)
    create_database(server_url, name)
    url = with_database(server_url, name)
    if migrate:
        conn = psycopg2.connect(url)
        try:
            awa_pool.migrate(conn)
        finally:
            conn.close()
    return url
