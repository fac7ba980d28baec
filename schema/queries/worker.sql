-- Statements of a running supervisor (its main connection, autocommit).

-- name: worker_session
-- A supervisor's writes need not wait for fsync. An outcome lost in a server
-- crash leaves its job running under this supervisor, which releases it when
-- it reconnects (reconcile): the job only runs again (at-least-once). A claim
-- lost in a crash puts its jobs back as they were; its lease was unique to
-- that claim (supervisor id and counter), so the children still running them
-- can never write over the attempts of whoever claims them next. The two
-- writes that must survive a crash commit synchronously on their own:
-- registering the supervisor (its id seeds the leases) and registering a
-- callback (awa.register_callback).
SET synchronous_commit = off

-- name: loop_session
-- The supervisor's main session: what worker_session says, and bounds on
-- every statement the loop waits on (claims, heartbeats, requests; each
-- takes milliseconds): a lock or a stuck server must not freeze the loop
-- that reaps children and enforces timeouts (SPEC §5). A stricter bound an
-- operator set for the role or database stays. Behind a transaction
-- pooler, where no SET holds, and when no server answers, the watchdog's
-- cut of the connection is the bound (watchdog.py).
SET synchronous_commit = off;
SELECT set_config('lock_timeout', '2s', false)
 WHERE (SELECT setting::int FROM pg_settings WHERE name = 'lock_timeout') NOT BETWEEN 1 AND 2000;
SELECT set_config('statement_timeout', '5s', false)
 WHERE (SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout') NOT BETWEEN 1 AND 5000

-- name: name_session
-- Which supervisor the main session belongs to, once it has registered
-- (application_name "awa-pool/<id> main"; the others are named at connect).
SET application_name = %(name)s

-- name: backend_wait
-- What a backend is doing, read by the watchdog on its own connection when
-- the loop's turn has taken too long.
SELECT state, wait_event_type, wait_event, extract(epoch FROM now() - query_start)::float8
  FROM pg_stat_activity WHERE pid = %(pid)s

-- name: listen
LISTEN awa_jobs; LISTEN awa_urgent; LISTEN awa_cancel

-- name: probe_notify
-- An empty payload on the jobs channel: proves LISTEN works on this path.
NOTIFY awa_jobs, ''

-- name: claim
-- after_run_at / after_id: the cursor, per priority level 1-4 (NULL: from the start).
SELECT * FROM awa.claim(%(queue)s, %(limit)s, %(supervisor)s, %(aging)s, %(lane)s::smallint,
                        %(lease)s::bigint, %(after_run_at)s::double precision[], %(after_id)s::bigint[])

-- name: complete_then_claim
-- A claim carrying successes that wait to be written (BackgroundCompleter.lend):
-- one round trip and one commit for both. The simple query protocol runs the
-- two statements in order in one transaction: if either fails, neither
-- applies. Only the claim's rows come back.
SELECT count(*) FROM awa.complete_jobs(%(ids)s::bigint[], %(leases)s::bigint[], %(wall)s::real[],
                                       %(cpu)s::real[], %(rss)s::bigint[], %(extra)s::jsonb);
SELECT * FROM awa.claim(%(queue)s, %(limit)s, %(supervisor)s, %(aging)s, %(lane)s::smallint,
                        %(lease)s::bigint, %(after_run_at)s::double precision[], %(after_id)s::bigint[])

-- name: queues_with_work
-- The poll behind LISTEN: which of a supervisor's queues have jobs available
-- (one probe of the claim index each, LIMIT 1 keeping it a probe however deep
-- the queues), so that it claims from those only.
SELECT q.name
  FROM unnest(%(queues)s::text[]) AS q(name)
 CROSS JOIN LATERAL (SELECT 1 FROM awa.jobs_hot h
                      WHERE h.state = 'available' AND h.queue = q.name LIMIT 1) AS available
 WHERE NOT EXISTS (SELECT 1 FROM awa.queues p WHERE p.name = q.name AND p.paused)

-- name: complete_jobs
SELECT awa.complete_jobs(%(ids)s::bigint[], %(leases)s::bigint[], %(wall)s::real[],
                         %(cpu)s::real[], %(rss)s::bigint[], %(extra)s::jsonb)

-- name: complete_job
-- A flush of one (0011): one key lookup, no arrays to parse.
SELECT awa.complete_job(%(id)s, %(lease)s, %(wall)s::real, %(cpu)s::real, %(rss)s::bigint,
                        %(extra)s::jsonb)

-- name: settle_jobs
SELECT job_id, new_state::text FROM awa.settle_jobs(%(outcomes)s::jsonb, %(max_crashes)s)

-- name: complete_and_settle
-- A flush holding both successes and other outcomes: one round trip and one
-- commit instead of two (the branches run in order, in one transaction).
SELECT c.id, 'completed' FROM awa.complete_jobs(%(ids)s::bigint[], %(leases)s::bigint[],
                                                %(wall)s::real[], %(cpu)s::real[], %(rss)s::bigint[],
                                                %(extra)s::jsonb) AS c(id)
UNION ALL
SELECT job_id, new_state::text FROM awa.settle_jobs(%(outcomes)s::jsonb, %(max_crashes)s)

-- name: write_progress
SELECT awa.write_progress(%(ids)s::bigint[], %(leases)s::bigint[], %(progress)s::jsonb[])

-- name: register_supervisor
INSERT INTO awa.supervisors (hostname, pid, version, queues, workers)
VALUES (%(hostname)s, %(pid)s, %(version)s, %(queues)s, %(workers)s)
RETURNING id

-- name: heartbeat
-- Also revives the row if the leader forgot it during a long outage.
INSERT INTO awa.supervisors (id, hostname, pid, version, queues, workers, heartbeat_at, stats)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(version)s, %(queues)s, %(workers)s, now(), %(stats)s::jsonb)
ON CONFLICT (id) DO UPDATE
   SET heartbeat_at = now(), stats = excluded.stats, stopped_at = NULL

