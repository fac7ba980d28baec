"""Log setup for `awa-pool start`: one line per event, text or JSON, and
never a password (every record, traceback included, passes through
db.redact).

The events that matter each log one line where they happen: supervisor
start and stop (supervisor.py), leader change (leader.py), a child that
died with its cause, a recycle, a lost and a regained database connection
(supervisor.py), a rescued job (maintenance.py), and the metrics endpoint
(metrics.py), and each failed attempt, crash, timeout and poison verdict
(worker/failure_log.py). A multi-line traceback stays one JSON object in
json format; in text format its lines follow the line they belong to. A
child's traceback arrives as text: it rides in `exc_text`, which both
formats print as they print an exception's, and the structured fields of
a failure line (`awa_fields`) are written by the JSON format.
"""
from __future__ import annotations

import json
import logging
import time

from ..core.db import redact
from ..core.errors import ConfigError

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


# Control characters (a queue or kind name may hold any) would let data
# forge or split log lines: they are written as escapes.
_CONTROL = {code: f"\\x{code:02x}" for code in list(range(0x20)) + [0x7f] if code != 0x0a}


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message).translate(_CONTROL)
        if record.exc_info is None and "\n" in cleaned:
            cleaned = cleaned.replace("\n", "\\n")  # one event, one line
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        if record.exc_info is None and record.exc_text:   # a child's traceback (failure_log.py)
            record.exc_text = record.exc_text.translate(_CONTROL)
        return True


class TextFormatter(logging.Formatter):
    """The plain format, with the whole output (tracebacks too) redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, pid, message, the
    record's awa_fields if any[, exception]."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "pid": record.process,
            "message": redact(record.getMessage()),
        }
        for name, value in (getattr(record, "awa_fields", None) or {}).items():
            entry[name] = redact(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exception"] = redact(record.exc_text)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Send every log record to stderr, one line each, at `level` and up."""
    if not isinstance(level, str) or level.lower() not in LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ConfigError(f"--log-format must be text or json, got {fmt!r}")
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
