"""awa_pool: a Postgres-native job queue with a pre-fork process pool.

This module only re-exports the public API (SPEC §1); it holds no logic.
"""
from .admin import (cancel_job, complete_external, dlq_list, dlq_purge, dlq_retry,
                    fail_external, get_job, list_jobs, pause_queue, resume_external,
                    resume_queue, retry_external, retry_job, set_queue_shards, wait)
from .config import PoolConfig, QueueConfig
from .context import JobContext, WaitForCallback, current_context
from .errors import (AwaError, Cancel, ConfigError, DatabaseUnavailable, PayloadTooLarge, Retry,
                     SchemaMissing, Snooze, UnknownCallback, UnknownJob)
from .hooks import OutcomeEvent, PoolInfo
from .job import DEFAULT_UNIQUE_STATES, Job, JobRecord, JobState, Unique
from .migrate import migrate
from .periodic import periodic
from .pool import Pool
from .producer import Batch, enqueue, enqueue_batch, enqueue_many
from .stats import QueueDepth, QueueStats, queue_depth, queue_stats
from .tasks import Task, on_child_start, task
from .version import __version__

__all__ = [
    "QueueStats", "cancel_job", "complete_external", "dlq_list", "dlq_purge", "dlq_retry",
    "fail_external", "get_job", "list_jobs", "pause_queue", "queue_stats", "resume_external",
    "resume_queue", "retry_external", "retry_job", "set_queue_shards", "wait",
    "AwaError", "Batch", "Cancel", "ConfigError", "DEFAULT_UNIQUE_STATES", "DatabaseUnavailable",
    "Job", "JobContext", "JobRecord", "JobState", "OutcomeEvent", "PayloadTooLarge", "Pool",
    "PoolConfig", "PoolInfo", "QueueConfig", "Retry", "SchemaMissing", "Snooze", "Task", "Unique",
    "UnknownCallback", "UnknownJob", "WaitForCallback", "__version__", "current_context", "enqueue",
    "enqueue_batch", "enqueue_many", "migrate", "on_child_start", "periodic", "task",
    "QueueDepth", "queue_depth",
]
