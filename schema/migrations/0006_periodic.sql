-- Periodic jobs: registration, idempotent firing, manual triggers.
--
-- The leader computes due ticks in Python (croniter) and hands them to
-- awa.fire_cron, which fires them in one transaction. Two guards make a
-- double fire impossible even with two leaders by accident:
--   1. a compare-and-swap of cron_jobs.last_fire_at (the loser of a race
--      blocks on the row lock, then finds the value changed and fires nothing);
--   2. one awa.cron_fires row per (name, tick), inserted ON CONFLICT DO NOTHING
--      before the job, so even a rewound last_fire_at cannot fire a tick twice.

-- Fire times go into job metadata as ISO 8601 in UTC, whatever the session's
-- TimeZone (ticks are whole seconds).
CREATE FUNCTION awa.iso_utc(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"')
$$;

-- Upsert declared schedules (a JSON array of objects named like the
-- columns). Never deletes: other deployments may own other schedules.
-- `paused` and `last_fire_at` are kept on update; a new schedule starts with
-- last_fire_at = now(), so it fires from its next tick on (no backfill).
-- Rows that did not change are not rewritten.
CREATE FUNCTION awa.register_cron(p_schedules jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    INSERT INTO awa.cron_jobs AS c (name, expression, timezone, kind, queue, args, priority,
                                    max_attempts, tags, metadata, missed_fire_policy, last_fire_at)
    SELECT s.name, s.expression, coalesce(s.timezone, 'UTC'), s.kind, coalesce(s.queue, 'default'),
           coalesce(s.args, '{}'), coalesce(s.priority, 2), coalesce(s.max_attempts, 25),
           coalesce(s.tags, '{}'), coalesce(s.metadata, '{}'),
           coalesce(s.missed_fire_policy, 'coalesce'), now()
      FROM jsonb_to_recordset(p_schedules) AS s(
               name text, expression text, timezone text, kind text, queue text, args jsonb,
               priority smallint, max_attempts integer, tags text[], metadata jsonb,
               missed_fire_policy text)
     ORDER BY s.name
    ON CONFLICT (name) DO UPDATE
       SET expression = excluded.expression, timezone = excluded.timezone,
           kind = excluded.kind, queue = excluded.queue, args = excluded.args,
           priority = excluded.priority, max_attempts = excluded.max_attempts,
           tags = excluded.tags, metadata = excluded.metadata,
           missed_fire_policy = excluded.missed_fire_policy, updated_at = now()
     WHERE (c.expression, c.timezone, c.kind, c.queue, c.args, c.priority, c.max_attempts,
            c.tags, c.metadata, c.missed_fire_policy)
           IS DISTINCT FROM
           (excluded.expression, excluded.timezone, excluded.kind, excluded.queue, excluded.args,
            excluded.priority, excluded.max_attempts, excluded.tags, excluded.metadata,
            excluded.missed_fire_policy);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Fire the ticks p_fire_ats of schedule p_name, provided its last_fire_at is
-- still p_expected (NULL matches NULL) and it is not paused. Returns one row
-- per job inserted; none when another leader got there first.
CREATE FUNCTION awa.fire_cron(p_name text, p_expected timestamptz, p_fire_ats timestamptz[])
RETURNS TABLE (fire_at timestamptz, job_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    c      awa.cron_jobs;
    v_last timestamptz;
    t      timestamptz;
    v_id   bigint;
BEGIN
    SELECT max(x) INTO v_last FROM unnest(p_fire_ats) AS x;
    IF v_last IS NULL THEN
        RETURN;
    END IF;
    UPDATE awa.cron_jobs j SET last_fire_at = v_last
     WHERE j.name = p_name AND NOT j.paused
       AND j.last_fire_at IS NOT DISTINCT FROM p_expected
       AND v_last > coalesce(j.last_fire_at, '-infinity')
    RETURNING j.* INTO c;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOR t IN
        SELECT DISTINCT x FROM unnest(p_fire_ats) AS x
         WHERE x > coalesce(p_expected, '-infinity')
         ORDER BY x
    LOOP
        INSERT INTO awa.cron_fires AS f (name, fire_at, job_id) VALUES (p_name, t, 0)
            ON CONFLICT ON CONSTRAINT cron_fires_pkey DO NOTHING;
        CONTINUE WHEN NOT FOUND;
        v_id := awa.insert_job(
            kind => c.kind, args => c.args, queue => c.queue, priority => c.priority,
            run_at => t, max_attempts => c.max_attempts, tags => c.tags,
            metadata => c.metadata || jsonb_build_object('awa:cron', p_name,
                                                         'awa:fire_at', awa.iso_utc(t)));
        UPDATE awa.cron_fires f SET job_id = v_id WHERE f.name = p_name AND f.fire_at = t;
        fire_at := t;
        job_id := v_id;
        RETURN NEXT;
    END LOOP;
END $$;

-- Enqueue a schedule's job now, paused or not (an operator's "run it now").
-- Not a tick: last_fire_at and cron_fires are untouched. NULL for an unknown name.
CREATE FUNCTION awa.trigger_cron(p_name text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c awa.cron_jobs;
BEGIN
    SELECT * INTO c FROM awa.cron_jobs j WHERE j.name = p_name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN awa.insert_job(
        kind => c.kind, args => c.args, queue => c.queue, priority => c.priority,
        max_attempts => c.max_attempts, tags => c.tags,
        metadata => c.metadata || jsonb_build_object('awa:cron', p_name,
                                                     'awa:fire_at', awa.iso_utc(now()),
                                                     'awa:trigger', 'manual'));
END $$;
