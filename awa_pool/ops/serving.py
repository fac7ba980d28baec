"""Stopping an HTTP server that serves from a thread of its own (the
metrics' and the health probes')."""
from __future__ import annotations

import threading
from typing import Any, Optional


def stop_serving(server: Optional[Any], thread: Optional[threading.Thread]) -> None:
    """End serve_forever, close the socket, join the thread (either may be None)."""
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(timeout=5)
