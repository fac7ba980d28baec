-- Priority-1 jobs wake supervisors on a channel of their own (issue 23).
--
-- A supervisor draining a backlog claims a child's next batch when the child
-- is half-way through its current one, so a new job was claimed up to a batch
-- later and then waited behind the jobs the child already held: 12.9 ms at
-- p99 for a priority-1 job at a 1M backlog, and two whole jobs' time for
-- longer jobs. A priority-1 job that becomes available in awa.jobs_hot (an
-- enqueue, a promotion) now also sends pg_notify('awa_urgent', <queue>). A
-- supervisor whose children hold less urgent jobs of that queue queued
-- claims at once and the urgent job overtakes them (awa_pool/claimer.py,
-- Claimer.rush). A NOTIFY is sent at commit and deduplicated per
-- transaction, and the transaction already notifies awa_jobs, so this adds
-- no lock at commit; for other priorities the trigger's WHEN costs one
-- comparison per row.

CREATE FUNCTION awa.notify_urgent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('awa_urgent', NEW.queue);
    RETURN NULL;
END $$;

REVOKE ALL ON FUNCTION awa.notify_urgent() FROM PUBLIC;

CREATE TRIGGER jobs_hot_urgent AFTER INSERT ON awa.jobs_hot
    FOR EACH ROW WHEN (NEW.priority = 1 AND NEW.state = 'available')
    EXECUTE FUNCTION awa.notify_urgent();