-- name: supervisor_stopped
UPDATE awa.supervisors SET stopped_at = now(), is_leader = false, stats = %(stats)s::jsonb
 WHERE id = %(id)s

-- name: my_running_jobs
-- Jobs the database thinks this supervisor runs (to reconcile after a
-- connection loss: a claim may have committed without its reply arriving).
SELECT id, lease FROM awa.jobs_hot WHERE state = 'running' AND supervisor_id = %(id)s

-- name: configure_queue
-- A supervisor's --queue rate=/dlq fill only what awa.queues lacks: queue
-- policy is the database's (SPEC §11), so a supervisor started without them
-- clears nothing. Returns the values that hold, for the warning when the
-- supervisor named others.
INSERT INTO awa.queues AS q (name, dlq, rate_per_s, tokens)
VALUES (%(name)s, %(dlq)s, %(rate)s, coalesce(%(rate)s, 0))
ON CONFLICT (name) DO UPDATE
   SET dlq = coalesce(q.dlq, excluded.dlq), rate_per_s = coalesce(q.rate_per_s, excluded.rate_per_s)
RETURNING q.dlq, q.rate_per_s

-- name: queue_settings
-- What a running supervisor applies from the fleet's settings (read every few seconds).
SELECT name, shards, paused, rate_per_s, global_max FROM awa.queues WHERE name = ANY(%(names)s)

-- name: job_cancelled
-- Whether a job was really cancelled: a cancel notification is only a hint
-- (any role that can connect may NOTIFY on awa_cancel).
SELECT EXISTS (SELECT 1 FROM awa.jobs_done WHERE id = %(id)s AND state = 'cancelled')

-- name: cancelled_among
-- Which of these running jobs were cancelled (the backstop for a cancel
-- NOTIFY that no LISTEN session heard).
SELECT id FROM awa.jobs_done WHERE id = ANY (%(ids)s::bigint[]) AND state = 'cancelled'

-- name: register_callback
-- NULL when the job no longer runs under this lease.
SELECT awa.register_callback(%(id)s, %(lease)s, %(timeout_s)s)

-- name: batch_members
SELECT * FROM awa.jobs WHERE batch_id = %(batch_id)s ORDER BY id

-- name: register_task_defaults
-- The timeouts this supervisor's tasks declare (NULL: none), which awa.claim
-- applies to jobs that set no timeout of their own. Rows change only when a
-- declaration did, so a restart of the same code writes nothing.
INSERT INTO awa.task_defaults AS t (kind, timeout_s)
SELECT d.kind, d.timeout_s
  FROM unnest(%(kinds)s::text[], %(timeouts)s::double precision[]) AS d(kind, timeout_s)
ON CONFLICT (kind) DO UPDATE
   SET timeout_s = excluded.timeout_s, updated_at = now()
 WHERE t.timeout_s IS DISTINCT FROM excluded.timeout_s

-- name: queues_with_available_jobs
-- awa_pool.testing.run_jobs serves every queue that has work.
SELECT DISTINCT queue FROM awa.jobs_hot WHERE state = 'available' ORDER BY queue

-- name: backend_pid
-- Compared with the process id the server reported at connect: a pooler
-- answers the connect itself, so the two differ behind one (see pooling.py).
SELECT pg_backend_pid()

-- name: take_liveness_lock
-- A session-level lock keyed by this supervisor's id, held in shared mode
-- on two of its sessions (the LISTEN one and the leader thread's) for as
-- long as the supervisor lives: the leader rescues the supervisor's jobs at
-- once only when no session holds it (its process is gone, not one session
-- ended: see liveness.py). Shared, so that a new session of the supervisor
-- takes it beside an old one the server has not dropped yet. The key is the
-- id folded into the lock's 31-bit second half.
SELECT pg_try_advisory_lock_shared(%(class)s, (%(id)s::bigint %% 2147483648)::int)
