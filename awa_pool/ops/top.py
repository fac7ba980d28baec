"""`awa-pool top`: the live view of queues, supervisors, children and
throughput.

`Snapshot.collect` reads queues and live supervisors in one short
transaction (the data); `view` turns a snapshot into a rich renderable (the
rendering); `run_live` redraws it with rich's Live on the alternate screen
of the terminal cli.py hands it, until `q` or Ctrl-C. It never prints or
exits on its own. rich is imported only when a frame is drawn.
"""
from __future__ import annotations

import os
import select
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional

import psycopg2

from .cli_output import census_note, jsonable, queue_json, rate, seconds, size, styled, table
from ..core.db import connect, describe, first_line
from ..core.errors import AwaError
from .stats import QueueStats, SupervisorInfo, live_supervisors, queue_stats


@dataclass
class Snapshot:
    """One frame's data (or the error that prevented reading it)."""

    taken_at: datetime
    queues: List[QueueStats] = field(default_factory=list)
    supervisors: List[SupervisorInfo] = field(default_factory=list)
    error: Optional[str] = None

    @classmethod
    def collect(cls, conn: Any) -> "Snapshot":
        try:
            queues = queue_stats(conn)
            supervisors = live_supervisors(conn)
        finally:
            conn.rollback()  # never sit idle in a transaction between frames
        return cls(datetime.now(timezone.utc), queues, supervisors)

    @classmethod
    def failed(cls, error: str) -> "Snapshot":
        return cls(datetime.now(timezone.utc), error=error)

    def as_json(self) -> Dict[str, Any]:
        busy = sum(s.busy for s in self.supervisors)
        children = sum(s.children for s in self.supervisors)
        return {
            "taken_at": self.taken_at.isoformat(),
            "queues": [queue_json(q) for q in self.queues],
            "supervisors": [dict(jsonable(s), busy=s.busy, idle=s.idle, children=s.children)
                            for s in self.supervisors],
            "children": {"total": children, "busy": busy, "idle": sum(s.idle for s in self.supervisors)},
            "jobs_per_s": round(sum(q.jobs_per_s for q in self.queues), 3),
            "error": self.error,
        }


def _bar(busy: int, total: int, width: int = 10) -> str:
    if total <= 0:
        return "[" + " " * width + "]"
    filled = min(width, round(width * busy / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def view(snapshot: Snapshot, *, title: str, interval: float = 1.0, frame: int = 0) -> Any:
    """One frame: a header, the queues table and the supervisors table."""
    from rich.console import Group
    from rich.text import Text

    clock = snapshot.taken_at.astimezone().strftime("%H:%M:%S")
    header = Text.assemble((f"awa-pool top  {title}", "bold"),
                           f"  {clock}  (every {interval:g}s, frame {frame}; q or Ctrl-C quits)")
    if snapshot.error:
        return Group(header, "", Text(f"database unreachable: {snapshot.error} (retrying)", style="red"))

    sups = snapshot.supervisors
    children = sum(s.children for s in sups)
    busy = sum(s.busy for s in sups)
    idle = sum(s.idle for s in sups)
    total_10s = sum(q.jobs_per_s_10s for q in snapshot.queues)
    total_60s = sum(q.jobs_per_s for q in snapshot.queues)
    waiting = sum(q.available for q in snapshot.queues)
    summary = Text(f"children {busy} busy / {idle} idle of {children} {_bar(busy, children, 20)}   "
                   f"throughput {rate(total_10s)} jobs/s (10s), {rate(total_60s)} jobs/s (1m)   "
                   f"available {waiting}")
    queue_rows = [[q.queue, styled("paused" if q.paused else ""), q.available, q.running, q.scheduled,
                   q.retryable, q.waiting_external, q.failed, rate(q.jobs_per_s_10s), rate(q.jobs_per_s),
                   seconds(q.lag_seconds)] for q in snapshot.queues]
    queues = table(["QUEUE", "PAUSED", "AVAIL", "RUNNING", "SCHED", "RETRY", "WAITING", "FAILED",
                    "JOBS/S 10s", "JOBS/S 1m", "LAG"], queue_rows, right=range(2, 11), empty="(no queues yet)")
    sup_rows = [[s.id, s.hostname, s.pid, ("leader", "bold") if s.is_leader else "", styled(s.state),
                 f"{s.busy}/{s.children} {_bar(s.busy, s.children)}", s.idle,
                 s.counter("completed"), s.counter("failed", "fatal", "retry"),
                 s.counter("crash"), s.counter("timeout"), s.counter("recycled"),
                 size(s.rss_bytes) if s.rss_bytes else "-", seconds(s.heartbeat_age_s)] for s in sups]
    supervisors = table(["ID", "HOST", "PID", "ROLE", "STATE", "BUSY", "IDLE", "DONE", "FAILED", "CRASHED",
                         "TIMEOUTS", "RECYCLED", "RSS", "HEARTBEAT"], sup_rows, right=(0, 2, 6, 7, 8, 9, 10, 11),
                        empty="(no live supervisor: start one with awa-pool start)")
    census = census_note(snapshot.queues).strip()
    below = [Text(census, style="dim")] if census else []
    return Group(header, summary, "", Text("QUEUES", style="bold"), queues, *below,
                 "", Text(f"SUPERVISORS ({len(sups)} alive)", style="bold"), supervisors)


def run_live(url: str, conn: Any, interval: float, *, stream: Any, keys: Any) -> Any:
    """Redraw every `interval` seconds on `stream` (a terminal) until q is
    read from `keys` or Ctrl-C; rich's Live restores the screen either way.
    A lost database shows in the frame and is retried, never fatal. Returns
    the connection still open (or None)."""
    from rich.console import Console
    from rich.live import Live

    title = describe(url)
    console = Console(file=stream, highlight=False)
    frame = 0
    try:
        with Keys(keys) as reader, Live(console=console, screen=True, auto_refresh=False,
                                        redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                frame += 1
                try:
                    if conn is None or conn.closed:
                        conn = connect(url, connect_timeout=3)
                    snapshot = Snapshot.collect(conn)
                except (psycopg2.Error, AwaError) as exc:
                    if conn is not None and not conn.closed:
                        conn.close()
                    conn = None
                    snapshot = Snapshot.failed(first_line(exc))
                live.update(view(snapshot, title=title, interval=interval, frame=frame), refresh=True)
                if reader.quit_within(interval):
                    break
    except KeyboardInterrupt:
        pass  # Ctrl-C is the normal way out
    return conn


class Keys:
    """Single key presses from a terminal; cbreak mode keeps Ctrl-C a signal."""

    def __init__(self, stream: Any) -> None:
        try:
            self.fd: Optional[int] = stream.fileno() if stream.isatty() else None
        except (AttributeError, ValueError, OSError):
            self.fd = None
        self.saved: Any = None

    def __enter__(self) -> "Keys":
        if self.fd is not None:
            import termios
            import tty

            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def quit_within(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; True once q (or end of input) is read."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.fd is None:
                time.sleep(remaining)
                return False
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                pressed = os.read(self.fd, 64)
                if not pressed or b"q" in pressed.lower():
                    return True
