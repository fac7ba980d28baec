"""awa_pool.Pool: run a supervisor from Python, with the CLI's options and
lifecycle hooks for the program that embeds it.

`awa-pool start` builds one of these too, so both take the same options
with the same defaults (PoolConfig's). The supervisor stack is imported
only by `run()`: a process that merely enqueues never loads it.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, List, Optional, TypeVar

from ..core.config import PoolConfig, QueuesArg, parse_queues
from ..core.db import SESSION_URL_ENV_VAR, check_url, configured_url
from .hooks import OutcomeEvent, PoolHooks, PoolInfo

if TYPE_CHECKING:
    from ..supervisor import Supervisor

Hook = TypeVar("Hook", bound=Callable[..., Any])


class Pool:
    """A supervisor and its children: `Pool(dsn, app="myapp.tasks", workers=8).run()`.

    queues: a list of CLI queue specs (["images=3,min=2", "default"]) or a
    dict of name -> QueueConfig. Other options mirror `awa-pool start`
    (shutdown_timeout, connect_timeout, max_tasks_per_child,
    max_memory_per_child in bytes, max_crashes, retention_completed,
    retention_failed in seconds or timedeltas, metrics_port, health_port
    and health_host for /livez and /readyz, ...). Without a
    dsn, the configured URL or the embedded Postgres is used. session_dsn
    (else AWA_SESSION_DATABASE_URL) is a direct URL for LISTEN and the
    advisory locks when dsn goes through a transaction-mode pooler.

    Hooks, as keyword arguments or decorators (`@pool.on_outcome`), given
    before run():
    on_started(PoolInfo) once the pool serves its queues; on_stopping(PoolInfo)
    once when it begins to shut down (`info.reason` says why);
    on_outcome(OutcomeEvent) after each attempt. They run in the
    supervisor's loop, between jobs: keep them quick and non-blocking (hand
    slow work to a thread or queue). One that raises is logged and ignored.

    Signals: run() in the main thread takes SIGTERM/SIGINT (drain; a second
    one stops at once), SIGQUIT and SIGHUP; handlers the program installed
    before still run, from the loop, and are back in place when run()
    returns (see awa_pool/signals.py for what cannot be chained). In another
    thread, run() installs no handler: call stop().
    """

    def __init__(self, dsn: Optional[str] = None, app: Optional[str] = None,
                 workers: Optional[int] = None, queues: QueuesArg = None, *,
                 on_started: Optional[Callable[[PoolInfo], Any]] = None,
                 on_stopping: Optional[Callable[[PoolInfo], Any]] = None,
                 on_outcome: Optional[Callable[[OutcomeEvent], Any]] = None, **options: Any) -> None:
        self.hooks = PoolHooks()
        for event, hook in (("started", on_started), ("stopping", on_stopping), ("outcome", on_outcome)):
            if hook is not None:
                self.hooks.add(event, hook)
        if dsn is None:
            dsn = configured_url()
        if dsn is None:
            from ..core.embedded import start as start_embedded

            dsn = start_embedded()
        if workers is None:
            workers = os.cpu_count() or 1
        session_dsn = options.pop("session_dsn", None) or os.environ.get(SESSION_URL_ENV_VAR) or None
        if session_dsn is not None:
            options["session_dsn"] = check_url(session_dsn)
        self.config = PoolConfig(dsn=dsn, app=app, workers=workers, queues=parse_queues(queues), **options)
        self.supervisor: Optional["Supervisor"] = None

    def on_started(self, hook: Hook) -> Hook:
        """Decorator: call hook(PoolInfo) once the pool serves its queues."""
        self.hooks.add("started", hook)
        return hook

    def on_stopping(self, hook: Hook) -> Hook:
        """Decorator: call hook(PoolInfo) once when the pool begins to shut down."""
        self.hooks.add("stopping", hook)
        return hook

    def on_outcome(self, hook: Hook) -> Hook:
        """Decorator: call hook(OutcomeEvent) after each attempt of a job."""
        self.hooks.add("outcome", hook)
        return hook

    def run(self) -> int:
        """Run until SIGTERM/SIGINT (or stop()); returns the exit code.

        A chained host handler that raised SystemExit (or KeyboardInterrupt)
        gets its exception raised here, after the pool drained.
        """
        from ..supervisor import Supervisor
        from ..core.tracing import available as tracing_available

        tracing_available()  # decided once, before forking: children inherit the answer
        self.supervisor = Supervisor(self.config)
        self.hooks.attach(self.supervisor)
        servers = self._serve_http(self.supervisor)
        error: Optional[BaseException] = None
        try:
            code = self.supervisor.run()
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.hooks.stopped(error)
            for server in servers:
                server.close()
        if self.supervisor.signals.host_exit is not None:
            raise self.supervisor.signals.host_exit
        return code

    def _serve_http(self, supervisor: "Supervisor") -> List[Any]:
        """Bind the health and metrics ports before anything starts: one
        that cannot be bound stops the pool here, with nothing running."""
        servers: List[Any] = []
        try:
            if self.config.health_port is not None:
                from ..ops.health import HealthServer

                servers.append(HealthServer(supervisor))
                servers[-1].serve(self.config.health_port, self.config.health_host)
            if self.config.metrics_port is not None:
                from ..ops.metrics import attach

                servers.append(attach(supervisor, self.config.metrics_port))
        except BaseException:
            for server in servers:
                server.close()
            raise
        return servers

    def stop(self) -> None:
        """Ask a running pool to drain and exit (safe from a signal handler
        or another thread; calling it again does not cut the drain short)."""
        if self.supervisor is not None:
            self.supervisor.request_shutdown()
