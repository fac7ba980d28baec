-- Rotating the terminal-history ring without a CPU burst.
--
-- A 10-minute soak at 23,800 jobs/s on two cores lined slow-pickup clusters
-- up with the leader's rotation: 230-480 ms per call, every 8.6 s (60 s
-- retention), on a segment of 200,000 rows. EXPLAIN ANALYZE of its
-- carry-forward UPDATE: 177 ms, of which 124 ms compiling the scan's
-- expressions with JIT (a sequential scan of a big segment is costed past
-- jit_above_cost) and most of the rest comparing ages as numerics. Without
-- JIT 51 ms; comparing timestamps instead of extracted epochs 30 ms.
--
-- So: no JIT; the kept-row test compares timestamps (the same rows: a row
-- is kept while its time is later than now minus its class's retention);
-- and the segment is read once to count both its rows and those to keep,
-- the carry-forward UPDATE running only when some are kept (with one
-- retention for every class, or no failures, it is most rotations). The
-- count and the UPDATE use one predicate text, filled into both.
CREATE OR REPLACE FUNCTION awa.rotate_done_ring(
    p_keep_completed_s double precision, p_keep_failed_s double precision,
    p_keep_dlq_s double precision, p_lock_timeout text DEFAULT '200ms',
    p_period_s double precision DEFAULT NULL)
RETURNS TABLE (rotated boolean, busy boolean, dropped bigint, carried bigint, segment smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    -- $1..$3: the retentions of completed, failed or cancelled, and dead-lettered rows
    c_kept CONSTANT text := $k$
        coalesce(d.finalized_at, d.attempted_at, d.created_at) > now() - make_interval(secs =>
            CASE WHEN d.dead_lettered THEN $3 WHEN d.state = 'completed' THEN $1 ELSE $2 END)
        OR (d.batch_id IS NOT NULL AND EXISTS (
                SELECT 1 FROM awa.batches b WHERE b.id = d.batch_id AND b.done_at IS NULL))$k$;
    r          awa.done_ring;
    v_oldest   smallint;
    v_total    bigint;
    v_kept     bigint;
    v_carried  bigint := 0;
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
        EXECUTE format('SELECT count(*), count(*) FILTER (WHERE %s) FROM awa.%I d',
                       c_kept, 'jobs_done_' || v_oldest)
           INTO v_total, v_kept USING p_keep_completed_s, p_keep_failed_s, p_keep_dlq_s;
        IF v_kept > 0 THEN
            -- through the parent: a row changing segment moves to that partition
            EXECUTE format('UPDATE awa.jobs_done d SET segment = $4 WHERE d.segment = $5 AND (%s)', c_kept)
              USING p_keep_completed_s, p_keep_failed_s, p_keep_dlq_s, r.current, v_oldest;
            GET DIAGNOSTICS v_carried = ROW_COUNT;
        END IF;
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

ALTER FUNCTION awa.rotate_done_ring(double precision, double precision, double precision, text,
                                    double precision)
    SET jit = off;
