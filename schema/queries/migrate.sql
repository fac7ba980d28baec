-- Migrations bookkeeping.

-- name: bootstrap_migrations
-- Create the schema and the version table if this is a fresh database.
CREATE SCHEMA IF NOT EXISTS awa;
CREATE TABLE IF NOT EXISTS awa.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)

-- name: migrate_lock
-- Serialize concurrent migrators for the rest of the transaction.
SELECT pg_advisory_xact_lock(%(class)s, %(key)s)

-- name: applied_versions
SELECT version FROM awa.schema_migrations ORDER BY version

-- name: migrations_table_exists
SELECT to_regclass('awa.schema_migrations') IS NOT NULL

-- name: record_migration
INSERT INTO awa.schema_migrations (version, name) VALUES (%(version)s, %(name)s)
