-- Admin and callback transitions. Each takes the job out of its table under
-- a row lock and puts it back where its new state belongs, so it races
-- safely with supervisors and the leader: whoever takes the row first wins,
-- the other finds nothing.

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
    j := awa.take_job(p_id, ARRAY['scheduled', 'available', 'running', 'retryable',
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
-- scheduled and retryable jobs just stop waiting. Returns the new state, or
-- the current one when there is nothing to retry (NULL for an unknown id).
CREATE FUNCTION awa.retry_job(p_id bigint) RETURNS awa.job_state
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    j := awa.take_job(p_id, ARRAY['scheduled', 'retryable', 'failed', 'cancelled']::awa.job_state[]);
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
    IF j.run_at = 'infinity' THEN
        RETURN 'scheduled';  -- a held batch follow-up waits for its batch
    END IF;
    j.state := 'available';
    j.run_at := now();
    PERFORM awa.put_job(j);
    RETURN j.state;
END $$;

-- Find the job waiting on a callback and take it (row-locked). Raises a
-- clear error for unknown or already-resolved ids.
CREATE FUNCTION awa.take_callback(p_callback uuid, p_states awa.job_state[])
RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    DELETE FROM awa.jobs_deferred d
     WHERE d.callback_id = p_callback AND d.state = ANY (p_states)
    RETURNING d.* INTO j;
    IF FOUND THEN RETURN j; END IF;
    DELETE FROM awa.jobs_hot h
     WHERE h.callback_id = p_callback AND h.state = ANY (p_states)
    RETURNING h.* INTO j;
    IF FOUND THEN RETURN j; END IF;
    IF EXISTS (SELECT 1 FROM awa.jobs_hot WHERE callback_id = p_callback)
       OR EXISTS (SELECT 1 FROM awa.jobs_deferred WHERE callback_id = p_callback)
       OR EXISTS (SELECT 1 FROM awa.jobs_done WHERE callback_id = p_callback) THEN
        RAISE EXCEPTION 'callback % was already used (its job has moved on)', p_callback
            USING ERRCODE = 'P0002', HINT = 'awa:used_callback';
    END IF;
    RAISE EXCEPTION 'unknown callback id %', p_callback
        USING ERRCODE = 'P0002', HINT = 'awa:unknown_callback';
END $$;

-- Resolve a callback. p_action: complete (payload becomes the result), fail
-- (a failed attempt: retried with backoff while attempts remain), retry
-- (run the handler again now), resume (run the handler again with
-- ctx.callback_result = payload; the attempt is not counted).
CREATE FUNCTION awa.resolve_callback(p_callback uuid, p_action text, p_payload jsonb DEFAULT NULL,
                                     p_error text DEFAULT NULL)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    IF p_action = 'complete' THEN
        j := awa.take_callback(p_callback, ARRAY['waiting_external', 'running']::awa.job_state[]);
        j := awa.apply_outcome(j, 'completed', p_result => p_payload);
    ELSIF p_action = 'fail' THEN
        j := awa.take_callback(p_callback, ARRAY['waiting_external', 'running']::awa.job_state[]);
        j := awa.apply_outcome(j, 'failed', coalesce(p_error, 'failed by an external system'));
    ELSIF p_action IN ('retry', 'resume') THEN
        j := awa.take_callback(p_callback, ARRAY['waiting_external']::awa.job_state[]);
        j.state := 'available';
        j.run_at := now();
        IF p_action = 'resume' THEN
            j.callback_result := p_payload;
            j.attempt := greatest(j.attempt - 1, 0);  -- the resumed run continues this attempt
        ELSE
            j.callback_result := NULL;
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown callback action %', p_action;
    END IF;
    j.callback_timeout_at := NULL;
    PERFORM awa.put_job(j);
    job_id := j.id;
    new_state := j.state;
    RETURN NEXT;
END $$;

-- Leader: callbacks past their timeout count as failed attempts.
CREATE FUNCTION awa.expire_callbacks(p_limit integer DEFAULT 500)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    j awa.jobs_hot;
BEGIN
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
-- NOTIFY per statement, folded per transaction by Postgres.
CREATE FUNCTION awa.notify_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('awa_done', '');
    RETURN NULL;
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
