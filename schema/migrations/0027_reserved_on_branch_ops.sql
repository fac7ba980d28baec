-- A stand-in on branch ops only: version 27 belongs to a migration being
-- written in parallel on another branch (issue 41 left 0026 and 0027 to
-- the core work; this branch's own migration is 0028). Delete this file,
-- and its line in schema/current.sql's version list, when that one lands.
SELECT 1;
