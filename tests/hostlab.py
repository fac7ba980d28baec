"""The multi-host test bench, shared by tests/multihost and scripts/hosts.py.

`open_bench()` makes a Lab (a bridge and network namespaces, tests/netns.py)
and a private PostgreSQL listening on the bridge (tests/pgserver.py); a
`Cluster` is one fresh database on such a server, the hosts attached to it
and the `awa-pool start` supervisors running inside them. Everything a
Cluster starts is stopped by close(), and everything open_bench() makes is
removed when it exits, failures included.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, TypeVar

import psycopg2

import netns
import pgserver
from helpers import enqueue_jobs, query, scalar, wait_for

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
T = TypeVar("T")
_databases = itertools.count()


def unavailable() -> Optional[str]:
    """Why the bench cannot run on this machine (one line), or None."""
    return netns.unavailable() or pgserver.unavailable()


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """helpers.wait_for, positionally: poll until truthy, fail naming `what`."""
    return wait_for(predicate, timeout=timeout, interval=interval, message=what)


@dataclass
class Bench:
    lab: netns.Lab
    server: pgserver.PrivateServer

    @property
    def server_address(self) -> str:
        return self.lab.gateway


@contextmanager
def open_bench() -> Iterator[Bench]:
    """A lab and a private server on its bridge; both removed on exit."""
    lab = netns.Lab()
    server = None
    try:
        server = pgserver.PrivateServer.create(["127.0.0.1", lab.gateway], trust=[str(lab.network)])
        yield Bench(lab, server)
    finally:
        if server is not None:
            server.remove()
        lab.close()


@dataclass
class Supervisor:
    """An `awa-pool start` process inside a host."""

    host: netns.Host
    process: subprocess.Popen
    log_path: Path
    url: str
    id: Optional[int] = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self, tail: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Cluster:
    """A fresh migrated database on `server` and the supervisors that serve it."""

    bench: Bench
    work_dir: Path
    server: Optional[pgserver.PrivateServer] = None   # the bench's server unless given
    url: Optional[str] = None   # one URL for everyone (a multi-host URL), else the server's
    name: str = ""
    supervisors: List[Supervisor] = field(default_factory=list)

    def __post_init__(self) -> None:
        from awa_pool.api.migrate import migrate

        self.server = self.server or self.bench.server
        self.work_dir = _fresh_dir(self.work_dir)
        self.name = self.name or f"awa_hosts_{os.getpid()}_{next(_databases)}"
        self.server.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self.server.execute(f'CREATE DATABASE "{self.name}"')
        conn = psycopg2.connect(self.local_url)
        try:
            migrate(conn)
        finally:
            conn.close()
        self.log_dir = self.work_dir / "exec"
        self.log_dir.mkdir()

    # -- addresses --------------------------------------------------------------------
    @property
    def local_url(self) -> str:
        """For the test itself (the root namespace, over loopback)."""
        assert self.server is not None
        return self.url or self.server.url(self.name)

    @property
    def host_url(self) -> str:
        """For processes inside the hosts (over the bridge)."""
        assert self.server is not None
        return self.url or self.server.url(self.name, host=self.server.listen[-1])

    # -- supervisors ------------------------------------------------------------------
    def start(self, host: netns.Host, *args: str, app: str = "apps.hosts", queues: Sequence[str] = ("hosts",),
              workers: int = 2, url: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> Supervisor:
        """Start `awa-pool start` inside `host`, serving only `queues` (the test
        apps import apps.basic, whose tasks name other queues)."""
        url = url or self.host_url
        queue_args = [arg for queue in queues for arg in ("--queue", queue)]
        argv = host.argv([sys.executable, "-m", "awa_pool", "start", "--app", app, "-w", str(workers),
                          "--database-url", url, *queue_args, *args])
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT)])
        full_env["AWA_TEST_LOG_DIR"] = str(self.log_dir)
        full_env.update(env or {})
        log_path = self.work_dir / f"supervisor-{host.name}-{len(self.supervisors)}.log"
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(argv, env=full_env, stdout=log_file, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        supervisor = Supervisor(host, process, log_path, url)
        self.supervisors.append(supervisor)
        return supervisor

    def wait_ready(self, supervisors: Sequence[Supervisor], timeout: float = 40.0) -> None:
        """Until each supervisor is registered and reports all children idle."""
        def ready() -> bool:
            for supervisor in supervisors:
                if not supervisor.alive():
                    raise AssertionError(f"supervisor on {supervisor.host.name} exited:\n{supervisor.log()}")
                row = self.query("SELECT id, (stats->>'idle')::int = workers FROM awa.supervisors"
                                 " WHERE pid = %s AND stopped_at IS NULL ORDER BY id DESC LIMIT 1",
                                 (supervisor.pid,))
                if not row or not row[0][1]:
                    return False
                supervisor.id = row[0][0]
            return True

        wait_until(ready, timeout, f"{len(supervisors)} supervisor(s) registered with idle children")

    def leader(self) -> Optional[Supervisor]:
        rows = self.query("SELECT pid FROM awa.supervisors WHERE is_leader AND stopped_at IS NULL")
        pids = {row[0] for row in rows}
        return next((s for s in self.supervisors if s.pid in pids and s.alive()), None)

    def stop(self, supervisor: Supervisor, timeout: float = 40.0) -> int:
        """SIGTERM, then wait for the exit code."""
        if supervisor.alive():
            supervisor.process.send_signal(signal.SIGTERM)
        try:
            return supervisor.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"supervisor on {supervisor.host.name} did not exit within {timeout:g}s "
                                 f"of SIGTERM:\n{supervisor.log()}") from None

    def kill_all(self) -> None:
        for supervisor in self.supervisors:
            if supervisor.alive():
                try:
                    os.killpg(supervisor.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for supervisor in self.supervisors:
            try:
                supervisor.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        self.kill_all()
        try:
            if self.server is not None and self.server.running:
                self.server.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except psycopg2.Error:
            pass  # the server itself may be down (a failover test); it goes with the bench

    # -- the database -----------------------------------------------------------------
    def query(self, sql: str, params: Any = None) -> list:
        return query(self.local_url, sql, params)

    def scalar(self, sql: str, params: Any = None) -> Any:
        return scalar(self.local_url, sql, params)

    def enqueue(self, jobs: Sequence[Any]) -> List[int]:
        """Enqueue in one committed transaction; the ids in order."""
        return enqueue_jobs(self.local_url, jobs)

    def states(self, ids: Sequence[int]) -> Dict[str, int]:
        return dict(self.query("SELECT state::text, count(*) FROM awa.jobs WHERE id = ANY(%s) GROUP BY 1",
                               (list(ids),)))

    def wait_terminal(self, ids: Sequence[int], timeout: float) -> Dict[str, int]:
        def done() -> Optional[Dict[str, int]]:
            counts = self.states(ids)
            finished = sum(counts.get(state, 0) for state in ("completed", "failed", "cancelled"))
            return counts if finished == len(ids) else None

        return wait_until(done, timeout, f"{len(ids)} jobs to finish", interval=0.1)

    # -- what the handlers recorded (tests/apps/hosts.py) -----------------------------
    def executions(self, kind: str) -> List[Dict[str, Any]]:
        """[{job, pid, time, attempt, lease, supervisor_pid}] for one kind, by time."""
        found = []
        for path in self.log_dir.glob("exec-*.log"):
            for line in path.read_text().splitlines():
                parts = line.split(" ", 4)
                if parts[0] != kind:
                    continue
                attempt, lease, supervisor_pid = parts[4].split(":")
                found.append({"job": int(parts[1]), "pid": int(parts[2]), "time": float(parts[3]),
                              "attempt": int(attempt), "lease": int(lease),
                              "supervisor_pid": int(supervisor_pid)})
        return sorted(found, key=lambda record: record["time"])


def _fresh_dir(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`, ... if it is taken: each cluster's
    execution logs must be its own (job ids and leases restart with every
    database)."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    candidate.mkdir(parents=True)
    return candidate


@contextmanager
def cluster(bench: Bench, work_dir: Path, **options: Any) -> Iterator[Cluster]:
    made = Cluster(bench, work_dir, **options)
    try:
        yield made
    finally:
        made.close()
        bench.lab.remove_hosts()
