-- Server-level statements (databases, connections).

-- name: database_exists
SELECT 1 FROM pg_database WHERE datname = %(name)s

-- name: create_database
-- The braces placeholder below is a quoted identifier filled in with psycopg2.sql
-- (comment lines are part of the statement text: no braces in them).
CREATE DATABASE {}
