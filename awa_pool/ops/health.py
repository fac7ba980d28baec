"""HTTP health probes: `awa-pool start --health-port P` and
`Pool(health_port=P)` serve

- `/livez`: 200 while the supervisor's loop turns, 503 before its first
  turn, once it stopped, or when a turn has not completed for
  LIVE_TURN_BOUND_S (the loop is stuck: restarting the process helps);
- `/readyz`: 200 when the loop turns, the supervisor is connected to the
  database, registered and running (not starting, draining or stopping).

On the standard library's http.server, in a daemon thread of its own,
reading what the loop publishes (LoopTurn, the session, the lifecycle
state) as plain attributes: a probe never waits for the loop or the
database. The body is a small JSON object saying why.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Tuple

from ..worker.states import RUNNING, STOPPED
from .serving import stop_serving

log = logging.getLogger(__name__)

# Longer than any turn that still makes progress: every loop statement is
# bounded (statement_timeout 5 s, cut by the watchdog at 7 s), a reconnect
# attempt by its connect timeout (at most 10 s).
LIVE_TURN_BOUND_S = 30.0
DEFAULT_HOST = "0.0.0.0"   # a kubelet probes the pod's address, not its loopback


def liveness(supervisor: Any, now: float, bound: float = LIVE_TURN_BOUND_S) -> Tuple[bool, str]:
    """(alive, why) of the supervisor's loop at `now` (time.monotonic())."""
    turn = supervisor.turn
    if supervisor.state == STOPPED:
        return False, "the supervisor has stopped"
    if not turn.turned:
        return False, "starting: the loop has not turned yet"
    started = turn.started
    if started is not None and now - started > bound:
        statement = turn.statement
        waiting = f" (waiting on {statement.what})" if statement is not None else ""
        return False, f"the loop's turn has not completed for {now - started:.0f}s{waiting}"
    return True, "the loop turns"


def readiness(supervisor: Any, now: float, bound: float = LIVE_TURN_BOUND_S) -> Tuple[bool, str]:
    """(ready, why): the loop turns, connected, registered, running."""
    alive, why = liveness(supervisor, now, bound)
    if not alive:
        return False, why
    if supervisor.supervisor_id is None:
        return False, "not registered"
    if not supervisor.session.connected:
        return False, "not connected to the database"
    if supervisor.state != RUNNING:
        return False, f"{supervisor.state}: not taking jobs"
    return True, "connected, registered, running"


class HealthServer:
    """The probe endpoints of one supervisor, on their own thread."""

    def __init__(self, supervisor: Any, bound: float = LIVE_TURN_BOUND_S) -> None:
        self.supervisor = supervisor
        self.bound = bound
        self.server: Optional[ThreadingHTTPServer] = None
        self.thread: Optional[threading.Thread] = None
        self.port: Optional[int] = None

    def serve(self, port: int, host: str = DEFAULT_HOST) -> int:
        """Bind and serve in a daemon thread; returns the bound port (0
        picks one). A port that cannot be bound raises OSError at once."""
        probes = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 5   # a client that stalls cannot hold a thread for long

            def do_GET(self) -> None:   # noqa: N802 (http.server's name)
                check = {"/livez": liveness, "/readyz": readiness}.get(self.path.split("?", 1)[0])
                if check is None:
                    self._answer(404, {"error": "not found: /livez and /readyz are served here"})
                    return
                ok, why = check(probes.supervisor, time.monotonic(), probes.bound)
                self._answer(200 if ok else 503, {"ok": ok, "reason": why, "state": probes.supervisor.state,
                                                  "supervisor_id": probes.supervisor.supervisor_id})

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:   # noqa: A002
                pass   # a probe every few seconds is not a log line

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise OSError(f"cannot serve health probes on {host}:{port}: {exc.strerror or exc}") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="awa-pool-health", daemon=True)
        self.thread.start()
        log.info("serving health probes on http://%s:%d/livez and /readyz", host, self.port)
        return self.port

    def close(self) -> None:
        stop_serving(self.server, self.thread)
        self.server = self.thread = None
