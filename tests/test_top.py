"""`awa-pool top` in a real pseudo-terminal: it draws, refreshes, survives a
lost database connection and exits 0 on Ctrl-C (SIGINT from the terminal)
or q, leaving the screen as it found it."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios
import time
from typing import Optional

import pytest

from cli_run import ROOT, cli_env, ok
from helpers import query, wait_for

ENTER, LEAVE = b"\x1b[?1049h", b"\x1b[?1049l"


class Terminal:
    """A child process on the slave side of a pty (its controlling terminal)."""

    def __init__(self, argv: list, env: dict, rows: int = 40, cols: int = 160) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec at once
            try:
                os.chdir(str(ROOT))
                os.execve(sys.executable, [sys.executable] + argv, env)
            finally:
                os._exit(127)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.output = b""
        self.status: Optional[int] = None

    def read_until(self, predicate, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while not predicate(self.output):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out; the terminal shows:\n{self.output[-3000:]!r}")
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    if not predicate(self.output):
                        raise AssertionError(f"the terminal closed; it showed:\n{self.output[-3000:]!r}")
                    break
                self.output += chunk
        return self.output

    def frames(self) -> int:
        return self.output.count(b"(every ")

    def wait(self, timeout: float = 30.0) -> int:
        """Drain the output and reap the child; its exit code."""
        deadline = time.monotonic() + timeout
        while self.status is None:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.05)
                if ready:
                    self.output += os.read(self.fd, 65536)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                raise AssertionError(f"top did not exit; it showed:\n{self.output[-3000:]!r}")
        return self.status

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)


@pytest.fixture
def terminal_factory():
    opened = []

    def open_terminal(*args: str) -> Terminal:
        env = cli_env({"TERM": "xterm-256color"})
        env.pop("COLUMNS", None)  # the pty's window size decides
        term = Terminal(["-m", "awa_pool", "top", *args], env)
        opened.append(term)
        return term

    yield open_terminal
    for term in opened:
        term.close()


def test_top_draws_refreshes_and_exits_on_ctrl_c(pools, dsn: str, terminal_factory) -> None:
    pools.start("--queue", "default", "--queue", "images")
    wait_for(lambda: "leader" in ok("top", "--once", "--database-url", dsn), message="a live leader")
    ok("enqueue", "noop", "--queue", "images", "--database-url", dsn)

    term = terminal_factory("--interval", "0.3", "--database-url", dsn)
    screen = term.read_until(lambda out: b"SUPERVISORS (1 alive)" in out and b"frame 1;" in out)
    assert screen.startswith(ENTER) or ENTER in screen[:200]
    assert b"QUEUES" in screen and b"images" in screen and b"default" in screen
    assert b"leader" in screen and b"running" in screen
    term.read_until(lambda out: term.frames() >= 3)  # it redraws
    assert b"frame 3;" in term.output

    os.write(term.fd, b"\x03")  # Ctrl-C typed at the terminal: SIGINT to top
    assert term.wait() == 0
    assert term.output.rstrip().endswith(LEAVE)  # the screen is restored
    assert b"Traceback" not in term.output and b"error:" not in term.output


def test_top_shows_a_lost_database_and_recovers(dsn: str, terminal_factory) -> None:
    term = terminal_factory("--interval", "0.2", "--database-url", dsn)
    term.read_until(lambda out: b"QUEUES" in out)
    query(dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
               "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    term.read_until(lambda out: b"database unreachable" in out)
    seen = len(term.output)
    term.read_until(lambda out: b"QUEUES" in out[seen:])  # reconnected on the next frame
    os.write(term.fd, b"q")
    assert term.wait() == 0
    assert term.output.rstrip().endswith(LEAVE)


def test_top_exits_0_on_sigint_sent_to_the_process(dsn: str, terminal_factory) -> None:
    term = terminal_factory("--interval", "0.2", "--database-url", dsn)
    term.read_until(lambda out: b"frame 2;" in out)
    os.kill(term.pid, signal.SIGINT)
    assert term.wait() == 0
    assert term.output.rstrip().endswith(LEAVE)
