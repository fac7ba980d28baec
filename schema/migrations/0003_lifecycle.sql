-- Job lifecycle: claim, outcomes, promotion, fan-in, rate limits.
--
-- Every transition of a running job is guarded by (id, lease, state =
-- 'running'): a writer whose lease is stale (the job was rescued and claimed
-- again) matches no row and changes nothing.

-- Backoff after attempt n (1-based): 2^n s plus up to 25% jitter, capped at 24 h.
CREATE FUNCTION awa.backoff_s(attempt integer) RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT least(86400.0, power(2.0, least(greatest(attempt, 0), 30)) * (1.0 + 0.25 * random()))
$$;

-- Insert one job row into the table its state belongs to.
CREATE FUNCTION awa.put_job(j awa.jobs_hot) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF j.state IN ('available', 'running') THEN
        INSERT INTO awa.jobs_hot SELECT (j).*;
        IF j.state = 'available' THEN
            PERFORM pg_notify('awa_jobs', j.queue);
        END IF;
    ELSIF j.state IN ('scheduled', 'retryable', 'waiting_external') THEN
        INSERT INTO awa.jobs_deferred SELECT (j).*;
    ELSE
        INSERT INTO awa.jobs_done SELECT (j).*, (SELECT r.current FROM awa.done_ring r);
    END IF;
END $$;

-- Remove one job from wherever it is, returning the row (NULL if absent or
-- not in one of p_states).
CREATE FUNCTION awa.take_job(p_id bigint, p_states awa.job_state[]) RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    DELETE FROM awa.jobs_hot h WHERE h.id = p_id AND h.state = ANY (p_states) RETURNING h.* INTO j;
    IF FOUND THEN RETURN j; END IF;
    DELETE FROM awa.jobs_deferred d WHERE d.id = p_id AND d.state = ANY (p_states) RETURNING d.* INTO j;
    IF FOUND THEN RETURN j; END IF;
    IF p_states && ARRAY['completed', 'failed', 'cancelled']::awa.job_state[] THEN
        DELETE FROM awa.jobs_done x WHERE x.id = p_id AND x.state = ANY (p_states)
        RETURNING x.id, x.kind, x.queue, x.args, x.state, x.priority, x.run_at, x.created_at,
                  x.attempt, x.max_attempts, x.lease, x.timeout_s, x.tags, x.metadata,
                  x.unique_key, x.lane, x.ordering_key, x.batch_id, x.supervisor_id,
                  x.attempted_at, x.deadline, x.finalized_at, x.crashes, x.errors,
                  x.attempt_log, x.wall_s, x.cpu_s, x.peak_rss, x.progress, x.result,
                  x.callback_id, x.callback_timeout_at, x.callback_result, x.dead_lettered
        INTO j;
        IF FOUND THEN RETURN j; END IF;
    END IF;
    RETURN NULL;
END $$;

-- Claim up to p_limit available jobs of one queue lane for a supervisor, in
-- (effective priority, run_at, id) order. p_lease, when given, is the new
-- lease of every claimed row: supervisors pass a value unique to their claim
-- (their id and a counter), so even a claim lost in a server crash cannot
-- have its lease handed out again; without it the lease is bumped by one. Effective priority ages: a job
-- waiting longer than p_aging_s counts one level more urgent per interval,
-- down to 1. Each priority level is read from the claim index in run_at
-- order, so aging needs no sort of the whole backlog. Paused queues yield
-- nothing; rate-limited queues take tokens from the shared bucket first.
CREATE FUNCTION awa.claim(
    p_queue text, p_limit integer, p_supervisor bigint,
    p_aging_s double precision DEFAULT 60, p_lane smallint DEFAULT 0, p_lease bigint DEFAULT NULL)
RETURNS TABLE (
    id bigint, kind text, queue text, args text, priority smallint, attempt integer,
    max_attempts integer, lease bigint, timeout_s double precision, tags text[],
    metadata text, created_at double precision, run_at double precision,
    progress text, callback_result text, batch_id bigint)
