"""Formatting for the command line: tables, human durations and sizes, job
details, and JSON-ready values. Pure: every function returns text (or, for
top.py, a rich renderable); cli.py decides where it goes.

Tables are rich Tables rendered by `to_text`: on a terminal, at its width
with a bold header and coloured states (rich honours NO_COLOR); anywhere
else, plain text as wide as its longest row, so a script reading a pipe
gets every value whole. rich is imported inside the functions that render:
it costs ~40 ms, which `--json` and the commands that print no table skip.
"""
from __future__ import annotations

import dataclasses
import enum
import io
import json
import shutil
import sys
from datetime import date, datetime, timezone
from typing import Any, Iterable, List, Optional, Sequence

ERROR_WIDTH = 60   # the last error shown in `jobs list` is cut to this many characters
PIPE_WIDTH = 1 << 16   # off a terminal no row is wrapped or cut below this many characters
STATE_STYLES = {"failed": "red", "completed": "green", "running": "cyan", "retryable": "yellow",
                "waiting_external": "magenta", "cancelled": "dim", "paused": "yellow"}


def jsonable(value: Any) -> Any:
    """Dataclasses, enums, datetimes and tuples as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.compare or f.name != "extra"}
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item) for item in value]
    return value


def to_json(value: Any) -> str:
    return json.dumps(jsonable(value), indent=2, ensure_ascii=False, default=str)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Iterable[int] = (),
          empty: str = "(none)") -> Any:
    """Rows under headers as a rich Table without borders, two spaces between
    columns; columns whose index is in `right` (numbers) are right-aligned.
    Cells are taken literally (no rich markup); a cell may be a (text, style)
    pair. With no rows, the `empty` sentence instead."""
    from rich.table import Table
    from rich.text import Text

    rows = list(rows)
    if not rows:
        return Text(empty)
    right_set = set(right)
    grid = Table(box=None, padding=(0, 1), pad_edge=False, show_edge=False, header_style="bold")
    for index, header in enumerate(headers):
        grid.add_column(header, justify="right" if index in right_set else "left", overflow="fold")
    for row in rows:
        grid.add_row(*(Text(*cell) if isinstance(cell, tuple) else Text("" if cell is None else str(cell))
                       for cell in row))
    return grid


def to_text(renderable: Any, *, terminal: Optional[bool] = None) -> str:
    """A rich renderable as the text cli.py prints: styled and at the
    terminal's width when stdout is a terminal, plain and unwrapped otherwise."""
    from rich.console import Console

    if terminal is None:
        terminal = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if terminal else PIPE_WIDTH
    console = Console(file=io.StringIO(), force_terminal=terminal, width=width, highlight=False)
    with console.capture() as captured:
        console.print(renderable)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


def styled(text: str) -> Any:
    """A state or status cell, coloured on a terminal."""
    return (text, STATE_STYLES.get(text.split(" ")[0], ""))


def seconds(value: Optional[float]) -> str:
    """12ms, 3.4s, 5m07s, 2h03m, 3d04h."""
    if value is None:
        return "-"
    value = float(value)
    if value < 0:
        return "-" + seconds(-value)
    if value == 0:
        return "0s"
    if value < 0.01:
        return f"{value * 1000:.2f}ms"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.1f}s" if value < 10 else f"{value:.0f}s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    if value < 86400:
        return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"
    return f"{int(value // 86400)}d{int(value % 86400 // 3600):02d}h"


def size(value: Optional[float]) -> str:
    """Bytes as 512B, 12.3KB, 45.6MB, 1.2GB."""
    if value is None:
        return "-"
    value = float(value)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1024 or unit == "GB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TB"  # pragma: no cover - unreachable


