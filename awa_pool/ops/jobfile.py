"""Jobs described as JSON objects: the lines of `awa-pool enqueue --file
jobs.jsonl` and the single job of `awa-pool enqueue KIND --args`.

Pure: turns text into validated `Job`s and raises JobFileError naming the
file and line of the first bad entry, before anything touches the database.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Dict, List, Mapping

from ..core.config import parse_duration
from ..core.errors import ConfigError
from ..core.job import Job, Unique

JOB_KEYS = ("kind", "args", "queue", "priority", "delay", "run_at", "max_attempts", "timeout",
            "tags", "metadata", "ordering_key", "unique", "expires_in")


class JobFileError(ConfigError):
    """A job entry (or a line of a jobs file) is malformed."""


def job_from_object(entry: Mapping[str, Any], defaults: Mapping[str, Any]) -> Job:
    """A Job from a JSON object with JOB_KEYS; `defaults` fill keys the entry
    leaves out (the command line's --queue, --priority, --delay, ...)."""
    unknown = sorted(set(entry) - set(JOB_KEYS))
    if unknown:
        raise JobFileError(f"unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(JOB_KEYS)})")
    values: Dict[str, Any] = dict(defaults)
    values.update({key: value for key, value in entry.items() if value is not None})
    if "kind" not in values:
        raise JobFileError('"kind" is missing')
    if "run_at" in values and "delay" not in entry:
        values.pop("delay", None)  # an entry's own run_at beats a default delay
    options: Dict[str, Any] = {key: values[key] for key in (
        "queue", "priority", "max_attempts", "tags", "metadata", "ordering_key") if key in values}
    for key in ("delay", "timeout", "expires_in"):
        if key in values:
            raw = values[key]
            numeric = isinstance(raw, (int, float)) and not isinstance(raw, bool)
            options[key] = raw if numeric else parse_duration(raw, what=key)
    if "run_at" in values:
        options["run_at"] = _moment(values["run_at"])
    unique = values.get("unique")
    if unique is True:
        options["unique"] = Unique()
    elif isinstance(unique, dict):
        options["unique"] = Unique(**unique)
    elif unique not in (None, False):
        raise JobFileError('"unique" must be true or an object like {"by_args": true, "period": 3600}')
    try:
        return Job(values["kind"], values.get("args"), **options)
    except (TypeError, ValueError) as exc:
        raise JobFileError(str(exc)) from None


def _moment(value: Any) -> datetime:
    if not isinstance(value, str):
        raise JobFileError(f"run_at must be an ISO 8601 string with a time zone, got {value!r}")
    try:
        return datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise JobFileError(f"run_at {value!r} is not an ISO 8601 date-time "
                           "(like 2030-01-31T09:00:00+00:00)") from None


def parse_lines(lines: List[str], source: str, defaults: Mapping[str, Any]) -> List[Job]:
    """Every non-blank line as a Job; the first bad one raises JobFileError
    naming `source` and its line number."""
    jobs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JobFileError(f"{source} line {number}: not valid JSON: {exc.msg} "
                               f"at column {exc.colno}") from None
        if not isinstance(entry, dict):
            raise JobFileError(f"{source} line {number}: expected a JSON object like "
                               f'{{"kind": "send_email", "args": {{}}}}, got {type(entry).__name__}')
        try:
            jobs.append(job_from_object(entry, defaults))
        except (TypeError, ValueError) as exc:  # JobFileError and the Job's own checks
            raise JobFileError(f"{source} line {number}: {exc}") from None
    if not jobs:
        raise JobFileError(f"{source} has no jobs (expected one JSON object per line)")
    return jobs


def read_lines(path: str) -> List[str]:
    """The lines of a UTF-8 text file, with errors as one clear line."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except OSError as exc:
        raise JobFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise JobFileError(f"{path} is not UTF-8 text: {exc.reason}") from None
