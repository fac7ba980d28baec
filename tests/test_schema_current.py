"""schema/current.sql is the schema the migrations build, and a database made
from it counts as fully migrated.

One database is migrated from zero, another is made from current.sql, and
their catalogs are compared object by object (tests/schema_catalog.py). A
migration that does not update current.sql fails here, naming what differs.
"""
from __future__ import annotations

import subprocess
import sys
from importlib import resources
from typing import Any

import psycopg2
import pytest

from awa_pool.api.migrate import MIGRATIONS, migrate, pending, require_current
from helpers import connection, scalar
from schema_catalog import differences, snapshot

CURRENT_SQL = resources.files("awa_pool.schema").joinpath("current.sql").read_text(encoding="utf-8")


def _create_from_current(dsn: str) -> None:
    with connection(dsn) as conn:
        with conn.cursor() as cur:
            cur.execute(CURRENT_SQL)
        conn.commit()


def _migrate_from_zero(dsn: str) -> None:
    with connection(dsn) as conn:
        assert migrate(conn) == [version for version, _, _ in MIGRATIONS]


def _snapshot(dsn: str) -> Any:
    with connection(dsn) as conn:
        return snapshot(conn)


def test_current_sql_builds_the_schema_the_migrations_build(empty_dsn: str, other_empty_dsn: str) -> None:
    _migrate_from_zero(empty_dsn)
    _create_from_current(other_empty_dsn)
    migrated, current = _snapshot(empty_dsn), _snapshot(other_empty_dsn)

    # The comparison is only as good as what it reads: each kind of object
    # the schema has must have been found.
    for category, at_least in {"relations": 40, "columns": 150, "constraints": 30, "indexes": 40,
                               "sequences": 3, "types": 20, "functions": 45, "triggers": 5,
                               "views": 1, "schema": 1}.items():
        assert len(migrated[category]) >= at_least, f"only {len(migrated[category])} {category} read"
    assert migrated["functions"]["awa.claim(text,integer,bigint,double precision,smallint,bigint,double precision[],bigint[])"]["settings"]

    problems = differences(migrated, current, "migrations", "current.sql")
    if problems:
        pytest.fail(f"schema/current.sql no longer builds the schema of migrations 0001-"
                    f"{MIGRATIONS[-1][0]:04d}; update it (and its version list) with the migration:\n"
                    + "\n".join(problems), pytrace=False)


def test_a_database_made_from_current_sql_is_current(empty_dsn: str) -> None:
    _create_from_current(empty_dsn)
    with connection(empty_dsn) as conn:
        assert pending(conn) == []
        require_current(conn)
        assert migrate(conn) == []
    check = subprocess.run([sys.executable, "-m", "awa_pool", "migrate", "--check",
                            "--database-url", empty_dsn], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "up to date" in check.stdout, check.stderr
    # and it works: a job goes in and is claimed
    job_id = scalar(empty_dsn, "SELECT awa.insert_job('works')")
    assert scalar(empty_dsn, "SELECT id FROM awa.claim('default', 1, 1)") == job_id


# Changes the comparison must report, each with the object it must name.
CHANGES = {
    "CREATE OR REPLACE FUNCTION awa.iso_utc(t timestamptz) RETURNS text LANGUAGE sql IMMUTABLE"
    " AS $$ SELECT t::text $$": "functions: awa.iso_utc(timestamp with time zone) differs",
    "ALTER FUNCTION awa.rotate_done_ring(double precision, double precision, double precision, text,"
    " double precision) RESET jit": "functions: awa.rotate_done_ring(",
    "GRANT EXECUTE ON FUNCTION awa.backoff_s(integer) TO PUBLIC": "functions: awa.backoff_s(integer) differs",
    "GRANT SELECT ON awa.queues TO PUBLIC": "relations: queues differs",
    "ALTER TABLE awa.jobs_hot SET (fillfactor = 90)": "relations: jobs_hot differs",
    "ALTER TABLE awa.queues ALTER COLUMN dlq SET DEFAULT true": "columns: queues.dlq differs",
    "ALTER TABLE awa.cron_fires ADD COLUMN note text": "columns: cron_fires.note exists only in b",
    "ALTER TABLE awa.waiters ADD CONSTRAINT waiters_pid CHECK (pid > 0)":
        "constraints: waiters.waiters_pid exists only in b",
    "DROP INDEX awa.supervisors_alive": "indexes: supervisors_alive exists only in a",
    "ALTER SEQUENCE awa.batches_id_seq INCREMENT BY 2": "sequences: batches_id_seq differs",
    "ALTER TYPE awa.job_state ADD VALUE 'paused' BEFORE 'running'": "types: job_state differs",
    "DROP TRIGGER jobs_done_notify ON awa.jobs_done": "triggers: jobs_done.jobs_done_notify exists only in a",
    "CREATE OR REPLACE VIEW awa.jobs AS SELECT *, NULL::jsonb AS unique_opts FROM awa.jobs_hot"
    " UNION ALL SELECT *, NULL::jsonb FROM awa.jobs_done": "views: jobs differs",
    "COMMENT ON TABLE awa.queues IS 'queue settings'": "comments: table awa.queues exists only in b",
    "GRANT USAGE ON SCHEMA awa TO PUBLIC": "schema: awa differs",
    "UPDATE awa.done_ring SET segments = 9": "rows: done_ring differs",
}


def test_the_comparison_names_each_difference(empty_dsn: str, other_empty_dsn: str) -> None:
    _create_from_current(empty_dsn)
    _create_from_current(other_empty_dsn)
    assert differences(_snapshot(empty_dsn), _snapshot(other_empty_dsn)) == []
    with connection(other_empty_dsn, autocommit=True) as conn, conn.cursor() as cur:
        for statement in CHANGES:
            cur.execute(statement)
    report = "\n".join(differences(_snapshot(empty_dsn), _snapshot(other_empty_dsn)))
    missed = [statement for statement, named in CHANGES.items() if named not in report]
    assert not missed, f"not reported: {missed}\n{report}"
    # a body change is shown as a diff of the function's text
    assert "-    SELECT to_char(t AT TIME ZONE 'UTC'" in report and "+AS $function$ SELECT t::text" in report


def test_current_sql_is_not_applied_over_an_existing_schema(empty_dsn: str) -> None:
    _migrate_from_zero(empty_dsn)
    with pytest.raises(psycopg2.errors.DuplicateSchema):
        _create_from_current(empty_dsn)
