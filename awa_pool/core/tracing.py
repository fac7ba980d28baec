"""OpenTelemetry, optional (extra `[otel]`): a producer span around each
enqueue call, the W3C trace context in each job's metadata, and a consumer
span around each attempt whose parent is that context.

Without the `opentelemetry-api` package nothing here imports it or costs
more than a check of a cached answer: the first enqueue (or Pool.run, or
attempt) tries the import once and remembers the result for the process
(forked children inherit it). With the package but no SDK configured and
no span active, no span is made either: it could record nothing.

Producer side: enqueue, enqueue_many and enqueue_batch (and their awaited
twins in awa_pool.aio) run inside a span
of kind PRODUCER; every job they insert gets `traceparent` (and
`tracestate`, when there is one) in its metadata, unless its metadata has
a traceparent of its own. Consumer side: each attempt runs inside a span of kind
CONSUMER (attributes awa.job.kind, .queue, .id, .attempt, .outcome,
.cpu_seconds) that is current while the handler runs, so its own enqueues
join the trace; it ends before the outcome leaves the child. Retries are
one span each, all children of the enqueue span. A child killed mid-job
(crash, timeout) cannot end its span, so that attempt has none.

Children are forked: an SDK configured in the supervisor before the fork
is inherited, and BatchSpanProcessor starts a fresh export thread in each
child (the SDK's fork hook). A child leaves through os._exit, which skips
the SDK's atexit shutdown, so `flush()` runs first. Exporters holding a
network client (OTLP over gRPC in particular) are not fork-safe: configure
the SDK in an `@awa_pool.on_child_start` hook instead, once per child.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Tuple, TypeVar

from .job import Job, check_json
from .version import __version__

if TYPE_CHECKING:  # annotations only: the worker's values, not a dependency of core
    from ..worker.protocol import ClaimedJob, Outcome

log = logging.getLogger(__name__)

CARRIER_KEYS = ("traceparent", "tracestate")
FAILED_OUTCOMES = frozenset({"failed", "fatal"})
FLUSH_TIMEOUT_MS = 5000
RECHECK_S = 1.0  # a tracer provider set later is noticed within this

F = TypeVar("F", bound=Callable[..., Any])

_otel: Any = None  # None: not tried yet; False: not installed; else the _Otel below
# The trace context an enqueue call stamps on its jobs, with its JSON text
# (set by its producer span): a bulk enqueue encodes it once, not per job.
_carrier: "contextvars.ContextVar[Optional[Tuple[Dict[str, str], str]]]" = contextvars.ContextVar(
    "awa_pool_trace_carrier", default=None)


class _Otel:
    """The opentelemetry API, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.context, self.propagate, self.trace = context, propagate, trace
        self.SpanKind, self.Status, self.StatusCode = SpanKind, Status, StatusCode
        self.tracer = trace.get_tracer("awa_pool", __version__)
        self.recording = False  # a global provider, once set, is never unset
        self.recheck_at = 0.0
        if hasattr(os, "register_at_fork"):  # a child's start hooks may set one: ask afresh there
            os.register_at_fork(after_in_child=self._forget_no)

    def _forget_no(self) -> None:
        self.recheck_at = 0.0

    def can_record(self) -> bool:
        """Has a real (SDK) tracer provider been set? Asking costs microseconds
        (an os.environ miss), so "no" is asked again at most every second."""
        if not self.recording and time.monotonic() >= self.recheck_at:
            self.recording = not isinstance(self.trace.get_tracer_provider(), self.trace.ProxyTracerProvider)
            self.recheck_at = time.monotonic() + RECHECK_S
        return self.recording

    @contextlib.contextmanager
    def producing(self, operation: str) -> Iterator[Any]:
        """The producer span of one enqueue call (None when there is nothing
        to record), with its trace context set for `stamp` meanwhile."""
        if not self.can_record() and not self.trace.get_current_span().get_span_context().is_valid:
            yield None  # no SDK and no trace to continue: nothing to record
            return
        span = self.tracer.start_span(f"awa_pool {operation}", kind=self.SpanKind.PRODUCER,
                                      attributes={"messaging.system": "awa_pool",
                                                  "messaging.operation.type": "send"})
        with self.trace.use_span(span, end_on_exit=True):
            carrier: Dict[str, str] = {}
            self.propagate.inject(carrier)
            kept = {key: carrier[key] for key in CARRIER_KEYS if key in carrier}
            token = _carrier.set((kept, check_json(kept, "metadata")) if kept else None)
            try:
                yield span
            finally:
                _carrier.reset(token)

    def attempt(self, run: Callable[..., Outcome], job: ClaimedJob, args: tuple, kwargs: dict) -> Outcome:
        carrier = _carrier_of(job.metadata)
        if carrier is None and not self.can_record():
            return run(job, *args, **kwargs)
        parent = self.propagate.extract(carrier) if carrier else None
        span = self.tracer.start_span(f"awa_pool run {job.kind}", context=parent, kind=self.SpanKind.CONSUMER,
                                      attributes={
                                          "messaging.system": "awa_pool", "messaging.operation.type": "process",
                                          "messaging.destination.name": job.queue,
                                          "messaging.message.id": str(job.id), "awa.job.kind": job.kind,
                                          "awa.job.queue": job.queue, "awa.job.id": job.id,
                                          "awa.job.attempt": job.attempt})
        with self.trace.use_span(span, end_on_exit=True):
            outcome = run(job, *args, **kwargs)
            span.set_attributes({"awa.job.outcome": outcome.outcome, "awa.job.cpu_seconds": outcome.cpu_s,
                                 "awa.job.wall_seconds": outcome.wall_s})
            if outcome.outcome in FAILED_OUTCOMES:
                span.set_status(self.Status(self.StatusCode.ERROR, outcome.error))
        return outcome


