"""Log setup for `awa-pool start`: one line per event, text or JSON, and
never a password (every record passes through db.redact)."""
from __future__ import annotations

import json
import logging
import time

from .db import redact
from .errors import ConfigError

LEVELS = ("debug", "info", "warning", "error")


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, ()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    if level.lower() not in LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in ("text", "json"):
        raise ConfigError(f"--log-format must be text or json, got {fmt!r}")
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
