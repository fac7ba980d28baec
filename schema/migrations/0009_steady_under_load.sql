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

-- 2. No hot-path statement can be planned into a scan of the whole table.
-- PL/pgSQL caches a generic plan after five calls, costed for the table as
-- it was then. A supervisor that started on an empty queue cached a claim
-- whose UPDATE joined the picked ids by walking the whole primary key, and
-- kept it while the queue filled: the soak saw claims of 2-3 s and a backlog
-- of 200,000 jobs. The claim now updates its picked ids through an id array
-- and may not scan sequentially, so even a plan made on an empty table looks
-- the rows up by key; it keeps its cached plan (planning it on every call
-- cost 0.5 ms of pickup latency). Completion (a batch per statement, on the
-- supervisor's background thread), the failure path (one job per statement)
-- and the leader's promotion are planned afresh on each call instead.
CREATE OR REPLACE FUNCTION awa.claim(
    p_queue text, p_limit integer, p_supervisor bigint,
    p_aging_s double precision DEFAULT 60, p_lane smallint DEFAULT 0, p_lease bigint DEFAULT NULL)
RETURNS TABLE (
    id bigint, kind text, queue text, args text, priority smallint, attempt integer,
    max_attempts integer, lease bigint, timeout_s double precision, tags text[],
    metadata text, created_at double precision, run_at double precision,
    progress text, callback_result text, batch_id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_paused  boolean;
    v_rate    double precision;
    v_shards  smallint;
    v_want    integer := p_limit;
    v_got     integer;
BEGIN
    SELECT q.paused, q.rate_per_s, q.shards INTO v_paused, v_rate, v_shards
      FROM awa.queues q WHERE q.name = p_queue;
    IF v_paused THEN
        RETURN;
    END IF;
    IF v_shards > 1 THEN
        -- A lane is strict FIFO: its claims take turns (supervisors spread
        -- over lanes, so they rarely wait on each other).
        PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || E'\x1f' || p_lane, 1793));
    END IF;
    IF v_rate IS NOT NULL THEN
        v_want := awa.take_tokens(p_queue, p_limit);
    END IF;
    IF v_want <= 0 THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH cand AS (
        SELECT c.id, c.priority, c.run_at
          FROM generate_series(1, 4) AS lvl(p),
               LATERAL (SELECT h.id, h.priority, h.run_at
                          FROM awa.jobs_hot h
                         WHERE h.state = 'available' AND h.queue = p_queue
                           AND h.lane = p_lane AND h.priority = lvl.p
                         ORDER BY h.run_at, h.id
                         LIMIT v_want
                         FOR UPDATE SKIP LOCKED) c
    ),
    picked AS (
        SELECT cand.id, row_number() OVER (
                   ORDER BY CASE WHEN p_aging_s > 0
                                 THEN greatest(1, cand.priority - floor(extract(epoch FROM now() - cand.run_at) / p_aging_s))
                                 ELSE cand.priority END,
                            cand.run_at, cand.id) AS ord
          FROM cand
         ORDER BY ord
         LIMIT v_want
    ),
    claimed AS (
        UPDATE awa.jobs_hot j
           SET state = 'running', attempt = j.attempt + 1, lease = coalesce(p_lease, j.lease + 1),
               attempted_at = clock_timestamp(), supervisor_id = p_supervisor,
               deadline = CASE WHEN j.timeout_s IS NOT NULL THEN now() + make_interval(secs => j.timeout_s) END
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind, j.queue, j.args::text AS args, j.priority, j.attempt,
                  j.max_attempts, j.lease, j.timeout_s, j.tags, j.metadata::text AS metadata,
                  extract(epoch FROM j.created_at)::double precision AS created_at,
                  extract(epoch FROM j.run_at)::double precision AS run_at,
                  j.progress::text AS progress, j.callback_result::text AS callback_result, j.batch_id
    )
    -- Rows come back in claim order: the UPDATE's own order is arbitrary.
    SELECT c.id, c.kind, c.queue, c.args, c.priority, c.attempt, c.max_attempts, c.lease,
           c.timeout_s, c.tags, c.metadata, c.created_at, c.run_at, c.progress,
           c.callback_result, c.batch_id
      FROM claimed c JOIN picked p ON p.id = c.id
     ORDER BY p.ord;
END $$;

ALTER FUNCTION awa.complete_jobs(bigint[], bigint[], real[], real[], bigint[], jsonb)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION awa.settle_jobs(jsonb, integer)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION awa.finish_attempt(bigint, bigint, text, text, text, double precision, jsonb, real,
                                  real, bigint, jsonb, integer)
    SET plan_cache_mode = force_custom_plan;
ALTER FUNCTION awa.promote_due(integer)
    SET plan_cache_mode = force_custom_plan;
