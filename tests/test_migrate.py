"""Migrations: ordered, recorded, idempotent, safe under concurrency."""
from __future__ import annotations

import subprocess
import sys

import psycopg2
import pytest

from awa_pool.api.migrate import LATEST_VERSION, MIGRATIONS, applied_versions, migrate, pending, require_current
from awa_pool.core.errors import SchemaMissing
from helpers import query, scalar

pytestmark = pytest.mark.embedded_smoke


def test_migrate_fresh_database_then_idempotent(empty_dsn: str) -> None:
    conn = psycopg2.connect(empty_dsn)
    try:
        assert applied_versions(conn) == []
        assert [v for v, _ in pending(conn)] == [v for v, _, _ in MIGRATIONS]
        assert migrate(conn) == list(range(1, LATEST_VERSION + 1))
        assert migrate(conn) == []
        assert applied_versions(conn) == list(range(1, LATEST_VERSION + 1))
        require_current(conn)
    finally:
        conn.close()


def test_require_current_on_empty_database(empty_dsn: str) -> None:
    conn = psycopg2.connect(empty_dsn)
    try:
        with pytest.raises(SchemaMissing, match="awa-pool migrate"):
            require_current(conn)
    finally:
        conn.close()


def test_four_concurrent_migrators_end_with_one_schema(empty_dsn: str) -> None:
    code = "import sys, psycopg2, awa_pool; c = psycopg2.connect(sys.argv[1]); print(awa_pool.migrate(c))"
    procs = [subprocess.Popen([sys.executable, "-c", code, empty_dsn], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    applied = [out.strip() for out, _ in outputs]
    # exactly one process applied everything; the others found nothing to do
    assert sorted(applied, key=len) == ["[]"] * 3 + [str(list(range(1, LATEST_VERSION + 1)))]
    assert query(empty_dsn, "SELECT version FROM awa.schema_migrations ORDER BY 1") == [
        (v,) for v in range(1, LATEST_VERSION + 1)]
    assert scalar(empty_dsn, "SELECT awa.insert_job('works')") > 0


def test_migrate_check_reports_behind(empty_dsn: str, dsn: str) -> None:

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "awa_pool", *argv], capture_output=True, text=True,
                              timeout=60)

    behind = run("migrate", "--check", "--database-url", empty_dsn)
    assert behind.returncode == 1
    assert "schema is behind" in behind.stderr and "0001_tables" in behind.stderr
    assert len(behind.stderr.strip().splitlines()) == 1 and "Traceback" not in behind.stderr

    # a database missing only its newest migration is behind too
    query(dsn, "DELETE FROM awa.schema_migrations WHERE version = %s", (LATEST_VERSION,))
    partial = run("migrate", "--check", "--database-url", dsn)
    assert partial.returncode == 1 and f"{LATEST_VERSION:04d}" in partial.stderr

    ok = run("migrate", "--database-url", empty_dsn)
    assert ok.returncode == 0 and "applied" in ok.stdout
    current = run("migrate", "--check", "--database-url", empty_dsn)
    assert current.returncode == 0 and "up to date" in current.stdout
