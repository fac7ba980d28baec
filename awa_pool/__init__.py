"""awa_pool: a Postgres-native job queue with a pre-fork process pool.

This module only re-exports the public API (SPEC §1); it holds no logic.
"""
from .api.admin import (cancel_job, complete_external, dlq_list, dlq_purge, dlq_retry,
                        fail_external, get_job, list_jobs, pause_queue, resume_external,
                        resume_queue, retry_external, retry_job, set_queue_shards, wait)
from .core.config import PoolConfig, QueueConfig
from .worker.context import JobContext, WaitForCallback, current_context
from .core.errors import (AwaError, Cancel, ConfigError, DatabaseUnavailable, PayloadTooLarge, Retry,
                          SchemaMissing, Snooze, UnknownCallback, UnknownJob)
from .worker.hooks import OutcomeEvent, PoolInfo
from .core.job import DEFAULT_UNIQUE_STATES, Job, JobRecord, JobState, Unique
from .api.migrate import migrate
from .api.queue_policy import QueuePolicy, set_queue
from .core.periodic import periodic
from .core.retry import RetryPolicy
from .worker.pool import Pool
from .api.producer import Batch, enqueue, enqueue_batch, enqueue_many
from .ops.stats import QueueDepth, QueueStats, queue_depth, queue_stats
from .core.tasks import Task, on_child_start, task
from .core.version import __version__

__all__ = [
    "QueueStats", "cancel_job", "complete_external", "dlq_list", "dlq_purge", "dlq_retry",
    "fail_external", "get_job", "list_jobs", "pause_queue", "queue_stats", "resume_external",
    "resume_queue", "retry_external", "retry_job", "set_queue", "set_queue_shards", "wait", "QueuePolicy",
    "AwaError", "Batch", "Cancel", "ConfigError", "DEFAULT_UNIQUE_STATES", "DatabaseUnavailable",
    "Job", "JobContext", "JobRecord", "JobState", "OutcomeEvent", "PayloadTooLarge", "Pool",
    "PoolConfig", "PoolInfo", "QueueConfig", "Retry", "SchemaMissing", "Snooze", "Task", "Unique",
    "UnknownCallback", "UnknownJob", "WaitForCallback", "__version__", "current_context", "enqueue",
    "enqueue_batch", "enqueue_many", "migrate", "on_child_start", "periodic", "task",
    "QueueDepth", "queue_depth", "RetryPolicy",
]