LANGUAGE plpgsql AS $$
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
          FROM picked
         WHERE j.id = picked.id
        RETURNING picked.ord, j.id, j.kind, j.queue, j.args::text AS args, j.priority, j.attempt,
                  j.max_attempts, j.lease, j.timeout_s, j.tags, j.metadata::text AS metadata,
                  extract(epoch FROM j.created_at)::double precision AS created_at,
                  extract(epoch FROM j.run_at)::double precision AS run_at,
                  j.progress::text AS progress, j.callback_result::text AS callback_result, j.batch_id
    )
    -- Rows come back in claim order: the UPDATE's own order is arbitrary.
    SELECT c.id, c.kind, c.queue, c.args, c.priority, c.attempt, c.max_attempts, c.lease,
           c.timeout_s, c.tags, c.metadata, c.created_at, c.run_at, c.progress,
           c.callback_result, c.batch_id
      FROM claimed c
     ORDER BY c.ord;

    IF v_rate IS NOT NULL THEN
        GET DIAGNOSTICS v_got = ROW_COUNT;
        IF v_got < v_want THEN   -- give back tokens the claim did not use
            UPDATE awa.queues q SET tokens = q.tokens + (v_want - v_got) WHERE q.name = p_queue;
        END IF;
    END IF;
END $$;

-- The success path, set-based: move completed jobs from the hot table to
-- terminal history in one statement; returns the ids it applied (a stale
-- lease applies nothing). Arrays are parallel, one entry per job;
-- p_extra maps a job id (as text) to {"result": ..., "progress": ...} for the
-- jobs that have either, so the common no-result case sends only numbers.
CREATE FUNCTION awa.complete_jobs(
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
        -- Look each id up by primary key. (state::text keeps the planner off
        -- the partial index of running rows, which a cached generic plan
        -- would otherwise scan once per outcome.)
        DELETE FROM awa.jobs_hot h USING o
         WHERE h.id = o.id AND h.lease = o.lease AND h.state::text = 'running'
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

-- Apply one outcome to a job row taken out of its table; returns the row as
-- it must be stored next. Outcomes:
--   completed, cancel, wait, snooze, released (never started: attempt given
--   back), interrupted (stopped by a shutdown: attempt given back, logged),
--   and the failures failed, fatal (no retry can help), crash,
--   timeout, retry, lost (supervisor gone), deadline (rescued past its
--   deadline), callback_timeout.
-- A failure retries with backoff until max_attempts, then fails (dead-letter
-- when the queue has it). A job that crashed its child p_max_crashes times
-- fails as poison.
CREATE FUNCTION awa.apply_outcome(
    j awa.jobs_hot, p_outcome text, p_error text DEFAULT NULL,
    p_traceback text DEFAULT NULL, p_delay_s double precision DEFAULT NULL,
    p_result jsonb DEFAULT NULL, p_wall real DEFAULT NULL, p_cpu real DEFAULT NULL,
    p_rss bigint DEFAULT NULL, p_progress jsonb DEFAULT NULL,
    p_max_crashes integer DEFAULT 3)
RETURNS awa.jobs_hot
LANGUAGE plpgsql AS $$
DECLARE
    v_next    awa.job_state;
    v_ends    boolean := p_outcome <> 'released';
    v_failure boolean := p_outcome IN ('failed', 'fatal', 'crash', 'timeout', 'retry', 'lost',
                                       'deadline', 'callback_timeout');
    v_error   text := p_error;
BEGIN
    IF p_outcome = 'crash' THEN
        j.crashes := j.crashes + 1;
    END IF;

    IF p_outcome = 'completed' THEN
        v_next := 'completed';
        j.result := p_result;
    ELSIF p_outcome = 'cancel' THEN
        v_next := 'cancelled';
    ELSIF p_outcome = 'wait' THEN
        v_next := 'waiting_external';
    ELSIF p_outcome IN ('snooze', 'released', 'interrupted') THEN
        v_next := CASE WHEN coalesce(p_delay_s, 0) > 0 THEN 'scheduled' ELSE 'available' END;
    ELSIF p_outcome = 'fatal' THEN
        v_next := 'failed';          -- retrying cannot help (bad args, bad result)
    ELSIF p_outcome = 'crash' AND j.crashes >= p_max_crashes THEN
        v_next := 'failed';
        v_error := coalesce(v_error, 'child died') || format(
            ' (poison: the job crashed its child %s times)', j.crashes);
    ELSIF j.attempt >= j.max_attempts THEN
        v_next := 'failed';
    ELSIF p_outcome = 'lost' OR (p_outcome = 'retry' AND p_delay_s IS NOT NULL AND p_delay_s <= 0) THEN
        v_next := 'available';
    ELSE
        v_next := 'retryable';
    END IF;

    IF v_failure OR p_outcome = 'cancel' THEN
        j.errors := coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_strip_nulls(
            jsonb_build_object('attempt', j.attempt, 'at', now(), 'kind', p_outcome,
                               'error', v_error, 'traceback', p_traceback)));
        IF jsonb_array_length(j.errors) > 50 THEN
            j.errors := j.errors - 0;
        END IF;
    END IF;

    IF v_ends THEN
        IF v_next IN ('completed', 'failed', 'cancelled') THEN
            j.wall_s := p_wall;
            j.cpu_s := p_cpu;
            j.peak_rss := p_rss;
        ELSE
            j.attempt_log := coalesce(j.attempt_log, '[]'::jsonb) || jsonb_build_array(jsonb_strip_nulls(
                jsonb_build_object('attempt', j.attempt, 'started_at', j.attempted_at,
                                   'finished_at', now(), 'outcome', p_outcome,
                                   'wall_seconds', p_wall, 'cpu_seconds', p_cpu,
                                   'peak_rss_bytes', p_rss)));
            IF jsonb_array_length(j.attempt_log) > 100 THEN
                j.attempt_log := j.attempt_log - 0;
            END IF;
        END IF;
    END IF;
    IF p_outcome IN ('snooze', 'released', 'interrupted') THEN
        j.attempt := greatest(j.attempt - 1, 0);   -- this attempt does not count
    END IF;

    j.progress := coalesce(p_progress, j.progress);
    j.deadline := NULL;
    IF p_outcome <> 'wait' THEN
        -- the attempt that registered a callback is over: its callback must
        -- not match a later attempt (awa.take_callback needs this mark)
        j.callback_timeout_at := NULL;
    END IF;
    j.state := v_next;
    IF v_next = 'retryable' THEN
        j.run_at := now() + make_interval(secs => coalesce(p_delay_s, awa.backoff_s(j.attempt)));
    ELSIF v_next = 'scheduled' THEN
        j.run_at := now() + make_interval(secs => p_delay_s);
    ELSIF v_next = 'available' AND p_outcome <> 'lost' THEN
        j.run_at := now();
    END IF;
    IF v_next IN ('completed', 'failed', 'cancelled') THEN
        j.finalized_at := now();
        IF v_next = 'failed' THEN
            j.dead_lettered := coalesce((SELECT q.dlq FROM awa.queues q WHERE q.name = j.queue), false);
        END IF;
    END IF;
    RETURN j;
