-- Server-level statements (databases, connections).

-- name: database_exists
SELECT 1 FROM pg_database WHERE datname = %(name)s

-- name: create_database
-- The braces placeholder below is a quoted identifier filled in with psycopg2.sql
-- (comment lines are part of the statement text: no braces in them).
CREATE DATABASE {}

-- name: clone_database
-- A test database: a file-level copy of a migrated template (awa_pool.testdb).
-- Both placeholders are quoted identifiers filled in with psycopg2.sql.
CREATE DATABASE {} TEMPLATE {}

-- name: drop_database
-- FORCE ends sessions a test left open (PostgreSQL 13 and later).
DROP DATABASE IF EXISTS {} WITH (FORCE)

-- name: rename_database
ALTER DATABASE {} RENAME TO {}

-- name: mark_test_template
-- The date tells a later build which templates nobody used for a while.
COMMENT ON DATABASE {} IS %(comment)s

-- name: stale_test_templates
-- Test templates of other schema versions, last used before the cut-off.
SELECT d.datname
  FROM pg_database d
 WHERE d.datname <> %(keep)s
   AND shobj_description(d.oid, 'pg_database') LIKE %(marker)s || '%%'
   AND split_part(shobj_description(d.oid, 'pg_database'), %(marker)s, 2)::date < %(cutoff)s::date

-- name: server_lock
-- Session-level: CREATE DATABASE cannot run inside a transaction. The wait
-- is bounded, so a stuck holder gives an error instead of a hang.
SET lock_timeout = '120s'; SELECT pg_advisory_lock(%(class)s, %(key)s)

-- name: server_unlock
SELECT pg_advisory_unlock(%(class)s, %(key)s)
