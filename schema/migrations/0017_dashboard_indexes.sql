-- Indexes for the web dashboard's kind pages (awa_pool/dashboard).
--
-- Terminal history had no index leading with the kind, so listing kinds or
-- a kind's recent cost meant reading all of awa.jobs_done (a million rows
-- is seconds). jobs_done_kind serves the kind list (a skip scan), exact
-- per-slice counts (index-only) and the latest runs of each slice.
-- jobs_done_trouble holds only the rows that failed, were cancelled or were
-- retried: the exact failure, crash and timeout counts read those few rows
-- instead of every completed one. Both grow with the history they index;
-- the ring's TRUNCATE empties them with their segment.
CREATE INDEX jobs_done_kind ON awa.jobs_done (kind, finalized_at);
CREATE INDEX jobs_done_trouble ON awa.jobs_done (kind, finalized_at)
    WHERE state <> 'completed' OR attempt_log IS NOT NULL;
