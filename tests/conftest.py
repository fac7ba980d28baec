"""Test harness: real Postgres only.

The databases come from awa_pool's own pytest plugin (awa_pool/pytest_plugin.py,
loaded through its pytest11 entry point): the server is AWA_TEST_DATABASE_URL
or DATABASE_URL when set, else an embedded Postgres shared by the xdist
workers; each test gets a fresh clone of a migrated template, dropped
afterwards. The fixtures below give the plugin's fixtures the names this
suite has always used.
"""
from __future__ import annotations

import os

# Every supervisor of the suite (in this process or a subprocess) refuses a
# write to its scheduling state from any thread but its loop's (SPEC §7,
# awa_pool/worker/ownership.py); set before the worker modules are imported.
os.environ["AWA_POOL_CHECK_OWNER"] = "1"
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Optional

import psycopg2.extensions
import pytest

from awa_pool.testkit.testdb import TestServer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import connection  # noqa: E402


@pytest.fixture(scope="session")
def server_url(awa_server: TestServer) -> str:
    """The test server's URL (for tests that create databases of their own)."""
    return awa_server.url


@pytest.fixture(scope="session")
def worker_id_tag(awa_server: TestServer) -> str:
    """Unique to this xdist worker and process, for names of databases."""
    return awa_server.tag


@pytest.fixture
def dsn(awa_database: str) -> str:
    """URL of a fresh, migrated database for this test alone."""
    return awa_database


@pytest.fixture
def empty_dsn(awa_server: TestServer) -> Iterator[str]:
    """URL of a fresh database with no awa schema."""
    with awa_server.database(migrated=False) as url:
        yield url


@pytest.fixture
def other_empty_dsn(awa_server: TestServer) -> Iterator[str]:
    """A second fresh database with no awa schema (for tests that compare two)."""
    with awa_server.database(migrated=False) as url:
        yield url


@pytest.fixture
def conn(awa_conn: psycopg2.extensions.connection) -> psycopg2.extensions.connection:
    """A connection to the test database (not autocommit)."""
    return awa_conn


@pytest.fixture
def auto(dsn: str) -> Iterator[psycopg2.extensions.connection]:
    """An autocommit connection to the test database, like the supervisor's
    own sessions (maintenance, completion)."""
    with connection(dsn, autocommit=True) as opened:
        yield opened


class Processes:
    """Subprocesses started by a test; all killed (with their groups) at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: List[subprocess.Popen] = []

    def start(self, argv: List[str], *, env: Optional[dict] = None, name: str = "proc",
              **kwargs) -> subprocess.Popen:
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "tests"), str(ROOT)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else []))
        full_env.update(env or {})
        log_path = self.tmp / f"{name}-{len(self.started)}.log"
        log_file = open(log_path, "wb")
        proc = subprocess.Popen(argv, env=full_env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True, **kwargs)
        proc.log_path = log_path  # type: ignore[attr-defined]
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


class Pools:
    """Supervisors started as `python -m awa_pool start` subprocesses."""

    def __init__(self, processes: Processes, dsn: str, log_dir: Path) -> None:
        self.processes = processes
        self.dsn = dsn
        self.log_dir = log_dir

    def start(self, *args: str, app: str = "apps.basic", workers: int = 2,
              env: Optional[dict] = None, name: str = "supervisor") -> subprocess.Popen:
        argv = [sys.executable, "-m", "awa_pool", "start", "--app", app, "-w", str(workers),
                "--database-url", self.dsn, "--log-level", "debug", *args]
        full_env = {"AWA_TEST_LOG_DIR": str(self.log_dir)}
        full_env.update(env or {})
        return self.processes.start(argv, env=full_env, name=name)


@pytest.fixture
def pools(processes: Processes, dsn: str, tmp_path: Path) -> Pools:
    log_dir = tmp_path / "exec"
    log_dir.mkdir()
    return Pools(processes, dsn, log_dir)


@pytest.fixture
def private_server(tmp_path: Path):
    """A PostgreSQL server of the test's own, with a migrated database
    "outage", that the test may stop and start (outage tests); skipped
    where no server binaries are found."""
    import awa_pool
    from pgserver import PrivateServer, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    server = PrivateServer.create(["127.0.0.1"])
    try:
        server.execute("CREATE DATABASE outage")
        with connection(server.url("outage")) as conn:
            awa_pool.migrate(conn)
            conn.commit()
        yield server
    finally:
        server.remove()


@pytest.fixture
def loopless_supervisor(dsn: str):
    """A supervisor started but not running (its session, LISTEN and
    completer; children are spawned by the test) serving apps.gates: its
    step() reads pipes and notifications, reaps children and enforces
    deadlines, but claims and hands out nothing, so the test decides when
    jobs go out."""
    from awa_pool.core.config import PoolConfig
    from awa_pool.supervisor import Supervisor
    from awa_pool.core.tasks import import_app

    from awa_pool.worker.registration import served_queues

    import_app("apps.gates")
    sup = Supervisor(PoolConfig(dsn=dsn, workers=1, app="apps.gates", leader=False))
    sup.queues = served_queues(sup.config.queues)
    sup._start_session()
    sup._watch_notifier()
    sup.completer.start()
    try:
        yield sup
    finally:
        sup.completer.stop()
        sup.children.kill_all()
        for child in sup.children.all():
            child.process.join(timeout=5)
        sup.session.close()
        sup.events.close()
