"""An OpenTelemetry span exporter appending each span to a file as one
JSON object per line (the file is opened per export: safe across fork)."""
from __future__ import annotations

import json
import os
from typing import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict:
    context = span.get_span_context()
    return {"name": span.name, "kind": span.kind.name, "trace_id": format(context.trace_id, "032x"),
            "span_id": format(context.span_id, "016x"),
            "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
            "attributes": dict(span.attributes or {}), "status": span.status.status_code.name,
            "status_description": span.status.description, "pid": os.getpid(),
            "start": span.start_time, "end": span.end_time}


class SpanFileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as handle:
            for span in spans:
                handle.write(json.dumps(span_record(span)) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass
