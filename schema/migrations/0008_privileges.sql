-- Least privilege (SPEC §6): what a producer role and a worker role may do.
--
--   producer  enqueue, and nothing else: it calls awa.insert_job and
--             awa.insert_jobs (enqueue, enqueue_many, enqueue_batch), which
--             run as their owner (SECURITY DEFINER, search_path pinned), so
--             the producer holds no privilege on any job table. It cannot
--             read, change or delete a job, claim one, or call another
--             function. enqueue_batch also creates its batch row and attaches
--             its follow-up: column privileges on awa.batches, and
--             awa.batch_guard keeps such a role to well-formed batches.
--   worker    runs a supervisor, including leader maintenance: DML on the
--             queue's tables (no DELETE of terminal history; TRUNCATE only
--             on the ring segments retention rotates), EXECUTE on the awa
--             functions. No DDL: it owns nothing, so it cannot drop, alter or
--             create anything in the schema.
-- awa.grant_producer / awa.grant_worker / awa.revoke_privileges apply these
-- (behind `awa-pool grant`); they are idempotent. Run them again after
-- `awa-pool migrate` when a later migration adds objects.

-- Functions are executable by PUBLIC by default. Nobody but the schema's
-- owner could reach them so far (no role had USAGE on the schema); from now
-- on execution is granted per role. A later migration that adds a function
-- must revoke it from PUBLIC too (tests/test_privileges.py checks).
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM PUBLIC;

-- The producer entry points run as their owner; every name they use is
-- schema-qualified, and pg_temp comes last so nothing can shadow a built-in.
ALTER FUNCTION awa.insert_job(text, jsonb, text, integer, timestamptz, integer, double precision,
                              text[], jsonb, jsonb, text, bigint, boolean)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.insert_jobs(jsonb, bigint)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION awa.insert_ready_jobs(jsonb, bigint)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Is job p_then the follow-up enqueue_batch created for batch p_batch (its
-- metadata names the batch)? Reads the job tables on behalf of a producer.
CREATE FUNCTION awa.is_follow_up(p_batch bigint, p_then bigint) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM awa.jobs_deferred d
                    WHERE d.id = p_then AND d.metadata->>'awa:then_of' = p_batch::text)
        OR EXISTS (SELECT 1 FROM awa.jobs_hot h
                    WHERE h.id = p_then AND h.metadata->>'awa:then_of' = p_batch::text)
$$;

-- Roles other than the owner (producers) may only insert a fresh batch
-- (remaining = total, no follow-up, not done, open), attach, once, the
-- follow-up job that names that batch, and seal it (never reopen it). The
-- owner (migrations, operators) is not restricted.
CREATE FUNCTION awa.batch_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.total IS NULL OR NEW.total < 0 OR NEW.remaining IS DISTINCT FROM NEW.total
           OR NEW.then_id IS NOT NULL OR NEW.done_at IS NOT NULL OR NEW.sealed THEN
            RAISE EXCEPTION 'a new batch must have remaining = total, no follow-up, no end and be open'
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.sealed AND NOT NEW.sealed THEN
        RAISE EXCEPTION 'batch % is sealed and cannot be reopened', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.then_id IS DISTINCT FROM OLD.then_id THEN
        IF OLD.then_id IS NOT NULL THEN
            RAISE EXCEPTION 'batch % already has its follow-up job %', OLD.id, OLD.then_id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF NOT awa.is_follow_up(NEW.id, NEW.then_id) THEN
            RAISE EXCEPTION 'job % is not the follow-up of batch %', NEW.then_id, NEW.id
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER batches_guard_insert BEFORE INSERT ON awa.batches
    FOR EACH ROW EXECUTE FUNCTION awa.batch_guard();
CREATE TRIGGER batches_guard_then BEFORE UPDATE OF then_id, sealed ON awa.batches
    FOR EACH ROW EXECUTE FUNCTION awa.batch_guard();

CREATE FUNCTION awa.require_role(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_role IS NULL OR NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_role) THEN
        RAISE EXCEPTION 'role % does not exist (create it first: CREATE ROLE ... LOGIN)',
            coalesce(quote_ident(p_role), 'NULL') USING ERRCODE = 'undefined_object';
    END IF;
END $$;

-- Enqueue only.
CREATE FUNCTION awa.grant_producer(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.require_role(p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA awa TO %I', p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION awa.insert_job(text, jsonb, text, integer, timestamptz, '
                   'integer, double precision, text[], jsonb, jsonb, text, bigint, boolean), '
                   'awa.insert_jobs(jsonb, bigint), awa.insert_ready_jobs(jsonb, bigint) TO %I', p_role);
    -- the guard on awa.batches asks this on the producer's behalf
    EXECUTE format('GRANT EXECUTE ON FUNCTION awa.is_follow_up(bigint, bigint) TO %I', p_role);
    -- the CLI checks the schema version before acting
    EXECUTE format('GRANT SELECT ON awa.schema_migrations TO %I', p_role);
    -- enqueue_batch: create the batch row, then attach its follow-up
    EXECUTE format('GRANT INSERT (total, remaining), SELECT (id), UPDATE (then_id, sealed) ON awa.batches TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE awa.batches_id_seq TO %I', p_role);
END $$;

-- Everything a supervisor does: claim, complete, settle, heartbeat,
-- callbacks, progress, and the leader's maintenance (promotion, rescue,
-- callback expiry, cron, retention).
CREATE FUNCTION awa.grant_worker(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f regprocedure;
    t regclass;
BEGIN
    PERFORM awa.require_role(p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA awa TO %I', p_role);
    EXECUTE format('GRANT SELECT ON awa.schema_migrations, awa.jobs TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON awa.jobs_hot, awa.jobs_deferred, '
                   'awa.supervisors, awa.cron_fires TO %I', p_role);
    -- terminal history is added to and rotated, never deleted from, by a worker
    EXECUTE format('GRANT SELECT, INSERT, UPDATE ON awa.jobs_done, awa.queues, awa.cron_jobs TO %I', p_role);
    FOR t IN SELECT i.inhrelid::regclass FROM pg_inherits i WHERE i.inhparent = 'awa.jobs_done'::regclass LOOP
        EXECUTE format('GRANT SELECT, TRUNCATE ON %s TO %I', t, p_role);
    END LOOP;
    EXECUTE format('GRANT SELECT, UPDATE ON awa.done_ring TO %I', p_role);
    EXECUTE format('GRANT SELECT, UPDATE, DELETE ON awa.batches TO %I', p_role);
    EXECUTE format('GRANT SELECT, DELETE ON awa.unique_keys TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON awa.callbacks_retired TO %I', p_role);
    -- terminal transitions check for waiters; the leader forgets stale ones
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON awa.waiters TO %I', p_role);
    EXECUTE format('GRANT USAGE ON SEQUENCE awa.supervisors_id_seq TO %I', p_role);
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = 'awa'::regnamespace
                AND p.proname NOT IN ('grant_producer', 'grant_worker', 'revoke_privileges', 'require_role')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, p_role);
    END LOOP;
END $$;

-- Take back everything granted on the schema (either profile).
CREATE FUNCTION awa.revoke_privileges(p_role text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM awa.require_role(p_role);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA awa FROM %I', p_role);
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA awa FROM %I', p_role);
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA awa FROM %I', p_role);
    EXECUTE format('REVOKE ALL ON SCHEMA awa FROM %I', p_role);
END $$;

REVOKE ALL ON FUNCTION awa.grant_producer(text), awa.grant_worker(text), awa.revoke_privileges(text),
    awa.require_role(text), awa.is_follow_up(bigint, bigint), awa.batch_guard() FROM PUBLIC;
