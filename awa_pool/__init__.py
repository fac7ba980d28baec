"""awa_pool: a Postgres-native job queue with a pre-fork process pool.

This module only re-exports the public API (SPEC §1); it holds no logic.
"""
from .errors import (AwaError, Cancel, ConfigError, DatabaseUnavailable, PayloadTooLarge, Retry,
                     SchemaMissing, Snooze, UnknownCallback, UnknownJob)
from .job import DEFAULT_UNIQUE_STATES, Job, JobRecord, JobState, Unique
from .migrate import migrate
from .producer import Batch, enqueue, enqueue_batch, enqueue_many
from .tasks import Task, on_child_start, task
from .version import __version__

__all__ = [
    "AwaError", "Batch", "Cancel", "ConfigError", "DEFAULT_UNIQUE_STATES", "DatabaseUnavailable",
    "Job", "JobRecord", "JobState", "PayloadTooLarge", "Retry", "SchemaMissing", "Snooze",
    "Task", "Unique", "UnknownCallback", "UnknownJob", "__version__", "enqueue",
    "enqueue_batch", "enqueue_many", "migrate", "on_child_start", "task",
]
