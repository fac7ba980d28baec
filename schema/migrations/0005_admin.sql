-- Admin and callback transitions. Each takes the job out of its table under
-- a row lock and puts it back where its new state belongs, so it races
-- safely with supervisors and the leader: whoever takes the row first wins,
-- the other finds nothing.

-- take_job for admin calls that race with supervisors: a job that moves
-- from one table to another while we look (a snooze or a release puts it
-- back in the hot table as a new row) is missed by one statement's snapshot,
-- so look again while it still exists in one of p_states. NULL when it is
-- absent or in none of them.
CREATE FUNCTION awa.take_moving_job(p_id bigint, p_states awa.job_state[]) RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
    v_state awa.job_state;
BEGIN
    FOR i IN 1..10 LOOP
        j := awa.take_job(p_id, p_states);
        IF j.id IS NOT NULL THEN
            RETURN j;
        END IF;
        v_state := awa.job_state_of(p_id);  -- a new snapshot: where is it now?
        IF v_state IS NULL OR NOT v_state = ANY (p_states) THEN
            RETURN NULL;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- Cancel a job that is not terminal yet. A running job is cancelled at once
-- in the database; its supervisor hears it on awa_cancel, tells the handler
-- (ctx.cancel_requested) and kills the child after a grace period. Returns
-- the job's state afterwards (NULL for an unknown id).
CREATE FUNCTION awa.cancel_job(p_id bigint, p_reason text DEFAULT 'cancelled by an operator')
RETURNS awa.job_state
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
    v_was_running boolean;
BEGIN
    j := awa.take_moving_job(p_id, ARRAY['scheduled', 'available', 'running', 'retryable',
                                         'waiting_external']::awa.job_state[]);
    IF j.id IS NULL THEN
        RETURN awa.job_state_of(p_id);
    END IF;
    v_was_running := j.state = 'running';
    j := awa.apply_outcome(j, 'cancel', p_reason);
    PERFORM awa.put_job(j);
    IF v_was_running THEN
        PERFORM pg_notify('awa_cancel', json_build_object('id', j.id, 'lease', j.lease)::text);
    END IF;
    RETURN j.state;
END $$;

-- Run a job again now: failed or cancelled jobs get fresh attempts;
-- scheduled and retryable jobs just stop waiting; a batch follow-up stays
-- held while its batch is not done. Returns the new state, or
-- the current one when there is nothing to retry (NULL for an unknown id).
CREATE FUNCTION awa.retry_job(p_id bigint) RETURNS awa.job_state
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    j := awa.take_moving_job(p_id, ARRAY['scheduled', 'retryable', 'failed', 'cancelled']::awa.job_state[]);
    IF j.id IS NULL THEN
        RETURN awa.job_state_of(p_id);
    END IF;
    IF j.state IN ('failed', 'cancelled') THEN
        j.attempt := 0;
        j.crashes := 0;
        j.finalized_at := NULL;
        j.dead_lettered := false;
        IF j.batch_id IS NOT NULL THEN  -- it will report to its batch again
            UPDATE awa.batches SET remaining = remaining + 1 WHERE id = j.batch_id AND remaining > 0;
        END IF;
    END IF;
    IF j.run_at = 'infinity' AND EXISTS (
            SELECT 1 FROM awa.batches b
             WHERE b.id = (j.metadata->>'awa:then_of')::bigint AND b.remaining > 0) THEN
        j.state := 'scheduled';  -- a held batch follow-up keeps waiting for its batch
        PERFORM awa.put_job(j);
        RETURN j.state;
    END IF;
    j.state := 'available';
    j.run_at := now();
    PERFORM awa.put_job(j);
    RETURN j.state;
END $$;

