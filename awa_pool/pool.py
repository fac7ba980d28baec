"""awa_pool.Pool: run a supervisor from Python, with the CLI's options.

`awa-pool start` builds one of these too, so both take the same options
with the same defaults (PoolConfig's). The supervisor stack is imported
only by `run()`: a process that merely enqueues never loads it.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

from .config import PoolConfig, QueuesArg, parse_queues
from .db import configured_url

if TYPE_CHECKING:
    from .supervisor import Supervisor


class Pool:
    """A supervisor and its children: `Pool(dsn, app="myapp.tasks", workers=8).run()`.

    queues: a list of CLI queue specs (["images=3,min=2", "default"]) or a
    dict of name -> QueueConfig. Other options mirror `awa-pool start`
    (shutdown_timeout, connect_timeout, max_tasks_per_child,
    max_memory_per_child in bytes, max_crashes, retention_completed,
    retention_failed in seconds or timedeltas, metrics_port, ...). Without a
    dsn, the configured URL or the embedded Postgres is used.
    """

    def __init__(self, dsn: Optional[str] = None, app: Optional[str] = None,
                 workers: Optional[int] = None, queues: QueuesArg = None, **options: Any) -> None:
        if dsn is None:
            dsn = configured_url()
        if dsn is None:
            from .embedded import start as start_embedded

            dsn = start_embedded()
        if workers is None:
            workers = os.cpu_count() or 1
        self.config = PoolConfig(dsn=dsn, app=app, workers=workers, queues=parse_queues(queues), **options)
        self.supervisor: Optional["Supervisor"] = None

    def run(self) -> int:
        """Run until SIGTERM/SIGINT (or stop()); returns the exit code."""
        from .supervisor import Supervisor

        self.supervisor = Supervisor(self.config)
        metrics = None
        if self.config.metrics_port is not None:
            from .metrics import attach

            metrics = attach(self.supervisor, self.config.metrics_port)
        try:
            return self.supervisor.run()
        finally:
            if metrics is not None:
                metrics.close()

    def stop(self) -> None:
        """Ask a running pool to drain and exit (safe from a signal handler)."""
        if self.supervisor is not None:
            self.supervisor.request_shutdown()
