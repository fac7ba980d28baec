-- Placeholder: version 26 belongs to the worker-core rewrite, developed on
-- another branch at the same time. awa_pool applies migrations 1..n with
-- no gap, so this branch, whose own migration is 0027, holds the number
-- with an empty migration. Delete this file (and its line in
-- schema/current.sql's version list) when the core work's 0026 is merged.
SELECT 1;
