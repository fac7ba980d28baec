"""Database set-up shared by the scripts in this folder (soak, chaos,
bench_shards, bench_enqueue, cpu_per_job, pg_cost)."""
from __future__ import annotations

from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

import psycopg2
from psycopg2 import sql


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at database `name`."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _admin(server_url: str, *statements: Any) -> Optional[tuple]:
    """Run statements outside a transaction; the last one's first row, if any."""
    conn = psycopg2.connect(server_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
            return cur.fetchone() if cur.description else None
    finally:
        conn.close()


def drop_database(server_url: str, name: str) -> None:
    _admin(server_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def create_database(server_url: str, name: str) -> str:
    """Create database `name`; returns the server's version ("PostgreSQL 18.6")."""
    row = _admin(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)), "SELECT version()")
    return row[0].split(" on ")[0]


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


def use_checkout(root: str) -> None:
    """Import awa_pool, and the SQL it runs, from the checkout at `root`
    instead of the installed package. Putting `root` first on sys.path is
    not enough: an editable install maps awa_pool.schema (migrations and
    queries) to the tree it was installed from. Call before importing awa_pool."""
    import importlib.util
    import os
    import sys

    schema = os.path.join(root, "schema")
    sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(
        "awa_pool.schema", os.path.join(schema, "__init__.py"), submodule_search_locations=[schema])
    module = importlib.util.module_from_spec(spec)
    sys.modules["awa_pool.schema"] = module
    spec.loader.exec_module(module)


def measure_repeatedly(server_url: str, name: str, repeats: int, measure, describe) -> list:
    """Call measure(url) `repeats` times, each on a fresh, unmigrated
    database `name` (dropped at the end), printing describe(result) after
    each run and, for several runs, describe() of the medians. Returns the
    results (dicts of numbers)."""
    import statistics

    runs = []
    try:
        for rep in range(repeats):
            runs.append(measure(fresh_database(server_url, name, migrate=False)))
            print(f"run {rep + 1}: {describe(runs[-1])}", flush=True)
    finally:
        drop_database(server_url, name)
    if len(runs) > 1:
        median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"median of {len(runs)}: {describe(median)}")
    return runs
