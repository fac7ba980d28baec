"""What the supervisor's loop waits on: one selector over each child's
pipe (read, and write while its outbox holds messages) and process
sentinel, the LISTEN socket and the signal wakeup fd. Owned by the loop."""
from __future__ import annotations

import selectors
from typing import Any, Iterable, List, Set, Tuple

from .child_handle import ChildHandle

CHILD, WRITABLE, SENTINEL, NOTIFY, WAKEUP = "child", "writable", "sentinel", "notify", "wakeup"


class LoopEvents:
    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.writing: Set[int] = set()   # child pipes watched for writability (outbox pending)
        self.notify_fd = -1

    def select(self, timeout: float) -> List[Tuple[str, Any]]:
        """(kind, child or None) for each ready source."""
        return [key.data for key, _ in self.selector.select(timeout)]

    def watch_wakeup(self, fd: int) -> None:
        self.selector.register(fd, selectors.EVENT_READ, (WAKEUP, None))

    def watch_child(self, child: ChildHandle) -> None:
        self.selector.register(child.up_fd, selectors.EVENT_READ, (CHILD, child))
        self.selector.register(child.process.sentinel, selectors.EVENT_READ, (SENTINEL, child))

    def forget_child(self, child: ChildHandle) -> None:
        for fd in (child.up_fd, child.process.sentinel):
            self._unregister(fd)
        self._unwatch_writes(child)

    def watch_outboxes(self, children: Iterable[ChildHandle]) -> None:
        """Wait for a child's pipe to be writable only while messages for it
        wait in its outbox."""
        for child in children:
            if child.outbox.pending and child.down_fd not in self.writing:
                self.selector.register(child.down_fd, selectors.EVENT_WRITE, (WRITABLE, child))
                self.writing.add(child.down_fd)
            elif not child.outbox.pending and child.down_fd in self.writing:
                self._unwatch_writes(child)

    def watch_notifier(self, fd: int) -> None:
        self.notify_fd = fd
        self.selector.register(fd, selectors.EVENT_READ, (NOTIFY, None))

    def unwatch_notifier(self) -> None:
        # by the fd we registered: a broken connection may no longer report it
        if self.notify_fd >= 0:
            self._unregister(self.notify_fd)
            self.notify_fd = -1

    def close(self) -> None:
        self.selector.close()

    def _unwatch_writes(self, child: ChildHandle) -> None:
        if child.down_fd in self.writing:
            self.writing.discard(child.down_fd)
            self._unregister(child.down_fd)

    def _unregister(self, fd: int) -> None:
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError):
            pass