def rate(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def age(moment: Optional[datetime], now: Optional[datetime] = None) -> str:
    """How long ago (or, for a future moment, 'in ...')."""
    if moment is None:
        return "-"
    now = now or datetime.now(timezone.utc)
    delta = (now - moment).total_seconds()
    return f"in {seconds(-delta)}" if delta < 0 else f"{seconds(delta)} ago"


def stamp(moment: Optional[datetime]) -> str:
    """A moment in UTC, to the second."""
    if moment is None:
        return "-"
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def one_line(text: Any, width: int = ERROR_WIDTH) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def last_error(record: Any) -> str:
    if not record.errors:
        return ""
    return one_line(record.errors[-1].get("error") or record.errors[-1].get("kind") or "")


def jobs_table(records: Sequence[Any]) -> str:
    now = datetime.now(timezone.utc)
    rows = []
    for r in records:
        when = age(r.finalized_at, now) if r.finalized_at else (
            age(r.run_at, now) if r.run_at else "-")
        rows.append([r.id, r.kind, r.queue, styled(r.state.value + (" (dlq)" if r.dead_lettered else "")),
                     r.priority, f"{r.attempt}/{r.max_attempts}", age(r.created_at, now), when,
                     last_error(r)])
    return to_text(table(["ID", "KIND", "QUEUE", "STATE", "PRI", "ATTEMPT", "CREATED", "RUN/DONE", "LAST ERROR"],
                         rows, right=(0, 4, 5), empty="no jobs match"))


def _indented_json(value: Any, indent: str = "  ") -> List[str]:
    text = json.dumps(jsonable(value), indent=2, ensure_ascii=False, default=str)
    return [indent + line for line in text.splitlines()]


def job_detail(record: Any) -> str:
    """Everything about one job: fields, args, progress, result, attempts
    with their cost, and errors with tracebacks."""
    now = datetime.now(timezone.utc)
    state = record.state.value + (" (dead-lettered)" if record.dead_lettered else "")
    lines = [f"job {record.id}: {record.kind} in queue {record.queue!r}, {state}"]
    fields = [
        ("priority", record.priority),
        ("attempt", f"{record.attempt} of {record.max_attempts}"
                    + (f" ({record.crashes} crash{'es' if record.crashes != 1 else ''})" if record.crashes else "")),
        ("created", f"{stamp(record.created_at)} ({age(record.created_at, now)})"),
        ("run at", f"{stamp(record.run_at)} ({age(record.run_at, now)})" if record.run_at else "-"),
        ("finished", f"{stamp(record.finalized_at)} ({age(record.finalized_at, now)})"
                     if record.finalized_at else "-"),
        ("timeout", seconds(record.timeout) if record.timeout else "-"),
    ]
    if record.tags:
        fields.append(("tags", ", ".join(record.tags)))
    if record.metadata:
        fields.append(("metadata", json.dumps(jsonable(record.metadata), ensure_ascii=False)))
    if record.batch_id is not None:
        fields.append(("batch", record.batch_id))
    if record.ordering_key is not None:
        fields.append(("ordering key", record.ordering_key))
    if record.callback_id is not None:
        fields.append(("callback", record.callback_id))
    width = max(len(name) for name, _ in fields)
    lines += [f"  {name.ljust(width)}  {value}" for name, value in fields]

    lines += ["", "args:"] + _indented_json(record.args)
    lines += ["", "progress:"]
    if record.progress:
        progress = dict(record.progress)
        percent = progress.get("percent")
        head = f"  {percent:g}%" if isinstance(percent, (int, float)) else "  -"
        if progress.get("message"):
            head += f"  {progress['message']}"
        lines.append(head)
        if progress.get("metadata"):
            lines += _indented_json(progress["metadata"], "    ")
    else:
        lines.append("  (none)")
    lines += ["", "result:"]
    lines += _indented_json(record.result) if record.result is not None else ["  (none)"]

    lines += ["", "attempts:"]
    attempt_rows = [[a.get("attempt"), stamp(_as_datetime(a.get("started_at"))), a.get("outcome") or "",
                     seconds(a.get("wall_seconds")), seconds(a.get("cpu_seconds")),
                     size(a.get("peak_rss_bytes"))] for a in record.attempts]
    lines += ["  " + line for line in to_text(table(
        ["#", "STARTED", "OUTCOME", "WALL", "CPU", "PEAK RSS"], attempt_rows,
        right=(0, 3, 4, 5), empty="(none recorded)")).splitlines()]

    lines += ["", "errors:"]
    if not record.errors:
        lines.append("  (none)")
    for entry in record.errors:
        at = stamp(_as_datetime(entry.get("at")))
        kind = entry.get("kind")
        lines.append(f"  attempt {entry.get('attempt')} at {at}"
                     + (f" [{kind}]" if kind else "") + f": {entry.get('error') or ''}")
        if entry.get("traceback"):
            lines += ["    " + line for line in str(entry["traceback"]).rstrip().splitlines()]
    return "\n".join(lines)


def _as_datetime(value: Any) -> Optional[datetime]:
    if isinstance(value, datetime) or value is None:
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def queues_table(overviews: Sequence[Any]) -> str:
    rows = [[q.queue, styled("paused" if q.paused else ""), q.available, q.running, q.scheduled, q.retryable,
             q.waiting_external, q.failed, rate(q.jobs_per_s), seconds(q.lag_seconds)] for q in overviews]
    text = to_text(table(["QUEUE", "PAUSED", "AVAILABLE", "RUNNING", "SCHEDULED", "RETRYABLE", "WAITING",
                          "FAILED", "JOBS/S (1m)", "LAG"], rows, right=range(2, 10), empty="no queues yet"))
    return text + census_note(overviews)


def census_phrase(overviews: Sequence[Any]) -> str:
    """How old live counts are when they are not counted now
    (QueueDepth.counts_age_s), or "" when they are: the CLI, top and the
    dashboard say it the same way."""
    age = max((q.counts_age_s for q in overviews), default=0.0)
    return f"live counts as of the leader's census {seconds(age)} ago" if age else ""


def census_note(overviews: Sequence[Any]) -> str:
    """A line under live counts that are not counted now."""
    phrase = census_phrase(overviews)
    if not phrase:
        return ""
    return f"\n{phrase} (a backlog this deep is recounted every few seconds, not on every read)"


def queue_json(overview: Any) -> dict:
    value = jsonable(overview)
    value["jobs_per_s"] = round(overview.jobs_per_s, 3)
    return value


def policy_json(policy: Any) -> dict:
    return jsonable(policy)


def policy_line(policy: Any) -> str:
    """A queue's fleet-wide policy in one line (`queues set`, `queues show`)."""
    dlq = {True: "on", False: "off", None: "unset (off)"}[policy.dlq]
    limit = f"{policy.rate:g}/s" if policy.rate is not None else "none"
    running = f"{policy.global_max}" if policy.global_max is not None else "no limit"
    return (f"rate {limit}, dlq {dlq}, global max {running}, {policy.shards} lane(s)"
            + (", paused" if policy.paused else ""))


def queue_page(policy: Any, stats: Any) -> str:
    """`awa-pool queues show Q`: the policy, then the jobs by state."""
    lines = [f"queue {policy.queue}", f"  policy: {policy_line(policy)}"]
    if stats is None:
        lines.append("  jobs: none yet")
    else:
        limit = f" (of {policy.global_max} fleet-wide)" if policy.global_max is not None else ""
        lines.append(f"  jobs: {stats.available} available, {stats.running} running{limit}, {stats.scheduled} scheduled, "
                     f"{stats.retryable} retryable, {stats.waiting_external} waiting, {stats.completed} completed, "
                     f"{stats.failed} failed, {stats.cancelled} cancelled")
        lines.append(f"  lag {seconds(stats.lag_seconds)}, {rate(stats.jobs_per_s)} jobs/s over the last minute"
                     + census_note([stats]))
    return "\n".join(lines)


def kinds_table(kinds: Sequence[Any], window: Optional[str] = None, sample: int = 0) -> str:
    rows = [[k.kind, k.runs, k.completed, k.failures, k.crashes, k.timeouts,
             f"{seconds(k.wall_p50)} / {seconds(k.wall_p95)}",
             f"{seconds(k.cpu_p50)} / {seconds(k.cpu_p95)}",
             f"{size(k.rss_p50)} / {size(k.rss_p95)}", size(k.rss_max)] for k in kinds]
    text = to_text(table(["KIND", "RUNS", "OK", "FAILURES", "CRASHES", "TIMEOUTS", "WALL p50/p95",
                          "CPU p50/p95", "PEAK RSS p50/p95", "RSS MAX"], rows, right=range(1, 10),
                         empty="no attempts on record"))
    if not kinds:
        return text
    if window:
        return (text + f"\n\nevery figure: what finished in the last {window} (counts in whole minutes; "
                f"p50/p95 and RSS MAX: each kind's latest {sample:,} finished jobs in it)")
    return (text + "\n\ncounts: every attempt on record; p50/p95 and RSS MAX: each kind's latest "
            f"{sample:,} finished jobs (--since for a window)")


def schedules_table(schedules: Sequence[Any]) -> str:
    now = datetime.now(timezone.utc)
    rows = []
    for s in schedules:
        next_fire = styled("paused") if s.paused else (
            f"{stamp(s.next_fire_at)} ({age(s.next_fire_at, now)})" if s.next_fire_at else (s.error or "-"))
        rows.append([s.name, s.expression, s.timezone, s.kind, s.queue, s.missed_fire_policy,
                     age(s.last_fire_at, now) if s.last_fire_at and s.last_job_id else "never", next_fire,
                     s.last_job_id or ""])
    return to_text(table(["NAME", "SCHEDULE", "TZ", "KIND", "QUEUE", "MISSED", "LAST FIRE", "NEXT FIRE",
                          "LAST JOB"], rows,
                         empty="no periodic jobs registered (they are registered when a pool starts)"))


def dlq_table(records: Sequence[Any]) -> str:
    now = datetime.now(timezone.utc)
    rows = [[r.id, r.kind, r.queue, f"{r.attempt}/{r.max_attempts}", age(r.finalized_at, now), last_error(r)]
            for r in records]
    return to_text(table(["ID", "KIND", "QUEUE", "ATTEMPTS", "FAILED", "LAST ERROR"], rows, right=(0, 3),
                         empty="the dead-letter queue is empty"))
