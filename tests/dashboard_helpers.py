"""Shared by the dashboard tests: building a Flask test client on a test
database, posting forms with this client's CSRF token, and jobs in the
states the pages show (run inline through the real SQL with
awa_pool.testing.drain, so errors carry real tracebacks)."""
from __future__ import annotations

import re
import socket
import threading
from typing import Any, Dict, List, Optional

import psycopg2

import awa_pool
import awa_pool.testing
from awa_pool.dashboard.auth import CSRF_COOKIE, CSRF_FIELD

import apps.basic  # noqa: F401  (registers noop, add, fail, ...)


def csrf_of(client: Any) -> str:
    """This test client's CSRF token (a GET sets the cookie first)."""
    cookie = client.get_cookie(CSRF_COOKIE)
    if cookie is None:
        client.get("/login")
        client.get("/")
        cookie = client.get_cookie(CSRF_COOKIE)
    assert cookie is not None, "no CSRF cookie was set"
    return cookie.value


def post(client: Any, path: str, data: Optional[Dict[str, Any]] = None, **kwargs: Any) -> Any:
    form = dict(data or {})
    form[CSRF_FIELD] = csrf_of(client)
    return client.post(path, data=form, **kwargs)


def enqueue(dsn: str, *jobs: awa_pool.Job) -> List[int]:
    conn = psycopg2.connect(dsn)
    try:
        with conn:
            return awa_pool.enqueue_many(conn, list(jobs))
    finally:
        conn.close()


def drain(dsn: str, queue: Optional[str] = None) -> list:
    conn = psycopg2.connect(dsn)
    try:
        with conn:
            return awa_pool.testing.drain(conn, queue)
    finally:
        conn.close()


def failed_job(dsn: str, message: str = "the disk is full", queue: str = "default") -> int:
    """A job whose only attempt raised ValueError(message): state failed."""
    (job_id,) = enqueue(dsn, awa_pool.Job("fail", {"message": message}, queue=queue, max_attempts=1))
    drain(dsn, queue)
    return job_id


def text(response: Any) -> str:
    return response.get_data(as_text=True)


def visible(html: str) -> str:
    """The page's text without tags (for 'the page says X' checks)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


class TcpProxy:
    """A loopback TCP forwarder to the database that a test can cut and
    restore, so 'the database went away and came back' needs no server
    restart. Every socket it opened is closed by stop()."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._listener: Optional[socket.socket] = None
        self._sockets: List[socket.socket] = []
        self._lock = threading.Lock()

    def _connect_upstream(self) -> socket.socket:
        host, port = self.upstream
        if host.startswith("/"):  # a Unix-socket server (the embedded one)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.settimeout(5)
            server.connect(f"{host}/.s.PGSQL.{port}")
            return server
        return socket.create_connection(self.upstream, timeout=5)

    def start(self) -> "TcpProxy":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = self._connect_upstream()
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        if self._listener is not None:
            try:   # wakes the thread blocked in accept(); close() alone would not
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def start_dashboard(processes: Any, dsn: Optional[str], *args: str, env: Optional[Dict[str, str]] = None,
                    timeout: float = 30.0) -> str:
    """Run the real `awa-pool dashboard --port 0 ...` and return its base URL
    (read from the line it prints once it listens). dsn None: no URL at all
    (the embedded server)."""
    import sys
    import time

    from cli_run import URL_VARS, cli_env

    url_args = ["--database-url", dsn] if dsn else []
    full_env = cli_env(env)
    if dsn is None:   # Processes.start begins from os.environ: blank the URL variables explicitly
        full_env.update({name: "" for name in URL_VARS})
    proc = processes.start([sys.executable, "-m", "awa_pool", "dashboard", "--port", "0", *url_args, *args],
                           env=full_env, name="dashboard")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = proc.log_path.read_text(errors="replace")
        found = re.search(r"awa-pool dashboard on (http://\S+?)/?(?: \(read-only\))? for ", log)
        if found:
            return found.group(1)
        if proc.poll() is not None:
            raise AssertionError(f"the dashboard exited {proc.returncode}:\n{log}")
        time.sleep(0.05)
    raise AssertionError(f"the dashboard did not say where it listens within {timeout:g}s:\n"
                         f"{proc.log_path.read_text(errors='replace')}")
