"""A real pseudo-terminal for CLI tests: `python -m awa_pool ...` runs on the
slave side (its controlling terminal, of a chosen size) and the test reads
what it draws, types keys and reaps it, with bounded waits."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from typing import Dict, List, Optional

from cli_run import ROOT, cli_env

ENTER, LEAVE = b"\x1b[?1049h", b"\x1b[?1049l"   # the alternate screen
SGR = re.compile(rb"\x1b\[([0-9;]*)m")


class Terminal:
    """`awa-pool ARGS` in a pty of rows x cols; TERM=xterm-256color, no COLUMNS."""

    def __init__(self, *args: str, env: Optional[Dict[str, str]] = None, rows: int = 40, cols: int = 160) -> None:
        environ = cli_env({"TERM": "xterm-256color", **(env or {})})
        environ.pop("COLUMNS", None)  # the pty's window size decides
        if "NO_COLOR" not in (env or {}):
            environ.pop("NO_COLOR", None)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec at once
            try:
                os.chdir(str(ROOT))
                os.execve(sys.executable, [sys.executable, "-m", "awa_pool", *args], environ)
            finally:
                os._exit(127)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.output = b""
        self.status: Optional[int] = None

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                raise AssertionError(f"awa-pool did not exit; it showed:\n{self.output[-3000:]!r}")
        while True:  # what it wrote just before exiting
            try:
                ready, _, _ = select.select([self.fd], [], [], 0)
                chunk = os.read(self.fd, 65536) if ready else b""
            except OSError:
                chunk = b""
            if not chunk:
                return self.status
            self.output += chunk

    def text(self) -> str:
        """The output without escape sequences, with plain newlines."""
        plain = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", self.output).replace(b"\r\n", b"\n")
        return plain.decode()

    def colours(self) -> List[str]:
        """Every SGR parameter that sets a colour (30-49 but 39/49, 90-107), in order."""
        found = []
        for params in SGR.findall(self.output):
            for param in params.decode().split(";"):
                if param and (30 <= int(param) <= 49 or 90 <= int(param) <= 107) and param not in ("39", "49"):
                    found.append(param)
        return found

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)
