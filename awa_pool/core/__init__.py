"""What every side shares: errors, the Job value, pool and queue options, task and
cron declarations, tracing glue, awa_pool's own connections and the named SQL."""
