"""The basic handlers, with OpenTelemetry's SDK exporting every span to
$AWA_TEST_SPANS as JSON lines (tests/test_tracing.py).

AWA_TEST_OTEL_SETUP=child (the advice for users): each child sets up its
own SDK in an on_child_start hook, exporting each span as it ends.
AWA_TEST_OTEL_SETUP=parent: the SDK is set up once at import, in the
supervisor, with a BatchSpanProcessor that would wait ten minutes before
exporting: the spans reach the file only because a child flushes before
it exits.
"""
from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

import awa_pool
import apps.basic  # noqa: F401 (registers the handlers)
from apps.span_file import SpanFileExporter

SPANS = os.environ["AWA_TEST_SPANS"]
SETUP = os.environ.get("AWA_TEST_OTEL_SETUP", "child")


if SETUP == "parent":
    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(SpanFileExporter(SPANS), schedule_delay_millis=600_000))
    trace.set_tracer_provider(_provider)
else:
    @awa_pool.on_child_start
    def install_tracing() -> None:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(SpanFileExporter(SPANS)))
        trace.set_tracer_provider(provider)
