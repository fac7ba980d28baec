-- Retention of terminal history and of the bookkeeping tables around it.
--
-- Terminal rows live in the ring awa.jobs_done_0..N-1 (0001). Retention
-- never mass-DELETEs them: it rotates the ring. The oldest segment's rows
-- that are still inside their retention are carried forward into the
-- current segment (an UPDATE of the partition key, which moves them), then
-- the oldest segment is TRUNCATEd (no dead tuples, no vacuum debt) and
-- becomes the current one.

-- Rotate the ring when the current segment has been current for a period of
-- min(keep completed, keep failed) / (segments - 1), at least 1 s (or
-- p_period_s when given). A segment is truncated segments - 1 rotations after
-- it stopped being current, so with that period its ordinary rows are all
-- past the shorter retention: only the longer-lived classes (failed when
-- failed outlives completed, dead letters) are carried forward. A row is
-- removed at most (segments - 1) periods after its retention ends (while
-- the leader runs), and never before.
-- Correctness does not depend on the period: every row's age is checked.
-- Returns one row:
--   rotated  the ring turned (the oldest segment was emptied)
--   busy     the TRUNCATE did not get its lock within p_lock_timeout (or
--            another rotation holds the ring); nothing changed, try later
--   dropped  rows removed; carried: rows kept by moving them forward
-- Rows kept: completed younger than p_keep_completed_s, failed/cancelled
-- younger than p_keep_failed_s, dead-lettered younger than p_keep_dlq_s,
-- and members of batches that are not done yet (their follow-up reads them).
CREATE FUNCTION awa.rotate_done_ring(
    p_keep_completed_s double precision, p_keep_failed_s double precision,
    p_keep_dlq_s double precision, p_lock_timeout text DEFAULT '200ms',
    p_period_s double precision DEFAULT NULL)
RETURNS TABLE (rotated boolean, busy boolean, dropped bigint, carried bigint, segment smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    r          awa.done_ring;
    v_oldest   smallint;
    v_total    bigint;
    v_carried  bigint;
    v_timeout  text := current_setting('lock_timeout');
BEGIN
    rotated := false; busy := false; dropped := 0; carried := 0;
    SELECT * INTO r FROM awa.done_ring FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        busy := true;
        segment := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    segment := r.current;
    IF r.rotated_at > now() - make_interval(secs => coalesce(p_period_s, greatest(1.0,
            least(p_keep_completed_s, p_keep_failed_s) / greatest(r.segments - 1, 1)))) THEN
        RETURN NEXT;
        RETURN;
    END IF;
    v_oldest := (r.current + 1) % r.segments;
    BEGIN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
        EXECUTE format('SELECT count(*) FROM awa.%I', 'jobs_done_' || v_oldest) INTO v_total;
        UPDATE awa.jobs_done d SET segment = r.current
         WHERE d.segment = v_oldest
           AND ((CASE
                   WHEN d.dead_lettered THEN p_keep_dlq_s
                   WHEN d.state = 'completed' THEN p_keep_completed_s
                   ELSE p_keep_failed_s
                 END) > extract(epoch FROM now() - coalesce(d.finalized_at, d.attempted_at, d.created_at))
                OR (d.batch_id IS NOT NULL AND EXISTS (
                        SELECT 1 FROM awa.batches b WHERE b.id = d.batch_id AND b.done_at IS NULL)));
        GET DIAGNOSTICS v_carried = ROW_COUNT;
        EXECUTE format('TRUNCATE awa.%I', 'jobs_done_' || v_oldest);
        UPDATE awa.done_ring SET current = v_oldest, rotated_at = now();
        PERFORM set_config('lock_timeout', v_timeout, true);
    EXCEPTION WHEN lock_not_available THEN
        busy := true;      -- the subtransaction rolled back the move and the setting
        RETURN NEXT;
        RETURN;
    END;
    rotated := true;
    dropped := v_total - v_carried;
    carried := v_carried;
    segment := v_oldest;
    RETURN NEXT;
END $$;

-- Bookkeeping rows, cleaned in bounded batches.
CREATE INDEX cron_fires_fire_at ON awa.cron_fires (fire_at);
CREATE INDEX batches_done_at ON awa.batches (done_at) WHERE done_at IS NOT NULL;

-- Unique keys whose job no longer exists (removed by retention or a purge):
-- scan one chunk of keys after p_after in key order and delete the stale
-- ones. The delete re-checks job_id, so a key a producer re-pointed at a new
-- job meanwhile is left alone. Returns the chunk's last key (NULL at the end
-- of the table: start again from the beginning).
CREATE FUNCTION awa.clean_unique_keys(p_after bytea, p_limit integer)
RETURNS TABLE (removed integer, last_key bytea)
LANGUAGE sql AS $$
    WITH chunk AS MATERIALIZED (
        SELECT u.key, u.job_id FROM awa.unique_keys u
         WHERE p_after IS NULL OR u.key > p_after
         ORDER BY u.key
         LIMIT p_limit
    ),
    gone AS (
        DELETE FROM awa.unique_keys u USING chunk c
         WHERE u.key = c.key AND u.job_id = c.job_id AND awa.job_state_of(c.job_id) IS NULL
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone)::integer,
           CASE WHEN (SELECT count(*) FROM chunk) < p_limit THEN NULL
                ELSE (SELECT c.key FROM chunk c ORDER BY c.key DESC LIMIT 1) END
$$;