def _describe_result(span: Any, result: Any) -> None:
    if isinstance(result, int):
        span.set_attribute("awa.job.id", result)
    elif isinstance(result, list):
        span.set_attribute("messaging.batch.message_count", len(result))
    elif hasattr(result, "ids"):  # a Batch
        span.set_attributes({"awa.batch.id": result.id, "messaging.batch.message_count": len(result.ids)})


def _carrier_of(metadata_json: Optional[str]) -> Optional[Dict[str, str]]:
    """The trace context in a job's metadata (JSON text), if any."""
    if not metadata_json or '"traceparent"' not in metadata_json:
        return None
    try:
        metadata = json.loads(metadata_json)
    except ValueError:
        return None
    carrier = {key: metadata[key] for key in CARRIER_KEYS if isinstance(metadata.get(key), str)}
    return carrier or None


def _load() -> Any:
    global _otel
    if _otel is None:
        try:
            _otel = _Otel()
        except ImportError:
            _otel = False
    return _otel


def available() -> bool:
    """Is opentelemetry importable? Decided once per process."""
    return bool(_load())


def producer_span(operation: str) -> Callable[[F], F]:
    """Decorator for enqueue functions, plain or async (awa_pool.aio): run
    them in a producer span whose context `stamp` writes into each job
    they insert."""
    def decorate(call: F) -> F:
        if inspect.iscoroutinefunction(call):
            @functools.wraps(call)
            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                otel = _otel if _otel is not None else _load()
                if otel is False:
                    return await call(*args, **kwargs)
                with otel.producing(operation) as span:
                    result = await call(*args, **kwargs)
                    if span is not None:
                        _describe_result(span, result)
                return result

            return traced_async  # type: ignore[return-value]

        @functools.wraps(call)
        def traced(*args: Any, **kwargs: Any) -> Any:
            otel = _otel if _otel is not None else _load()
            if otel is False:
                return call(*args, **kwargs)
            with otel.producing(operation) as span:
                result = call(*args, **kwargs)
                if span is not None:
                    _describe_result(span, result)
            return result

        return traced  # type: ignore[return-value]

    return decorate


def stamp(job: Job) -> Job:
    """The job with the enqueue's trace context in its metadata; the job
    itself outside a traced enqueue, or when its metadata names a
    traceparent of its own (that context is kept, tracestate and all)."""
    context = _carrier.get()
    if context is None or "traceparent" in job.metadata:
        return job
    carrier, carrier_json = context
    if not job.metadata:
        return job.with_checked_metadata(dict(carrier), carrier_json)
    metadata = dict(job.metadata, **carrier)
    return job.with_checked_metadata(metadata, check_json(metadata, "metadata"))


def attempt_span(run: Callable[..., Outcome]) -> Callable[..., Outcome]:
    """Decorator for execute.run: each attempt in a consumer span."""
    @functools.wraps(run)
    def traced(job: ClaimedJob, *args: Any, **kwargs: Any) -> Outcome:
        otel = _otel if _otel is not None else _load()
        if otel is False:
            return run(job, *args, **kwargs)
        return otel.attempt(run, job, args, kwargs)

    return traced


def flush() -> None:
    """Export the spans this process still buffers (a child, before os._exit)."""
    if not _otel:
        return
    provider = _otel.trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        try:
            force_flush(FLUSH_TIMEOUT_MS)
        except Exception:  # an exporter's failure must not keep a child from exiting
            log.exception("flushing OpenTelemetry spans failed")
