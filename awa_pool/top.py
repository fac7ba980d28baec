"""`awa-pool top`: the live view of queues, supervisors, children and
throughput.

`Snapshot.collect` reads queues and live supervisors in one short
transaction; `render` turns a snapshot into lines that fit the terminal;
`run_live` redraws them on the stream cli.py hands it (plain ANSI, no
curses), until `q` or Ctrl-C. It never prints or exits on its own.
"""
from __future__ import annotations

import os
import select
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional

import psycopg2

from .cli_output import rate, seconds, size, table
from .db import connect, describe, first_line
from .errors import AwaError
from .stats import QueueStats, SupervisorInfo, live_supervisors, queue_stats

# ANSI sequences: alternate screen, cursor, home, clear to end of line/screen.
ENTER_SCREEN = "\x1b[?1049h\x1b[?25l"
LEAVE_SCREEN = "\x1b[?25h\x1b[?1049l"
HOME = "\x1b[H"
CLEAR_EOL = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"


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
        from .cli_output import jsonable, queue_json

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


def render(snapshot: Snapshot, *, title: str, width: int = 100, height: int = 40,
           interval: float = 1.0, frame: int = 0, color: bool = True) -> List[str]:
    """The lines of one frame, cut to width x height."""
    bold = (lambda text: f"{BOLD}{text}{RESET}") if color else (lambda text: text)
    clock = snapshot.taken_at.astimezone().strftime("%H:%M:%S")
    lines = [bold(f"awa-pool top  {title}") + f"  {clock}  (every {interval:g}s, frame {frame}; "
             "q or Ctrl-C quits)"]
    if snapshot.error:
        lines += ["", f"database unreachable: {snapshot.error} (retrying)"]
        return _fit(lines, width, height)

    sups = snapshot.supervisors
    children = sum(s.children for s in sups)
    busy = sum(s.busy for s in sups)
    idle = sum(s.idle for s in sups)
    total_10s = sum(q.jobs_per_s_10s for q in snapshot.queues)
    total_60s = sum(q.jobs_per_s for q in snapshot.queues)
    waiting = sum(q.available for q in snapshot.queues)
    lines.append(f"children {busy} busy / {idle} idle of {children} {_bar(busy, children, 20)}   "
                 f"throughput {rate(total_10s)} jobs/s (10s), {rate(total_60s)} jobs/s (1m)   "
                 f"available {waiting}")
    lines.append("")
    lines.append(bold("QUEUES"))
    queue_rows = [[q.queue, "paused" if q.paused else "", q.available, q.running, q.scheduled,
                   q.retryable, q.waiting_external, q.failed, rate(q.jobs_per_s_10s), rate(q.jobs_per_s),
                   seconds(q.lag_seconds)] for q in snapshot.queues]
    lines += table(["QUEUE", "PAUSED", "AVAIL", "RUNNING", "SCHED", "RETRY", "WAITING", "FAILED",
                    "JOBS/S 10s", "JOBS/S 1m", "LAG"], queue_rows, right=range(2, 11),
                   empty="(no queues yet)").splitlines()
    lines.append("")
    lines.append(bold(f"SUPERVISORS ({len(sups)} alive)"))
    sup_rows = []
    for s in sups:
        sup_rows.append([s.id, s.hostname, s.pid, "leader" if s.is_leader else "", s.state,
                         f"{s.busy}/{s.children} {_bar(s.busy, s.children)}", s.idle,
                         s.counter("completed"), s.counter("failed", "fatal", "retry"),
                         s.counter("crash"), s.counter("timeout"), s.counter("recycled"),
                         size(s.rss_bytes) if s.rss_bytes else "-", seconds(s.heartbeat_age_s)])
    lines += table(["ID", "HOST", "PID", "ROLE", "STATE", "BUSY", "IDLE", "DONE", "FAILED", "CRASHED",
                    "TIMEOUTS", "RECYCLED", "RSS", "HEARTBEAT"], sup_rows, right=(0, 2, 6, 7, 8, 9, 10, 11),
                   empty="(no live supervisor: start one with awa-pool start)").splitlines()
    return _fit(lines, width, height)


def _fit(lines: List[str], width: int, height: int) -> List[str]:
    out = []
    for line in lines[:max(1, height - 1)]:
        visible = _visible_length(line)
        if visible > width:
            line = _cut(line, width)
        out.append(line)
    return out


def _visible_length(line: str) -> int:
    length, escape = 0, False
    for char in line:
        if char == "\x1b":
            escape = True
        elif escape:
            if char.isalpha():
                escape = False
        else:
            length += 1
    return length


def _cut(line: str, width: int) -> str:
    out, length, escape = [], 0, False
    for char in line:
        if char == "\x1b":
            escape = True
        if escape:
            out.append(char)
            if char.isalpha():
                escape = False
            continue
        if length >= width:
            continue
        out.append(char)
        length += 1
    return "".join(out) + (RESET if "\x1b" in line else "")


def frame_text(lines: List[str]) -> str:
    """A whole redraw: home, each line cleared to its end, the rest cleared."""
    return HOME + "".join(line + CLEAR_EOL + "\r\n" for line in lines) + CLEAR_BELOW


def run_live(url: str, conn: Any, interval: float, *, stream: Any, keys: Any) -> Any:
    """Redraw every `interval` seconds on `stream` (a terminal) until q is
    read from `keys` or Ctrl-C; restores the screen either way. A lost
    database shows in the frame and is retried, never fatal. Returns the
    connection still open (or None)."""
    title = describe(url)
    stream.write(ENTER_SCREEN)
    frame = 0
    try:
        with Keys(keys) as reader:
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
                width, height = shutil.get_terminal_size((100, 40))
                stream.write(frame_text(render(snapshot, title=title, width=width, height=height,
                                               interval=interval, frame=frame)))
                stream.flush()
                if reader.quit_within(interval):
                    break
    except KeyboardInterrupt:
        pass  # Ctrl-C is the normal way out
    finally:
        stream.write(LEAVE_SCREEN)
        stream.flush()
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