END $$;

-- End one running attempt: take the job out of the hot table if it still
-- runs under p_lease, apply the outcome and store it where its new state
-- belongs. Returns the new state, or NULL when the lease is stale (the job
-- was rescued, cancelled or finished meanwhile): then nothing changes.
CREATE FUNCTION awa.finish_attempt(
    p_id bigint, p_lease bigint, p_outcome text, p_error text DEFAULT NULL,
    p_traceback text DEFAULT NULL, p_delay_s double precision DEFAULT NULL,
    p_result jsonb DEFAULT NULL, p_wall real DEFAULT NULL, p_cpu real DEFAULT NULL,
    p_rss bigint DEFAULT NULL, p_progress jsonb DEFAULT NULL, p_max_crashes integer DEFAULT 3)
RETURNS awa.job_state
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
BEGIN
    DELETE FROM awa.jobs_hot h
     WHERE h.id = p_id AND h.lease = p_lease AND h.state = 'running'
    RETURNING h.* INTO j;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    j := awa.apply_outcome(j, p_outcome, p_error, p_traceback, p_delay_s, p_result,
                           p_wall, p_cpu, p_rss, p_progress, p_max_crashes);
    PERFORM awa.put_job(j);
    RETURN j.state;
END $$;

-- Every outcome other than plain success, one row at a time (failures are
-- the rare path). p_outcomes: JSON array of {id, lease, outcome, error,
-- traceback, delay_s, result, wall_s, cpu_s, peak_rss, progress}.
CREATE FUNCTION awa.settle_jobs(p_outcomes jsonb, p_max_crashes integer DEFAULT 3)
RETURNS TABLE (job_id bigint, new_state awa.job_state)
LANGUAGE plpgsql AS $$
DECLARE
    o record;
BEGIN
    FOR o IN
        SELECT * FROM jsonb_to_recordset(p_outcomes) AS x(
            id bigint, lease bigint, outcome text, error text, traceback text,
            delay_s double precision, result jsonb, wall_s real, cpu_s real,
            peak_rss bigint, progress jsonb)
    LOOP
        new_state := awa.finish_attempt(o.id, o.lease, o.outcome, o.error, o.traceback, o.delay_s,
                                        o.result, o.wall_s, o.cpu_s, o.peak_rss, o.progress,
                                        p_max_crashes);
        CONTINUE WHEN new_state IS NULL;
        job_id := o.id;
        RETURN NEXT;
    END LOOP;
