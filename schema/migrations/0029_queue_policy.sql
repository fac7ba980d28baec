-- Queue policy has one owner (SPEC §11): awa.queues, written by
-- awa_pool.set_queue and `awa-pool queues set`. A supervisor's --queue
-- rate=/dlq only fill a value nobody set, so dlq needs "unset": NULL, which
-- dead-letters nothing, as false did. Every supervisor started without
-- ,dlq used to write false, so an existing false is read as unset too.
ALTER TABLE awa.queues ALTER COLUMN dlq DROP NOT NULL, ALTER COLUMN dlq DROP DEFAULT;
UPDATE awa.queues SET dlq = NULL WHERE NOT dlq;

-- global_max: at most N of the queue's jobs running across the fleet,
-- decided in the claim (SPEC §11). Not a counter: the claim counts the
-- queue's running rows, so every outcome, rescue, cancel and timeout frees
-- its slot by leaving the running state, and there is nothing to drift.
ALTER TABLE awa.queues ADD COLUMN global_max integer CHECK (global_max IS NULL OR global_max > 0);

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
-- yield nothing; a queue with a global_max claims at most what the fleet's
-- running jobs of the queue leave of it (counted under the queue row's lock,
-- so the fleet's claims of the queue take turns: 0029); rate-limited queues
-- then take tokens from the shared bucket. The deadline is built from the
-- job's own timeout, else its task's (awa.task_defaults), and the timeout
-- returned is read off that deadline: the supervisor enforces the value the
-- database backstops. A job past its expires_at is skipped, so it never
-- starts even before the leader's next awa.expire_jobs cancels it.
CREATE OR REPLACE FUNCTION awa.claim(
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
    v_max     integer;
    v_want    integer := p_limit;
    v_got     integer;
BEGIN
    SELECT q.paused, q.rate_per_s, q.shards, q.global_max INTO v_paused, v_rate, v_shards, v_max
      FROM awa.queues q WHERE q.name = p_queue;
    IF v_paused THEN
        RETURN;
    END IF;
    IF v_shards > 1 THEN
        -- A lane is strict FIFO: its claims take turns (supervisors spread
        -- over lanes, so they rarely wait on each other).
        PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || E'\x1f' || p_lane, 1793));
    END IF;
    IF v_max IS NOT NULL THEN
        -- Fleet-wide: the lock makes the queue's claims take turns, and the
        -- count (a statement of its own, so a snapshot taken after the lock)
        -- sees every claim before this one. A slot frees when the outcome
        -- that ends the job's running state commits, whatever the outcome.
        PERFORM 1 FROM awa.queues q WHERE q.name = p_queue FOR UPDATE;
        v_want := least(v_want, v_max - (SELECT count(*) FROM awa.jobs_hot h
                                          WHERE h.state = 'running' AND h.queue = p_queue)::integer);
        IF v_want <= 0 THEN
            RETURN;
        END IF;
    END IF;
    IF v_rate IS NOT NULL THEN
        v_want := awa.take_tokens(p_queue, v_want);
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
                           -- an expired job never starts (awa.expire_jobs cancels it)
                           AND (h.expires_at IS NULL OR h.expires_at > now())
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
