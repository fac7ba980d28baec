-- Leader retention: rotate the terminal-history ring, clean bookkeeping.

-- name: rotate_done_ring
SELECT rotated, busy, dropped, carried, segment
  FROM awa.rotate_done_ring(%(keep_completed_s)s, %(keep_failed_s)s, %(keep_dlq_s)s,
                            %(lock_timeout)s, %(period_s)s)

-- name: clean_cron_fires
-- Fired-tick records past the idempotency window, oldest first, bounded.
DELETE FROM awa.cron_fires f
 USING (SELECT name, fire_at FROM awa.cron_fires
         WHERE fire_at < now() - make_interval(secs => %(keep_s)s)
         ORDER BY fire_at
         LIMIT %(limit)s) old
 WHERE f.name = old.name AND f.fire_at = old.fire_at

-- name: clean_unique_keys
SELECT removed, last_key FROM awa.clean_unique_keys(%(after)s, %(limit)s)

-- name: clean_batches
-- Finished batches past retention (their members are gone or going).
DELETE FROM awa.batches b
 USING (SELECT id FROM awa.batches
         WHERE done_at < now() - make_interval(secs => %(keep_s)s)
         ORDER BY done_at
         LIMIT %(limit)s) old
 WHERE b.id = old.id
