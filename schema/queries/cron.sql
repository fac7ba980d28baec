-- Periodic jobs: registration at pool start, firing by the leader, admin.

-- name: register_cron
-- Upsert the declared schedules (JSON array); keeps paused and last_fire_at.
SELECT awa.register_cron(%(schedules)s::jsonb)

-- name: cron_schedules_due
-- Unpaused schedules with what the leader needs to compute due ticks, and
-- the database clock (ticks are judged on it, not on the host's clock).
SELECT name, expression, timezone, missed_fire_policy, last_fire_at, now()
  FROM awa.cron_jobs
 WHERE NOT paused
 ORDER BY name

-- name: fire_cron
-- Fire ticks with a compare-and-swap on last_fire_at; one row per job inserted.
SELECT fire_at, job_id FROM awa.fire_cron(%(name)s, %(expected)s::timestamptz, %(fire_ats)s::timestamptz[])

-- name: list_cron
SELECT c.name, c.expression, c.timezone, c.kind, c.queue, c.args, c.priority, c.max_attempts,
       c.tags, c.metadata, c.missed_fire_policy, c.paused, c.last_fire_at, c.created_at,
       c.updated_at,
       (SELECT f.job_id FROM awa.cron_fires f WHERE f.name = c.name
         ORDER BY f.fire_at DESC LIMIT 1) AS last_job_id,
       now() AS db_now
  FROM awa.cron_jobs c
 WHERE %(name)s::text IS NULL OR c.name = %(name)s
 ORDER BY c.name

-- name: pause_cron
UPDATE awa.cron_jobs SET paused = true, updated_at = now()
 WHERE name = %(name)s
RETURNING name

-- name: resume_cron
-- Ticks missed while paused are skipped, whatever the policy: the operator
-- asked for them not to run.
UPDATE awa.cron_jobs
   SET paused = false, updated_at = now(),
       last_fire_at = CASE WHEN paused THEN greatest(last_fire_at, now()) ELSE last_fire_at END
 WHERE name = %(name)s
RETURNING name

-- name: trigger_cron
SELECT awa.trigger_cron(%(name)s)
