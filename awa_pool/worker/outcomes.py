"""How an attempt can end and how a child can exit: the names the pipe,
the completer, the SQL (awa.settle_jobs), the metrics and the hooks share,
in one place."""
from __future__ import annotations

# Outcomes a child reports (the SQL outcome names).
COMPLETED = "completed"
FAILED = "failed"        # an exception: retried with backoff until max_attempts
FATAL = "fatal"          # failed for good (a result the database refuses, too big, ...)
RETRY = "retry"          # awa_pool.Retry
SNOOZE = "snooze"        # awa_pool.Snooze
CANCEL = "cancel"        # awa_pool.Cancel
WAIT = "wait"            # awa_pool.WaitForCallback
RELEASED = "released"    # handed back unstarted: the job goes back to its queue as it was

# Outcomes the supervisor gives the job a child was running when it died.
CRASH = "crash"              # it died on its own (segfault, os._exit, the OOM killer)
TIMEOUT = "timeout"          # killed: the job ran past its timeout
INTERRUPTED = "interrupted"  # killed: the supervisor was shutting down

# The handler ran to an end: its wall time measures the job (job times, metrics).
RAN = frozenset({COMPLETED, FAILED, FATAL, RETRY, SNOOZE, CANCEL, WAIT})
# The child was killed or died before it could measure anything.
KILLED = frozenset({CRASH, TIMEOUT, INTERRUPTED})

# Exit codes of a child process.
EXIT_ORPHANED = 1        # its supervisor was gone before it could start
EXIT_CRASHED = 70        # child_main itself failed (a bug, not a handler's exception)
EXIT_HOOK_FAILED = 73    # an on_child_start hook raised: the supervisor must not respawn
