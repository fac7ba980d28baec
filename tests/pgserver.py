"""Private PostgreSQL servers for the multi-host tests, from the installed
PostgreSQL binaries (Debian's /usr/lib/postgresql/N/bin).

A `PrivateServer` lives in a temporary directory, listens on the addresses
it is given (loopback plus a test bridge) at a free port, trusts the test
subnet, preloads pg_stat_statements and can be stopped fast or immediately
(a crash). `standby()` clones it with pg_basebackup into a streaming
standby that `promote()` turns into a primary. The machine's shared server
is never touched. When we are root the server runs as the `postgres` user
(PostgreSQL refuses to run as root).
"""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from helpers import query

SERVER_USER = "postgres"


def bindir() -> Optional[Path]:
    """AWA_TEST_PG_BINDIR, else the newest /usr/lib/postgresql/N/bin with initdb."""
    explicit = os.environ.get("AWA_TEST_PG_BINDIR")
    if explicit:
        return Path(explicit) if (Path(explicit) / "initdb").exists() else None
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else None


def unavailable() -> Optional[str]:
    """Why a private server cannot be made here, or None."""
    if bindir() is None:
        return "private PostgreSQL servers need the server binaries (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root, a private PostgreSQL needs a {SERVER_USER!r} user to run as"
    return None


def free_port(addresses: Sequence[str]) -> int:
    """A TCP port free on every one of `addresses` (bound and released)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((addresses[0], 0))
            port = probe.getsockname()[1]
        try:
            for address in addresses[1:]:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
                    other.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no TCP port free on all of {', '.join(addresses)}")


def run_as_server_user() -> Dict[str, object]:
    return {"user": SERVER_USER} if os.geteuid() == 0 else {}


def hand_over(path: Path) -> None:
    """Let the server user own a directory we made."""
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SERVER_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)


class PrivateServer:
    """One PostgreSQL server in its own directory."""

    def __init__(self, root: Path, data: Path, listen: Sequence[str], port: int) -> None:
        self.root = root
        self.data = data
        self.listen = list(listen)
        self.port = port
        self.bin = bindir()
        self.log = data / "server.log"

    # -- making one ------------------------------------------------------------------
    @classmethod
    def create(cls, listen: Sequence[str], *, trust: Sequence[str] = (), settings: Sequence[str] = (),
               name: str = "primary") -> "PrivateServer":
        """initdb, configure and start a new server listening on `listen`
        (loopback first), trusting connections from the `trust` networks."""
        root = Path(tempfile.mkdtemp(prefix=f"awa-hosts-{name}-"))
        os.chmod(root, 0o755)  # the server user must reach its directory
        data = root / "data"
        data.mkdir()
        hand_over(data)
        server = cls(root, data, listen, free_port(listen))
        try:
            server._bin("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync",
                        "-E", "UTF8", "--locale=C")
            with open(data / "pg_hba.conf", "a") as hba:
                for network in trust:
                    hba.write(f"host all all {network} trust\nhost replication all {network} trust\n")
            server._configure(["max_connections = 250", "shared_preload_libraries = 'pg_stat_statements'",
                               "pg_stat_statements.track = top", *settings])
            server.start()
            server.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        except BaseException:
            server.remove()
            raise
        return server

    def standby(self, listen: Sequence[str], *, name: str = "standby") -> "PrivateServer":
        """A streaming standby of this server, made by pg_basebackup, started."""
        root = Path(tempfile.mkdtemp(prefix=f"awa-hosts-{name}-"))
        os.chmod(root, 0o755)
        data = root / "data"
        standby = PrivateServer(root, data, listen, free_port(listen))
        try:
            hand_over(root)
            conninfo = f"host={self.listen[-1]} port={self.port} user=postgres application_name={name}"
            standby._bin("pg_basebackup", "-d", conninfo, "-D", str(data), "-R", "-X", "stream", "-c", "fast")
            standby._configure([])  # its own address and port, after the primary's copied settings
            standby.start()
        except BaseException:
            standby.remove()
            raise
        return standby

    def _configure(self, settings: List[str]) -> None:
        lines = [f"listen_addresses = '{','.join(self.listen)}'", f"port = {self.port}",
                 f"unix_socket_directories = '{self.data}'", *settings]
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n# awa_pool multi-host tests\n" + "\n".join(lines) + "\n")

    def _bin(self, program: str, *args: str, timeout: float = 120) -> str:
        assert self.bin is not None
        done = subprocess.run([str(self.bin / program), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=self.root, **run_as_server_user())  # type: ignore[arg-type]
        if done.returncode != 0:
            tail = self.log.read_text()[-1500:] if self.log.exists() else ""
            raise RuntimeError(f"{program} failed: {done.stderr.strip() or done.stdout.strip()}\n{tail}")
        return done.stdout

    # -- running it --------------------------------------------------------------------
    def start(self) -> None:
        self._bin("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """fast: a clean shutdown; immediate: a crash (recovery at the next start)."""
        self._bin("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def promote(self) -> None:
        self._bin("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def url(self, database: str = "postgres", host: Optional[str] = None, port: Optional[int] = None) -> str:
        """A URL of this server (or of a relay in front of it: host and port)."""
        return f"postgresql://postgres@{host or self.listen[0]}:{port or self.port}/{database}"

    def execute(self, sql: str, params: object = None, database: str = "postgres") -> list:
        """Rows of one autocommit statement on `database` (over loopback)."""
        return query(self.url(database), sql, params)

    def remove(self) -> None:
        """Stop the server (immediately: its data goes) and delete its directory."""
        if self.running:
            try:
                self.stop("immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.root, ignore_errors=True)
