-- Enqueue awa_pool jobs from psql, or any SQL client: the schema is the
-- contract (SPEC §12).
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -v order_id=42 -v email=a@example.com \
--        -f examples/psql_producer.sql
--
-- Every row of INSERT INTO awa.jobs gets awa.insert_job's defaults,
-- validation, lane and unique key; a bad row fails the whole statement
-- with one error naming the column and inserts nothing. The jobs are run
-- by `cd examples && awa-pool start --app receipts`.

BEGIN;

-- one job, ready now; RETURNING id prints its id
INSERT INTO awa.jobs (kind, args)
VALUES ('send_receipt', jsonb_build_object('order_id', :order_id, 'email', :'email'))
RETURNING id;

-- many at once with INSERT ... SELECT: a reminder for each of the next
-- three days, scheduled, in a queue of their own
INSERT INTO awa.jobs (kind, args, queue, run_at, tags)
SELECT 'send_receipt', jsonb_build_object('order_id', :order_id, 'email', :'email', 'day', d),
       'reminders', now() + make_interval(days => d), '{psql,reminder}'
  FROM generate_series(1, 3) AS d
RETURNING id;

COMMIT;
