-- Keeping the claim path steady under sustained load.

-- 1. Vacuum never truncates the tables the claim path touches. After a
-- burst the last pages of awa.jobs_hot are empty, and a plain VACUUM (the
-- leader's or autovacuum's) then gives them back to the operating system,
-- which takes an ACCESS EXCLUSIVE lock: while vacuum holds it, every claim,
-- enqueue and completion waits. In an 8,000 jobs/s soak that showed as pickup
-- p99 spikes of 200 ms. These tables refill with every burst, so the space is
-- better kept.
ALTER TABLE awa.jobs_hot SET (vacuum_truncate = false);
ALTER TABLE awa.jobs_deferred SET (vacuum_truncate = false);
ALTER TABLE awa.queues SET (vacuum_truncate = false);

-- 2. The hot-path functions plan their statements for the table as it is on
-- each call. PL/pgSQL caches a generic plan after five calls; a supervisor
-- that starts on an empty queue caches one costed for a one-row jobs_hot
-- (the claim's UPDATE then walked the whole primary key once per claim), and
-- keeps it until statistics change, which under that very load may take a
-- minute: the soak saw claims of 2-3 s and a backlog of 200,000 jobs.
-- Planning these statements costs well under 0.1 ms per call.
ALTER FUNCTION awa.claim(text, integer, bigint, double precision, smallint, bigint)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION awa.complete_jobs(bigint[], bigint[], real[], real[], bigint[], jsonb)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION awa.settle_jobs(jsonb, integer)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION awa.promote_due(integer)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION awa.finish_attempt(bigint, bigint, text, text, text, double precision, jsonb, real,
                                  real, bigint, jsonb, integer)
    SET plan_cache_mode = force_custom_plan;
