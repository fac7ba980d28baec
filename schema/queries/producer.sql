-- Producer statements: they run in the caller's transaction.

-- name: insert_job
-- One job through the stable SQL entry point (positional arguments: the
-- named form costs a lookup per call); a delay and an expiry count on the
-- database clock.
SELECT awa.insert_job(%(kind)s, %(args)s::jsonb, %(queue)s, %(priority)s,
    coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay_s)s::double precision)),
    %(max_attempts)s, %(timeout_s)s, %(tags)s::text[], %(metadata)s::jsonb, %(unique_opts)s::jsonb,
    %(ordering_key)s, %(batch_id)s, %(hold)s,
    now() + %(expires_in_s)s::double precision * interval '1 second', %(retry_policy)s::jsonb)

-- name: insert_job_now
-- A job with no run_at and no delay: the same call without the scheduling
-- expression, whose parsing and planning (coalesce, now(), make_interval
-- with a named argument) was 11 of the ~120 µs a one-job enqueue costs
-- on a local server. The function starts a NULL run_at now. (A NULL
-- expiry folds away when the statement is planned.)
SELECT awa.insert_job(%(kind)s, %(args)s::jsonb, %(queue)s, %(priority)s, NULL,
    %(max_attempts)s, %(timeout_s)s, %(tags)s::text[], %(metadata)s::jsonb, %(unique_opts)s::jsonb,
    %(ordering_key)s, %(batch_id)s, %(hold)s,
    now() + %(expires_in_s)s::double precision * interval '1 second', %(retry_policy)s::jsonb)

-- name: insert_jobs
-- Many jobs in one round trip; returns (input position, id).
SELECT ord, id FROM awa.insert_jobs(%(jobs)s::jsonb, %(batch_id)s)

-- name: insert_ready_jobs
-- The bulk fast path (ready, not unique): ids, ascending in input order.
SELECT * FROM awa.insert_ready_jobs(%(jobs)s::jsonb, %(batch_id)s)

-- name: insert_uniform_jobs
-- The bulk fast path for a chunk of one shape (see Job.bulk_shape): only
-- the args go per job, tags and metadata once; ids, ascending in input order.
SELECT * FROM awa.insert_uniform_jobs(%(kind)s, %(queue)s, %(priority)s, %(max_attempts)s,
                                      %(timeout_s)s, %(args)s::jsonb, %(batch_id)s,
                                      %(tags)s::text[], %(metadata)s::jsonb,
                                      %(expires_in_s)s::double precision, %(retry_policy)s::jsonb)

-- name: insert_batch
INSERT INTO awa.batches (total, remaining) VALUES (%(total)s, %(total)s) RETURNING id

-- name: set_batch_then
UPDATE awa.batches SET then_id = %(then_id)s WHERE id = %(batch_id)s

-- name: seal_batch
-- Its members are in: no other job can join it (awa.require_open_batch).
UPDATE awa.batches SET sealed = true WHERE id = %(batch_id)s
