"""A private PgBouncer for the multi-host tests: Debian's /usr/sbin/pgbouncer
with its own configuration in a temporary directory, on a free port of the
address it is given, in front of one PostgreSQL server, in transaction or
session pool mode. Runs as the `postgres` user when we are root (PgBouncer
refuses to run as root); stop() ends it and removes its directory.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from pgserver import SERVER_USER, hand_over, run_as_server_user, free_port

BINARY = os.environ.get("AWA_TEST_PGBOUNCER", "/usr/sbin/pgbouncer")


def unavailable() -> Optional[str]:
    if not Path(BINARY).exists() and shutil.which("pgbouncer") is None:
        return "the PgBouncer tests need pgbouncer (apt-get install pgbouncer)"
    return None


class PgBouncer:
    """`pool_mode` is "transaction" or "session"."""

    def __init__(self, listen: str, server_host: str, server_port: int, pool_mode: str,
                 pool_size: int = 20) -> None:
        if pool_mode not in ("transaction", "session"):
            raise ValueError(f"pool_mode must be transaction or session, got {pool_mode!r}")
        self.listen = listen
        self.pool_mode = pool_mode
        self.root = Path(tempfile.mkdtemp(prefix=f"awa-pgbouncer-{pool_mode}-"))
        os.chmod(self.root, 0o755)
        hand_over(self.root)
        self.port = free_port([listen])
        self.log = self.root / "pgbouncer.log"
        (self.root / "userlist.txt").write_text(f'"{SERVER_USER}" ""\n')
        (self.root / "pgbouncer.ini").write_text("\n".join([
            "[databases]",
            f"* = host={server_host} port={server_port}",
            "[pgbouncer]",
            f"listen_addr = {listen}",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.root / 'userlist.txt'}",
            f"admin_users = {SERVER_USER}",
            f"pool_mode = {pool_mode}",
            f"default_pool_size = {pool_size}",
            "max_client_conn = 500",
            "server_reset_query = DISCARD ALL",
            f"logfile = {self.log}",
            f"pidfile = {self.root / 'pgbouncer.pid'}",
            ""]))
        binary = BINARY if Path(BINARY).exists() else shutil.which("pgbouncer")
        self.process = subprocess.Popen([str(binary), str(self.root / "pgbouncer.ini")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                        start_new_session=True, **run_as_server_user())  # type: ignore[arg-type]
        self._wait_listening(10.0)

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection((self.listen, self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not listen within {timeout:g}s: {self.log_tail()}")
                time.sleep(0.05)

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def url(self, database: str) -> str:
        return f"postgresql://{SERVER_USER}@{self.listen}:{self.port}/{database}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: immediate shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
