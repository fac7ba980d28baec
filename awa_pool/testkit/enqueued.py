"""What a test enqueued: the jobs in a database, filtered by kind, args and
any JobRecord field, and assertions that fail with a message listing what
was enqueued instead (the pytest plugin's `awa_enqueued` fixture).

    enqueued = Enqueued(conn)
    enqueued.assert_enqueued("send_receipt", {"order_id": 42}, queue="mail")
    enqueued.assert_not_enqueued("send_receipt", {"order_id": 43})

Jobs are read through `conn`, so a test sees the jobs its own transaction
enqueued as well as those other connections committed; every state counts
(a job that already ran was still enqueued), unless a `state=` is given.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional

from ..api.admin import list_jobs
from ..core.job import JobRecord

MAX_JOBS_READ = 100_000
MAX_JOBS_LISTED = 20           # lines of "enqueued instead" in a failure message
FIELDS = tuple(f.name for f in dataclasses.fields(JobRecord) if f.name not in ("kind", "args", "extra"))


class Enqueued:
    """The jobs visible through `conn`, in the order they were enqueued."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def jobs(self, kind: Optional[str] = None, args: Optional[Mapping[str, Any]] = None, *,
             args_include: Optional[Mapping[str, Any]] = None, **fields: Any) -> List[JobRecord]:
        """Jobs of `kind` (any kind when None) whose args equal `args`, whose
        args hold every item of `args_include`, and whose other fields equal
        `fields` (queue=, priority=, state=, tags=, metadata=, ...)."""
        _check_fields(fields)
        records = list_jobs(self.conn, kind=kind, limit=MAX_JOBS_READ)
        records.reverse()  # list_jobs is newest first
        return [record for record in records if _matches(record, args, args_include, fields)]

    def assert_enqueued(self, kind: str, args: Optional[Mapping[str, Any]] = None, *,
                        count: Optional[int] = None, args_include: Optional[Mapping[str, Any]] = None,
                        **fields: Any) -> JobRecord:
        """Fail unless a job matches (exactly `count` of them, when given);
        returns the first match."""
        __tracebackhide__ = True
        matching = self.jobs(kind, args, args_include=args_include, **fields)
        if matching and (count is None or len(matching) == count):
            return matching[0]
        wanted = _describe_wanted(kind, args, args_include, fields)
        if count is not None and matching:
            head = (f"expected {count} job(s) {wanted}, found {len(matching)} "
                    f"(ids {[record.id for record in matching]})")
        else:
            head = f"expected {'%d job(s)' % count if count else 'a job'} {wanted}, found none"
        raise AssertionError(head + self._instead(fields))

    def assert_not_enqueued(self, kind: str, args: Optional[Mapping[str, Any]] = None, *,
                            args_include: Optional[Mapping[str, Any]] = None, **fields: Any) -> None:
        """Fail if any job matches, listing the ones that do."""
        __tracebackhide__ = True
        matching = self.jobs(kind, args, args_include=args_include, **fields)
        if matching:
            wanted = _describe_wanted(kind, args, args_include, fields)
            raise AssertionError(f"expected no job {wanted}, found {len(matching)}:\n"
                                 + _listing(matching, fields))

    def _instead(self, fields: Dict[str, Any]) -> str:
        everything = self.jobs()
        if not everything:
            return ": no job was enqueued at all"
        return f"; enqueued instead ({len(everything)}):\n" + _listing(everything, fields)


def _check_fields(fields: Dict[str, Any]) -> None:
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise TypeError(f"unknown job field(s) {', '.join(unknown)}: use args=, args_include= "
                        f"or one of {', '.join(FIELDS)}")


def _same(actual: Any, expected: Any) -> bool:
    if isinstance(actual, tuple) and isinstance(expected, list):  # tags=["a"] means ("a",)
        expected = tuple(expected)
    return bool(actual == expected)


def _matches(record: JobRecord, args: Optional[Mapping[str, Any]],
             args_include: Optional[Mapping[str, Any]], fields: Dict[str, Any]) -> bool:
    if args is not None and record.args != dict(args):
        return False
    if args_include is not None and any(
            key not in record.args or not _same(record.args[key], value) for key, value in args_include.items()):
        return False
    return all(_same(getattr(record, name), value) for name, value in fields.items())


def _describe_wanted(kind: Optional[str], args: Optional[Mapping[str, Any]],
                     args_include: Optional[Mapping[str, Any]], fields: Dict[str, Any]) -> str:
    parts = [f"of kind {kind!r}" if kind is not None else "of any kind"]
    if args is not None:
        parts.append(f"with args {dict(args)!r}")
    if args_include is not None:
        parts.append(f"with args including {dict(args_include)!r}")
    parts.extend(f"{name}={value!r}" for name, value in fields.items())
    return " ".join(parts)


def _listing(records: List[JobRecord], fields: Dict[str, Any]) -> str:
    shown = ["queue", "state", *(name for name in fields if name not in ("queue", "state"))]
    lines = []
    for record in records[:MAX_JOBS_LISTED]:
        extra = " ".join(f"{name}={_plain(getattr(record, name))!r}" for name in shown)
        lines.append(f"  #{record.id} {record.kind} args={record.args!r} {extra}")
    if len(records) > MAX_JOBS_LISTED:
        lines.append(f"  ... and {len(records) - MAX_JOBS_LISTED} more")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    return value.value if hasattr(value, "value") and isinstance(value, str) else value
