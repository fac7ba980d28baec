-- Producer statements: they run in the caller's transaction.

-- name: insert_job
-- One job through the stable SQL entry point; a delay is counted on the
-- database clock.
SELECT awa.insert_job(
    kind => %(kind)s,
    args => %(args)s::jsonb,
    queue => %(queue)s,
    priority => %(priority)s,
    run_at => coalesce(%(run_at)s::timestamptz,
                       now() + make_interval(secs => %(delay_s)s::double precision)),
    max_attempts => %(max_attempts)s,
    timeout_s => %(timeout_s)s,
    tags => %(tags)s::text[],
    metadata => %(metadata)s::jsonb,
    unique_opts => %(unique_opts)s::jsonb,
    ordering_key => %(ordering_key)s,
    batch_id => %(batch_id)s,
    hold => %(hold)s)

-- name: insert_jobs
-- Many jobs in one round trip; returns (input position, id).
SELECT ord, id FROM awa.insert_jobs(%(jobs)s::jsonb)

-- name: insert_batch
INSERT INTO awa.batches (total, remaining) VALUES (%(total)s, %(total)s) RETURNING id

-- name: set_batch_then
UPDATE awa.batches SET then_id = %(then_id)s WHERE id = %(batch_id)s
