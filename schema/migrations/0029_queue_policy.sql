-- Queue policy has one owner (SPEC §11): awa.queues, written by
-- awa_pool.set_queue and `awa-pool queues set`. A supervisor's --queue
-- rate=/dlq only fill a value nobody set, so dlq needs "unset": NULL, which
-- dead-letters nothing, as false did. Every supervisor started without
-- ,dlq used to write false, so an existing false is read as unset too.
ALTER TABLE awa.queues ALTER COLUMN dlq DROP NOT NULL, ALTER COLUMN dlq DROP DEFAULT;
UPDATE awa.queues SET dlq = NULL WHERE NOT dlq;