END $$;

-- Write coalesced progress of running jobs (lease-guarded).
CREATE FUNCTION awa.write_progress(p_ids bigint[], p_leases bigint[], p_progress jsonb[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE awa.jobs_hot h SET progress = o.progress
      FROM unnest(p_ids, p_leases, p_progress) AS o(id, lease, progress)
     WHERE h.id = o.id AND h.lease = o.lease AND h.state::text = 'running';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Move due scheduled/retryable jobs to the hot table and wake the
-- supervisors of their queues. Bounded per call.
CREATE FUNCTION awa.promote_due(p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    v_queues text[];
BEGIN
    WITH due AS (
        SELECT d.id FROM awa.jobs_deferred d
         WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now()
         ORDER BY d.run_at, d.id
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        DELETE FROM awa.jobs_deferred d
         WHERE d.id = ANY (ARRAY(SELECT due.id FROM due)) RETURNING d.*
    ),
    promoted AS (
        INSERT INTO awa.jobs_hot (
            id, kind, queue, args, state, priority, run_at, created_at, attempt,
            max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
            ordering_key, batch_id, supervisor_id, attempted_at, deadline,
            finalized_at, crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
            progress, result, callback_id, callback_timeout_at, callback_result,
            dead_lettered)
        SELECT id, kind, queue, args, 'available', priority, run_at, created_at, attempt,
               max_attempts, lease, timeout_s, tags, metadata, unique_key, lane,
               ordering_key, batch_id, supervisor_id, attempted_at, NULL,
               NULL, crashes, errors, attempt_log, wall_s, cpu_s, peak_rss,
               progress, result, callback_id, callback_timeout_at, callback_result,
               dead_lettered
          FROM moved
        RETURNING queue
    )
    SELECT count(*), array_agg(DISTINCT queue) INTO n, v_queues FROM promoted;
    PERFORM pg_notify('awa_jobs', q) FROM unnest(v_queues) q;  -- wake their supervisors
    RETURN n;
END $$;

-- Make held jobs (batch follow-ups) available now.
CREATE FUNCTION awa.release_held(p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    j awa.jobs_hot;
    n integer := 0;
BEGIN
    FOR j IN
        DELETE FROM awa.jobs_deferred d
         WHERE d.id = ANY (p_ids) AND d.state = 'scheduled' AND d.run_at = 'infinity'
        RETURNING d.*
    LOOP
        j.state := 'available';
        j.run_at := now();
        PERFORM awa.put_job(j);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- Fan-in: count batch members down as they reach a terminal state; the
-- statement that brings a batch to zero releases its follow-up. The row lock
-- on awa.batches serializes concurrent finishers, so it fires exactly once.
CREATE FUNCTION awa.batch_members_done() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        UPDATE awa.batches b
           SET remaining = b.remaining - c.n,
               done_at = CASE WHEN b.remaining - c.n <= 0 THEN now() END
          FROM (SELECT batch_id, count(*) AS n FROM new_rows
                 WHERE batch_id IS NOT NULL GROUP BY batch_id) c
         WHERE b.id = c.batch_id AND b.remaining > 0
        RETURNING b.id, b.remaining, b.then_id
    LOOP
        IF r.remaining <= 0 AND r.then_id IS NOT NULL THEN
            PERFORM awa.release_held(ARRAY[r.then_id]);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_done_batches AFTER INSERT ON awa.jobs_done
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION awa.batch_members_done();

-- Token bucket per queue, shared by every supervisor: take up to p_want
-- tokens; returns how many were granted. Burst is one second of rate.
CREATE FUNCTION awa.take_tokens(p_queue text, p_want integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    q awa.queues;
    v_avail double precision;
    v_granted integer;
BEGIN
    SELECT * INTO q FROM awa.queues WHERE name = p_queue FOR UPDATE;
    IF NOT FOUND OR q.rate_per_s IS NULL THEN
        RETURN p_want;
    END IF;
    v_avail := least(greatest(q.rate_per_s, 1.0),
                     q.tokens + q.rate_per_s * extract(epoch FROM clock_timestamp() - q.tokens_at));
    v_granted := greatest(0, least(p_want, floor(v_avail)::integer));
    UPDATE awa.queues SET tokens = v_avail - v_granted, tokens_at = clock_timestamp()
     WHERE name = p_queue;
    RETURN v_granted;
END $$;
