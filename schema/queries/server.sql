-- Server-level statements (databases, connections).

-- name: database_exists
SELECT 1 FROM pg_database WHERE datname = %(name)s

-- name: create_database
-- The {} is a quoted identifier filled in with psycopg2.sql.
CREATE DATABASE {}
