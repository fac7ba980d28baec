-- Admin and callback statements: they run in the caller's transaction.

-- name: get_job
SELECT * FROM awa.jobs WHERE id = %(id)s LIMIT 1

-- name: get_jobs
-- Several jobs by id (for wait).
SELECT * FROM awa.jobs WHERE id = ANY(%(ids)s)

-- name: list_jobs
-- Newest first, with optional filters (NULL means any). An age filter is
-- also an id range (awa.first_id_created_after, widened by %(slack_s)s
-- seconds: a job's id is taken while the transaction that created it runs),
-- so the id indexes stop where the ages stop; the exact age test applies
-- inside the range.
SELECT * FROM awa.jobs
 WHERE (%(state)s::awa.job_state IS NULL OR state = %(state)s::awa.job_state)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s)
   AND (%(older_than_s)s::double precision IS NULL
        OR (created_at < now() - make_interval(secs => %(older_than_s)s::double precision)
            AND id < coalesce((SELECT awa.first_id_created_after(now() - make_interval(
                     secs => %(older_than_s)s::double precision - %(slack_s)s))), 9223372036854775807)))
   AND (%(newer_than_s)s::double precision IS NULL
        OR (created_at >= now() - make_interval(secs => %(newer_than_s)s::double precision)
            AND id >= coalesce((SELECT awa.first_id_created_after(now() - make_interval(
                      secs => %(newer_than_s)s::double precision + %(slack_s)s))), 9223372036854775807)))
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: cancel_job
SELECT awa.cancel_job(%(id)s, %(reason)s)::text

-- name: retry_job
SELECT awa.retry_job(%(id)s)::text

-- name: pause_queue
INSERT INTO awa.queues (name, paused, paused_at) VALUES (%(name)s, true, now())
ON CONFLICT (name) DO UPDATE SET paused = true, paused_at = now()

-- name: resume_queue
INSERT INTO awa.queues (name, paused, paused_at) VALUES (%(name)s, false, NULL)
ON CONFLICT (name) DO UPDATE SET paused = false, paused_at = NULL

-- name: resolve_callback
SELECT job_id, new_state::text
  FROM awa.resolve_callback(%(callback)s::uuid, %(action)s, %(payload)s::jsonb, %(error)s)

-- name: dlq_list
SELECT * FROM awa.jobs_done
 WHERE dead_lettered
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s)
 ORDER BY finalized_at DESC, id DESC
 LIMIT %(limit)s

-- name: dlq_ids
SELECT id FROM awa.jobs_done
 WHERE dead_lettered
   AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s)
 ORDER BY id

-- name: dlq_purge
DELETE FROM awa.jobs_done
 WHERE dead_lettered
   AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s)

-- name: listen_done
-- Registering as a waiter turns on the awa_done notifications.
INSERT INTO awa.waiters (pid) VALUES (pg_backend_pid())
ON CONFLICT (pid) DO UPDATE SET since = now();
LISTEN awa_done

-- name: unlisten_done
UNLISTEN awa_done;
DELETE FROM awa.waiters WHERE pid = pg_backend_pid()

-- name: savepoint
-- Lets a refused callback leave the caller's transaction usable.
SAVEPOINT awa_admin

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT awa_admin

-- name: release_savepoint
RELEASE SAVEPOINT awa_admin

-- name: set_queue_shards
SELECT awa.set_queue_shards(%(name)s, %(shards)s::smallint)

-- name: set_queue
-- A queue's policy (SPEC §11): only the settings named (set_*) change. A new
-- rate starts with an empty bucket, as a queue's first one does.
INSERT INTO awa.queues AS q (name, rate_per_s, dlq, global_max, tokens)
VALUES (%(name)s, %(rate)s, %(dlq)s, %(global_max)s, 0)
ON CONFLICT (name) DO UPDATE
   SET rate_per_s = CASE WHEN %(set_rate)s THEN excluded.rate_per_s ELSE q.rate_per_s END,
       dlq = CASE WHEN %(set_dlq)s THEN excluded.dlq ELSE q.dlq END,
       global_max = CASE WHEN %(set_global_max)s THEN excluded.global_max ELSE q.global_max END

-- name: queue_policy
SELECT name, paused, rate_per_s, dlq, shards, global_max FROM awa.queues WHERE name = %(name)s
