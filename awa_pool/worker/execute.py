"""Run one handler and turn what it did into an Outcome. No queue I/O.

Used by child processes and by awa_pool.testing, so both map returns and
exceptions to job states the same way.
"""
from __future__ import annotations

import inspect
import json
import json.scanner
import logging
import time
import traceback
from typing import Any, Dict, Optional

from .context import Channel, JobContext, WaitForCallback, reset_current, set_current
from ..core.errors import Cancel, Retry, Snooze
from ..core.job import check_json
from .protocol import ClaimedJob, Outcome
from ..core.tasks import Task, registered
from ..core.tracing import attempt_span

# A handler's exception as the child saw it (the exception object, its
# frames), for in-process integrations such as Sentry's, which read every
# logger (docs/errors.md). It does not propagate: the log's one line per
# failure is the supervisor's (failure_log.py), which also covers crashes.
handler_log = logging.getLogger("awa_pool.handler")
handler_log.propagate = False
handler_log.addHandler(logging.NullHandler())
handler_log.setLevel(logging.WARNING)   # not the root's: a quiet log must not hide them from Sentry

TRACEBACK_MAX_CHARS = 8000
ERROR_MAX_CHARS = 2000


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= ERROR_MAX_CHARS else text[:ERROR_MAX_CHARS] + "..."


def _traceback_text() -> str:
    text = traceback.format_exc()
    return text if len(text) <= TRACEBACK_MAX_CHARS else "...\n" + text[-TRACEBACK_MAX_CHARS:]


# PostgreSQL prints jsonb with nothing around the value, so the C scanner
# alone decodes it; json.loads (two regex matches and checks per call) is
# the fallback for anything else and gives the error messages.
_scan_json = json.scanner.c_make_scanner(json.JSONDecoder()) if json.scanner.c_make_scanner else None


def _decode(text: str) -> Any:
    if text == "{}":
        return {}
    if _scan_json is not None:
        try:
            value, end = _scan_json(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text)


def _loads(text: Optional[str], default: Any) -> Any:
    return _decode(text) if text else default


def build_context(job: ClaimedJob, args: Dict[str, Any], channel: Channel) -> JobContext:
    return JobContext(
        id=job.id, kind=job.kind, queue=job.queue, args=args, attempt=job.attempt,
        max_attempts=job.max_attempts, priority=job.priority, tags=tuple(job.tags or ()),
        metadata=_loads(job.metadata, {}), created_at=job.created_at, run_at=job.run_at,
        lease=job.lease, timeout_s=job.timeout_s, progress=_loads(job.progress, None),
        callback_result=_loads(job.callback_result, None), batch_id=job.batch_id, channel=channel)


def _args_rejected(task: Task, ctx: Optional[JobContext], args: Dict[str, Any]) -> Optional[str]:
    """Why the handler's signature cannot take these args (None if it can)."""
    try:
        signature = inspect.signature(task.func)
    except (TypeError, ValueError):
        return None
    try:
        if ctx is not None:
            signature.bind(ctx, **args)
        else:
            signature.bind(**args)
    except TypeError as exc:
        return f"handler {task.func.__qualname__}{signature} cannot take args {sorted(args)}: {exc}"
    return None


def _failure(task: Task, job: ClaimedJob, exc: BaseException) -> tuple:
    """(outcome, error, traceback) of a handler that raised: `failed` (retried
    while attempts remain), or `fatal` when the task's retry policy gives up
    on this exception. Called inside the except block (for the traceback),
    with the job still current (current_context()) for handler_log."""
    error, trace = _error_text(exc), _traceback_text()
    reason = task.retry.gives_up(exc) if task.retry is not None else None
    outcome = "fatal" if reason else "failed"
    if reason:
        error = f"{error} (not retried: {reason})"
    final = bool(reason) or job.attempt >= job.max_attempts
    handler_log.log(logging.ERROR if final else logging.WARNING,
                    "job %d (kind %s, queue %s) failed on attempt %d/%d: %s", job.id, job.kind,
                    job.queue, job.attempt, job.max_attempts, error, exc_info=exc)
    return outcome, error, trace


@attempt_span  # in an OpenTelemetry span when the package is there
def run(job: ClaimedJob, channel: Channel, *, result_max_bytes: int = 1024 * 1024) -> Outcome:
    """Run the job's handler once; never raises (except BaseExceptions that
    must end the process, like KeyboardInterrupt)."""
    started = time.perf_counter()
    cpu_started = time.process_time()
    ctx: Optional[JobContext] = None

    def finish(outcome: str, **fields: Any) -> Outcome:
        if ctx is not None and ctx.progress_dirty:  # checkpoints survive every outcome
            fields["progress"] = json.dumps(ctx.progress, ensure_ascii=False, separators=(",", ":"))
        return Outcome(job.id, job.lease, outcome, wall_s=time.perf_counter() - started,
                       cpu_s=time.process_time() - cpu_started, **fields)

    task = registered(job.kind)
    if task is None:
        return finish("failed", error=f"no handler is registered for kind {job.kind!r} in this "
                                      "supervisor's app")
    try:
        args = _decode(job.args)
    except ValueError as exc:
        return finish("fatal", error=f"args are not valid JSON: {exc}")
    except RecursionError:  # a raw SQL producer can store JSON nested deeper than Python decodes
        return finish("fatal", error="args nest too deeply to be decoded in Python")
    try:
        ctx = build_context(job, args, channel)
    except (ValueError, RecursionError) as exc:
        return finish("fatal", error=f"the job's metadata, progress or callback result cannot be "
                                     f"decoded: {type(exc).__name__}: {exc}")
    token = set_current(ctx)
    try:
        if task.pass_context:
            value = task.func(ctx, **args)
        else:
            value = task.func(**args)
    except Retry as exc:
        return finish("retry", delay_s=exc.delay, error=f"Retry: {exc.reason}" if exc.reason else "Retry")
    except Snooze as exc:
        return finish("snooze", delay_s=exc.delay)
    except Cancel as exc:
        return finish("cancel", error=exc.reason)
    except TypeError as exc:
        rejected = _args_rejected(task, ctx if task.pass_context else None, args)
        if rejected:
            return finish("fatal", error=rejected)
        outcome, error, trace = _failure(task, job, exc)
        return finish(outcome, error=error, traceback=trace)
    except (Exception, SystemExit) as exc:
        outcome, error, trace = _failure(task, job, exc)
        return finish(outcome, error=error, traceback=trace)
    finally:
        reset_current(token)
    if isinstance(value, WaitForCallback):
        if value.callback != ctx._callback_id:
            return finish("fatal", error="WaitForCallback must be given the id that "
                                         "ctx.register_callback() returned in this attempt")
        return finish("wait")
    if value is None:
        return finish("completed")
    try:
        result = check_json(value, "result")
    except (TypeError, ValueError) as exc:
        return finish("fatal", error=f"the handler's return value is not JSON-serializable: {exc}")
    if len(result) > result_max_bytes:
        return finish("fatal", error=f"the handler's result is {len(result)} bytes of JSON, over the "
                                     f"{result_max_bytes}-byte limit: store big results elsewhere "
                                     "and return a reference")
    return finish("completed", result=result)