-- Callback ids a job replaced by registering a new one (a later attempt):
-- remembered so that a late call with an old id says "already used", not
-- "unknown". The leader forgets them after 30 days.
CREATE TABLE awa.callbacks_retired (
    callback_id uuid PRIMARY KEY,
    job_id      bigint NOT NULL,
    retired_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX callbacks_retired_at ON awa.callbacks_retired (retired_at);

CREATE FUNCTION awa.retire_callback() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO awa.callbacks_retired (callback_id, job_id) VALUES (OLD.callback_id, OLD.id)
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

-- Only register_callback sets callback_id on the hot table, so this never
-- runs on the claim or completion paths.
CREATE TRIGGER jobs_hot_callback_replaced AFTER UPDATE OF callback_id ON awa.jobs_hot
    FOR EACH ROW WHEN (OLD.callback_id IS NOT NULL AND OLD.callback_id IS DISTINCT FROM NEW.callback_id)
    EXECUTE FUNCTION awa.retire_callback();

-- Find the job a callback belongs to and take it (row-locked), if the
-- callback is still live: the job waits on it (waiting_external), or the
-- attempt that registered it still runs (its handler has not returned
-- WaitForCallback yet; callback_timeout_at is cleared by every outcome but
-- a wait, and by every resolution, so an older attempt's callback never
-- matches a newer attempt). Raises a clear error for unknown ids and for
-- ids whose job has moved on.
CREATE FUNCTION awa.take_callback(p_callback uuid)
RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    FOR i IN 1..10 LOOP
        DELETE FROM awa.jobs_deferred d
         WHERE d.callback_id = p_callback AND d.state = 'waiting_external'
        RETURNING d.* INTO j;
        IF FOUND THEN RETURN j; END IF;
        DELETE FROM awa.jobs_hot h
         WHERE h.callback_id = p_callback AND h.state = 'running' AND h.callback_timeout_at IS NOT NULL
        RETURNING h.* INTO j;
        IF FOUND THEN RETURN j; END IF;
        -- The job may have parked between the two statements (running ->
        -- waiting_external): look again while a live row exists.
        EXIT WHEN NOT EXISTS (SELECT 1 FROM awa.jobs_deferred d
                               WHERE d.callback_id = p_callback AND d.state = 'waiting_external')
              AND NOT EXISTS (SELECT 1 FROM awa.jobs_hot h
                               WHERE h.callback_id = p_callback AND h.state = 'running'
                                 AND h.callback_timeout_at IS NOT NULL);
    END LOOP;
    IF EXISTS (SELECT 1 FROM awa.jobs_hot WHERE callback_id = p_callback)
       OR EXISTS (SELECT 1 FROM awa.jobs_deferred WHERE callback_id = p_callback)
       OR EXISTS (SELECT 1 FROM awa.jobs_done WHERE callback_id = p_callback)
       OR EXISTS (SELECT 1 FROM awa.callbacks_retired WHERE callback_id = p_callback) THEN
        RAISE EXCEPTION 'callback % was already used (its job has moved on)', p_callback
            USING ERRCODE = 'P0002', HINT = 'awa:used_callback';
    END IF;
    RAISE EXCEPTION 'unknown callback id %', p_callback
        USING ERRCODE = 'P0002', HINT = 'awa:unknown_callback';
END $$;

-- Resolve a callback. p_action: complete (payload becomes the result), fail
-- (a failed attempt: retried with backoff while attempts remain), retry
-- (run the handler again now, as a new attempt), resume (run the handler
-- again with ctx.callback_result = payload; the attempt is not counted).
-- A callback resolved before its handler returned WaitForCallback applies
-- the same way; the handler's own outcome then matches no row (the lease
-- guard wants a running row) and is dropped.
CREATE FUNCTION awa.resolve_callback(p_callback uuid, p_action text, p_payload jsonb DEFAULT NULL,
                                     p_error text DEFAULT NULL)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    IF p_action NOT IN ('complete', 'fail', 'retry', 'resume') THEN
        RAISE EXCEPTION 'unknown callback action %', p_action;
    END IF;
    j := awa.take_callback(p_callback);
    IF p_action = 'complete' THEN
        j := awa.apply_outcome(j, 'completed', p_result => p_payload);
    ELSIF p_action = 'fail' THEN
        j := awa.apply_outcome(j, 'failed', coalesce(p_error, 'failed by an external system'));
    ELSE
        j.state := 'available';
        j.run_at := now();
        j.deadline := NULL;
        IF p_action = 'resume' THEN
            j.callback_result := p_payload;
            j.attempt := greatest(j.attempt - 1, 0);  -- the resumed run continues this attempt
        ELSE
            j.callback_result := NULL;
        END IF;
    END IF;
    j.callback_timeout_at := NULL;
    PERFORM awa.put_job(j);
    job_id := j.id;
    new_state := j.state;
    RETURN NEXT;
