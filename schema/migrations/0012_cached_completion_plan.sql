-- Batch completion keeps one cached plan instead of being planned per call.
--
-- 0010 left complete_jobs planned on every call: its generic plan, costed
-- for ten outcomes, ran the DELETE as a nested loop that rescanned the
-- outcome arrays once per row, quadratic in the flush size. Planning per
-- call cost about 0.4 ms of PostgreSQL CPU per flush on the slowest VM
-- measured, a quarter of a 40-job flush's completion CPU.
--
-- The DELETE now names its rows twice: `h.id = ANY (p_ids)` reads them by
-- primary key (sequential scans off, so no statistics can make a scan look
-- cheaper), and the join on (id, lease) with the outcome rows must be a hash
-- or merge join (nested loops off), linear in the flush size whatever the
-- estimates. The join also keeps each outcome paired with its own lease when
-- one id appears twice in a flush. Without JIT, as in 0010.
CREATE OR REPLACE FUNCTION awa.complete_jobs(
    p_ids bigint[], p_leases bigint[], p_wall real[], p_cpu real[], p_rss bigint[],
    p_extra jsonb DEFAULT '{}')
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH o AS (
        SELECT * FROM unnest(p_ids, p_leases, p_wall, p_cpu, p_rss)
            AS o(id, lease, wall_s, cpu_s, peak_rss)
    ),
    moved AS (
        -- state::text: not the partial index of running rows (see 0003)
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

-- CREATE OR REPLACE cleared 0009's settings; these replace them.
ALTER FUNCTION awa.complete_jobs(bigint[], bigint[], real[], real[], bigint[], jsonb)
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
    SET enable_nestloop = off SET jit = off;
