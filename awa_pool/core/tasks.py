"""Task declarations: @task, the kind-to-handler registry, child-start hooks,
and importing the --app module.

No database code here: child processes use this module to find handlers.
`Task.enqueue` imports the producer inside the function, so loading an app's
task modules never pulls queue code into a child.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from .errors import ConfigError, Seconds, to_seconds
from .job import (DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, DEFAULT_QUEUE, Job, check_max_attempts, check_name,
                  check_priority)
from .retry import RetryPolicy, check_retry


@dataclass(frozen=True)
class Task:
    """A registered handler and its defaults. Calling it runs the function."""

    kind: str
    func: Callable[..., Any]
    queue: str = DEFAULT_QUEUE
    priority: int = DEFAULT_PRIORITY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    timeout: Optional[float] = None
    pass_context: bool = False
    retry: Optional[RetryPolicy] = None      # its backoff goes with each job; the child applies the rest
    expires_in: Optional[float] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @property
    def defaults(self) -> Dict[str, Any]:
        return {"queue": self.queue, "priority": self.priority, "max_attempts": self.max_attempts,
                "timeout": self.timeout, "retry": self.retry, "expires_in": self.expires_in}

    def job(self, **args: Any) -> Job:
        """A Job of this task with these keyword args and the task's defaults.

        Other options go through Job.replace: `resize.job(path="a.png").replace(delay=60)`.
        """
        return Job(self.kind, args).with_defaults(self.defaults)

    def enqueue(self, conn: Any, **args: Any) -> int:
        """Enqueue one job of this task in the caller's transaction; returns its id."""
        from ..api.producer import enqueue  # deferred: keeps queue code out of children

        return enqueue(conn, self.job(**args))


_registry: Dict[str, Task] = {}
_child_start_hooks: List[Callable[[], Any]] = []


def task(kind: str, *, queue: str = DEFAULT_QUEUE, priority: int = DEFAULT_PRIORITY,
         max_attempts: int = DEFAULT_MAX_ATTEMPTS, timeout: Optional[Seconds] = None,
         pass_context: bool = False, retry: Optional[RetryPolicy] = None,
         expires_in: Optional[Seconds] = None) -> Callable[[Callable[..., Any]], Task]:
    """Register a handler for a job kind.

    The handler is called with the job's args as keyword arguments, and with
    a JobContext first when pass_context=True. `retry` (an awa_pool.RetryPolicy)
    sets the backoff of its jobs and the exceptions that fail one at once;
    `expires_in`: its jobs not started that long after their enqueue are
    cancelled as "expired".
    """
    check_name(kind, "task kind")
    check_name(queue, "task queue")
    check_priority(priority)
    check_max_attempts(max_attempts)
    timeout_s = to_seconds(timeout, "task timeout", allow_zero=False)
    check_retry(retry, "task retry")
    expires_in_s = to_seconds(expires_in, "task expires_in", allow_zero=False)

    def register(func: Callable[..., Any]) -> Task:
        if not callable(func):
            raise TypeError(f"@task({kind!r}) must decorate a function")
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"@task({kind!r}): handlers run in child processes and must be "
                            "plain functions, not coroutines")
        existing = _registry.get(kind)
        if existing is not None and existing.func is not func and _qualname(existing.func) != _qualname(func):
            raise ConfigError(f"task kind {kind!r} is already registered by {_qualname(existing.func)}")
        declared = Task(kind, func, queue, priority, max_attempts, timeout_s, pass_context, retry, expires_in_s)
        _registry[kind] = declared
        return declared

    return register


def _qualname(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def on_child_start(func: Callable[[], Any]) -> Callable[[], Any]:
    """Run `func()` once in each new child process, before its first job."""
    if func not in _child_start_hooks:
        _child_start_hooks.append(func)
    return func


def registered(kind: str) -> Optional[Task]:
    return _registry.get(kind)


def all_tasks() -> Dict[str, Task]:
    return dict(_registry)


def child_start_hooks() -> List[Callable[[], Any]]:
    return list(_child_start_hooks)


def apply_task_defaults(job: Job) -> Job:
    """Fill fields the job left unset from its task's declaration, if known here."""
    declared = _registry.get(job.kind)
    return job.with_defaults(declared.defaults) if declared is not None else job


class AppImportError(ConfigError):
    """The --app module could not be imported."""


def import_app(module: str) -> None:
    """Import the app module(s) that declare tasks (comma-separated names)."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the current directory is importable
    for name in [part.strip() for part in module.split(",") if part.strip()]:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                raise AppImportError(f"app module {name!r} not found (is it on PYTHONPATH?)") from None
            raise AppImportError(f"app module {name!r} failed to import: "
                                 f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            raise AppImportError(f"app module {name!r} failed to import: "
                                 f"{type(exc).__name__}: {exc}") from exc
