"""Named SQL: every statement the code runs lives in schema/queries/*.sql.

A file holds one or more queries, each introduced by a line
`-- name: some_name` followed by optional `--` description lines. They are
parsed once, at import, into QUERIES.
"""
from __future__ import annotations

import re
from importlib import resources
from typing import Dict, List, Tuple

from psycopg2 import sql as pgsql

_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def _parse(text: str, source: str) -> List[Tuple[str, str]]:
    parts = _NAME_LINE.split(text)
    if parts[0].strip() and not all(line.startswith("--") for line in parts[0].strip().splitlines()):
        raise RuntimeError(f"{source}: SQL before the first '-- name:' line")
    found = []
    for name, body in zip(parts[1::2], parts[2::2]):
        # Whole-line comments describe the query; keep them out of the
        # statement (a '{}' or '%' in a comment would confuse formatting).
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";").strip()
        if not statement:
            raise RuntimeError(f"{source}: query {name!r} is empty")
        found.append((name, statement))
    return found


def load_queries() -> Dict[str, str]:
    queries: Dict[str, str] = {}
    folder = resources.files("awa_pool.schema").joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, statement in _parse(entry.read_text(encoding="utf-8"), entry.name):
            if name in queries:
                raise RuntimeError(f"query {name!r} is defined twice")
            queries[name] = statement
    return queries


def load_migrations() -> List[Tuple[int, str, str]]:
    """(version, name, sql) for every schema/migrations/NNNN_name.sql, in order."""
    folder = resources.files("awa_pool.schema").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [version for version, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


QUERIES: Dict[str, str] = load_queries()


def identifier(name: str) -> pgsql.Identifier:
    """A safely quoted SQL identifier (for the rare statement that needs one)."""
    return pgsql.Identifier(name)
