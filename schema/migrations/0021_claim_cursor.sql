-- A claim that costs the same however many jobs were claimed since the last
-- VACUUM (issue 23).
--
-- A claimed job leaves its old row version in the claim index (the partial
-- index jobs_hot_claim covers available jobs only) until VACUUM removes it,
-- and every claim's index scan started at the front of its queue, stepping
-- over all of them: with 200,000 jobs drained since the last VACUUM a claim
-- of 64 read 990 index pages (1-2 ms) instead of 5 (0.04 ms), so a deep
-- backlog drained slower the longer it drained. Autovacuum of a 5M-row
-- table comes seldom and takes long, so the deepest backlogs paid most.
--
-- awa.claim() takes an optional cursor: per priority level 1-4, the
-- (run_at, id) of the last job the caller claimed at that level, and scans
-- from just past it. A supervisor passes it while its claims come back full
-- (a backlog); jobs that become available behind a cursor (released,
-- rescued, promoted, or enqueued with a past run_at) are found by the next
-- claim without one, which a supervisor makes at least every half second,
-- whenever a claim with a cursor comes back short, and after it releases
-- jobs itself (awa_pool/claimer.py).

DROP FUNCTION awa.claim(text, integer, bigint, double precision, smallint, bigint);

-- Claim up to p_limit available jobs of one queue lane for a supervisor, in
-- (effective priority, run_at, id) order, from past the cursor when one is
-- given (p_after_run_at and p_after_id: per priority level 1-4, the epoch
-- run_at and id of the last job claimed at that level; NULL: from the
-- start). p_lease, when given, is the new lease of every claimed row:
-- supervisors pass a value unique to their claim (their id and a counter),
-- so even a claim lost in a server crash cannot have its lease handed out
-- again; without it the lease is bumped by one. Effective priority ages: a
-- job waiting longer than p_aging_s counts one level more urgent per
-- interval, down to 1. Each priority level is read from the claim index in
-- run_at order, so aging needs no sort of the whole backlog. Paused queues
-- yield nothing; rate-limited queues take tokens from the shared bucket
-- first. The deadline is built from the job's own timeout, else its task's
-- (awa.task_defaults), and the timeout returned is read off that deadline:
-- the supervisor enforces the value the database backstops.
CREATE FUNCTION awa.claim(
    p_queue text, p_limit integer, p_supervisor bigint,
    p_aging_s double precision DEFAULT 60, p_lane smallint DEFAULT 0, p_lease bigint DEFAULT NULL,
    p_after_run_at double precision[] DEFAULT NULL, p_after_id bigint[] DEFAULT NULL)
RETURNS TABLE (
    id bigint, kind text, queue text, args text, priority smallint, attempt integer,
    max_attempts integer, lease bigint, timeout_s double precision, tags text[],
    metadata text, created_at double precision, run_at double precision,
    progress text, callback_result text, batch_id bigint)
LANGUAGE plpgsql
SET enable_seqscan = off SET plan_cache_mode = force_generic_plan SET jit = off
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
                           -- past the caller's cursor at this level (none: from the start)
                           AND (h.run_at, h.id) > (coalesce(to_timestamp(p_after_run_at[lvl.p]),
                                                            TIMESTAMPTZ '-infinity'),
                                                   coalesce(p_after_id[lvl.p], 0))
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
               deadline = now() + make_interval(secs => coalesce(
                   j.timeout_s, (SELECT t.timeout_s FROM awa.task_defaults t WHERE t.kind = j.kind)))
         WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
        RETURNING j.id, j.kind, j.queue, j.args::text AS args, j.priority, j.attempt,
                  j.max_attempts, j.lease,
                  -- the supervisor's timeout is read off the deadline just set: one value
                  extract(epoch FROM j.deadline - now())::double precision AS timeout_s,
                  j.tags, j.metadata::text AS metadata,
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

REVOKE ALL ON FUNCTION awa.claim(text, integer, bigint, double precision, smallint, bigint,
                                 double precision[], bigint[]) FROM PUBLIC;

-- Roles given the worker profile before this migration may claim as before.
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee::regrole::text
               FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.oid = 'awa.complete_jobs(bigint[], bigint[], real[], real[], bigint[], jsonb)'::regprocedure
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION awa.claim(text, integer, bigint, double precision, '
                       'smallint, bigint, double precision[], bigint[]) TO %s', r);
    END LOOP;
END $$;