END $$;

-- Leader: callbacks past their timeout count as failed attempts (and
-- retired callback ids older than 30 days are forgotten).
CREATE FUNCTION awa.expire_callbacks(p_limit integer DEFAULT 500)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    j awa.jobs_hot;
BEGIN
    DELETE FROM awa.callbacks_retired c
     WHERE c.callback_id IN (SELECT x.callback_id FROM awa.callbacks_retired x
                              WHERE x.retired_at < now() - interval '30 days'
                              LIMIT p_limit);
    FOR r IN
        SELECT d.id FROM awa.jobs_deferred d
         WHERE d.state = 'waiting_external' AND d.callback_timeout_at < now()
         ORDER BY d.callback_timeout_at
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    LOOP
        DELETE FROM awa.jobs_deferred d WHERE d.id = r.id AND d.state = 'waiting_external'
        RETURNING d.* INTO j;
        CONTINUE WHEN NOT FOUND;
        j := awa.apply_outcome(j, 'callback_timeout', 'callback timed out');
        j.callback_timeout_at := NULL;
        PERFORM awa.put_job(j);
        job_id := j.id;
        new_state := j.state;
        RETURN NEXT;
    END LOOP;
END $$;

-- Tell waiters (awa_pool.wait) that jobs reached a terminal state: one
-- NOTIFY per statement, and only while someone waits. (A NOTIFY takes a
-- cluster-wide lock at commit: every completion batch taking it would queue
-- behind every producer's commit.)
CREATE FUNCTION awa.notify_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM awa.waiters) THEN
        PERFORM pg_notify('awa_done', '');
    END IF;
    RETURN NULL;
END $$;

-- A callback id must survive a server crash once its handler has it: this
-- one transaction commits synchronously whatever the session's setting.
CREATE FUNCTION awa.register_callback(p_id bigint, p_lease bigint, p_timeout_s double precision)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_callback text;
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    UPDATE awa.jobs_hot
       SET callback_id = gen_random_uuid(),
           callback_timeout_at = now() + make_interval(secs => p_timeout_s)
     WHERE id = p_id AND lease = p_lease AND state = 'running'
    RETURNING callback_id::text INTO v_callback;
    RETURN v_callback;
END $$;

CREATE TRIGGER jobs_done_notify AFTER INSERT ON awa.jobs_done
    FOR EACH STATEMENT EXECUTE FUNCTION awa.notify_done();

-- Per-queue counts for queue_stats: hot and deferred rows are counted
-- exactly; terminal history through its (queue, state, finalized_at) index.
CREATE FUNCTION awa.queue_counts()
RETURNS TABLE (queue text, state text, n bigint, oldest_available timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT h.queue, h.state::text, count(*),
           min(h.run_at) FILTER (WHERE h.state = 'available')
      FROM awa.jobs_hot h GROUP BY 1, 2
    UNION ALL
    SELECT d.queue, d.state::text, count(*), NULL FROM awa.jobs_deferred d GROUP BY 1, 2
    UNION ALL
    SELECT x.queue, x.state::text, count(*), NULL FROM awa.jobs_done x GROUP BY 1, 2
$$;

-- Split a queue into p_shards lanes (1 = one strict-FIFO lane). Jobs not yet
-- claimed move to their new lane at once: the same ordering key always maps
-- to the same lane, so per-key order survives the change.
CREATE FUNCTION awa.set_queue_shards(p_queue text, p_shards smallint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    m integer;
BEGIN
    INSERT INTO awa.queues (name, shards) VALUES (p_queue, p_shards)
    ON CONFLICT (name) DO UPDATE SET shards = excluded.shards;
    UPDATE awa.jobs_hot SET lane = awa.lane_of(p_shards, ordering_key)
     WHERE queue = p_queue AND state = 'available';
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE awa.jobs_deferred SET lane = awa.lane_of(p_shards, ordering_key)
     WHERE queue = p_queue;
    GET DIAGNOSTICS m = ROW_COUNT;
    RETURN n + m;
END $$;
