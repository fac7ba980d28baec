-- Claim and completion keep one cached plan instead of planning each call.
--
-- PL/pgSQL plans a statement afresh ("custom plan") for its first five
-- calls and then keeps a generic one only if that one's estimated cost is
-- close to the custom plans'. The claim's generic plan never looked close
-- (its LIMIT and array sizes are parameters), so every claim was planned
-- again: 0.18 ms of PostgreSQL CPU per claim on a 0.45 ms call, measured
-- with pgbench on one job. In a CPU-bound pool that CPU comes out of the
-- children's share; at low rates it is pickup latency.
--
-- Migration 0009 made the claim's generic plan safe on any table size
-- (ids looked up by key through an array, no sequential scans), so it is
-- now forced. Completion gets the same treatment: it deletes its ids
-- through `id = ANY(p_ids)` (each outcome still matched on id and lease)
-- and may not scan sequentially, so a plan cached on an empty table looks
-- rows up by key once the table is full; tests/test_planning.py checks both.
--
-- Both also run without JIT: with sequential scans off, the one-row
-- awa.done_ring is still read by a sequential scan costed at the planner's
-- "disabled" penalty, which pushed the completion's estimate past
-- jit_above_cost, and compiling it took ~200 ms per call.
ALTER FUNCTION awa.claim(text, integer, bigint, double precision, smallint, bigint)
    SET plan_cache_mode = force_generic_plan SET jit = off;

CREATE OR REPLACE FUNCTION awa.complete_jobs(
    p_ids bigint[], p_leases bigint[], p_wall real[], p_cpu real[], p_rss bigint[],
    p_extra jsonb DEFAULT '{}')
RETURNS SETOF bigint
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH o AS (
        SELECT * FROM unnest(p_ids, p_leases, p_wall, p_cpu, p_rss)
            AS o(id, lease, wall_s, cpu_s, peak_rss)
    ),
    moved AS (
        -- The ids go to the primary key as an array (an index condition in
        -- any plan); the join to o pairs each row with its own lease.
        DELETE FROM awa.jobs_hot h USING o
         WHERE h.id = ANY (p_ids) AND h.id = o.id AND h.lease = o.lease
           AND h.state::text = 'running'
        RETURNING h.id, h.kind, h.queue, h.args, h.priority, h.run_at, h.created_at,
                  h.attempt, h.max_attempts, h.lease, h.timeout_s, h.tags, h.metadata,
                  h.unique_key, h.lane, h.ordering_key, h.batch_id, h.supervisor_id,
                  h.attempted_at, h.crashes, h.errors, h.attempt_log,
                  o.wall_s, o.cpu_s, o.peak_rss, h.progress, h.callback_id,
                  h.callback_timeout_at, h.callback_result
    )
    INSERT INTO awa.jobs_done (
        id, kind, queue, args, state, priority, run_at, created_at, attempt,
        max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
        ordering_key, batch_id, supervisor_id, attempted_at, deadline,
        finalized_at, crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
        progress, result, callback_id, callback_timeout_at, callback_result,
        dead_lettered, segment)
    SELECT m.id, kind, queue, args, 'completed', priority, run_at, created_at, attempt,
           max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
           ordering_key, batch_id, supervisor_id, attempted_at, NULL,
           now(), crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
           CASE WHEN x.e ? 'progress' THEN x.e->'progress' ELSE m.progress END,
           x.e->'result', callback_id, callback_timeout_at, callback_result,
           false, (SELECT r.current FROM awa.done_ring r)
      FROM moved m
      LEFT JOIN LATERAL (SELECT p_extra->(m.id::text) AS e) x ON true
    RETURNING jobs_done.id;
END $$;
