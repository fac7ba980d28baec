"""The supervisor's signals: handlers that only record, a wakeup pipe for
its select loop, and the host program's own handlers chained, then put back.

A handler does no work (no logging, no I/O, no locks): it appends the
signal to a list; Python's wakeup fd wakes the loop, which takes the list
and acts. When a program embeds a Pool, the handlers it had installed for
SIGTERM, SIGINT, SIGQUIT and SIGHUP still run: from the loop, right after
the supervisor took the signal, with `frame=None` (the interrupted frame
is long gone by then). When the supervisor stops, every handler it
replaced, and the wakeup fd it found, is put back.

What cannot be chained, and why:
- SIG_DFL and SIG_IGN are dispositions, not functions: there is nothing
  to call, and acting on them (dying, or ignoring SIGTERM) would defeat the
  drain. The pool drains; after it stops, the disposition is back.
- `signal.default_int_handler` (Python's own SIGINT handler) raises
  KeyboardInterrupt, which inside the loop would abandon running jobs; the
  pool drains instead (a second Ctrl-C stops at once).
- A handler installed by C code (`signal.getsignal` returns None) cannot be
  called or reinstalled from Python; SIG_DFL is put back in its place.
- SIGCHLD is never chained: a host handler that reaps with waitpid(-1)
  would collect the pool's children before the supervisor names their deaths.

A chained handler that raises an Exception is logged and the drain goes
on. One that raises SystemExit or KeyboardInterrupt (a handler calling
sys.exit is common) asked the program to end: Pool.run raises it again once
the pool has drained, so the host exits as its handler wanted, without
abandoning jobs.

Outside the main thread Python allows no signal handlers: the relay then
installs none, and the host stops the pool with Pool.stop().
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import threading
from typing import Any, Dict, List, Optional, Tuple

log = logging.getLogger(__name__)

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD)
CHAINED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP})


def chainable(handler: Any) -> bool:
    """Is this previous handler a Python function the loop may call?"""
    return callable(handler) and handler is not signal.default_int_handler


class SignalRelay:
    """Signals for one supervisor run: install(), then take() in the loop,
    then restore()."""

    def __init__(self) -> None:
        self.pending: List[Tuple[int, bool]] = []  # (signum, sent by the OS rather than stop())
        self.previous: Dict[int, Any] = {}
        self.previous_wakeup_fd = -1
        self.read_fd = self.write_fd = -1
        self.host_exit: Optional[BaseException] = None  # a chained handler's SystemExit, for Pool.run

    def install(self) -> int:
        """Open the wakeup pipe and, in the main thread, take over the
        signals; returns the fd the loop watches."""
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        if threading.current_thread() is not threading.main_thread():
            log.info("the pool runs outside the main thread: it installs no signal handlers "
                     "(the host stops it with Pool.stop())")
            return self.read_fd
        self.previous_wakeup_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        for signum in HANDLED:
            self.previous[signum] = signal.signal(signum, self._record)
        return self.read_fd

    def _record(self, signum: int, frame: Any) -> None:
        if signum != signal.SIGCHLD:  # SIGCHLD only wakes the loop (child sentinels say who died)
            self.pending.append((signum, True))

    def request_stop(self) -> None:
        """Ask for a drain, as SIGTERM does, without chaining the host's
        handler; safe from another thread or a signal handler."""
        self.pending.append((signal.SIGTERM, False))
        self.wake()

    def wake(self) -> None:
        """Make the loop look around now; safe from any thread."""
        if self.write_fd >= 0:
            try:
                os.write(self.write_fd, b"\0")
            except OSError:
                pass

    def drain_wakeup(self) -> None:
        try:
            while os.read(self.read_fd, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise

    def take(self) -> List[Tuple[int, Optional[str]]]:
        """The signals recorded since the last call, oldest first, as
        (signum, name); the name is None for a stop() request. The host's
        handler of each signal runs here, in the loop."""
        taken = []
        while self.pending:
            signum, delivered = self.pending.pop(0)
            taken.append((signum, signal.Signals(signum).name if delivered else None))
            if delivered:
                self._chain(signum)
        return taken

    def _chain(self, signum: int) -> None:
        handler = self.previous.get(signum)
        if signum not in CHAINED or not chainable(handler):
            return
        name = signal.Signals(signum).name
        try:
            handler(signum, None)
        except Exception:
            log.exception("the host program's %s handler raised; the pool drains anyway", name)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: the host wants to end
            log.info("the host program's %s handler raised %s: raised again once the pool has stopped",
                     name, type(exc).__name__)
            if self.host_exit is None:
                self.host_exit = exc

    def restore(self) -> None:
        """Chain what is still pending, put back every handler and the
        wakeup fd found at install, close the pipe."""
        for signum, name in self.take():
            if name is not None:
                log.info("%s during the final stop: the pool was already stopping", name)
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if self.previous:
            try:
                signal.set_wakeup_fd(self.previous_wakeup_fd)
            except (ValueError, OSError):  # that fd was closed meanwhile
                signal.set_wakeup_fd(-1)
        self.previous.clear()
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                os.close(fd)
        self.read_fd = self.write_fd = -1
