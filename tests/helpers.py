"""Test helpers: database URLs, bounded polling, small queries."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional, TypeVar

import psycopg2
import psycopg2.extensions

from awa_pool.testkit.testdb import with_database  # noqa: F401  (re-exported for the tests)

T = TypeVar("T")


@contextmanager
def connection(dsn: str, *, autocommit: bool = False) -> Iterator[psycopg2.extensions.connection]:
    """A short-lived connection, closed on the way out."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = autocommit
    try:
        yield conn
    finally:
        conn.close()


def wait_for(predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.02,
             message: str = "condition") -> T:
    """Poll predicate until it returns a truthy value; fail clearly after timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {message} (last value: {last!r})")
        time.sleep(interval)


def query(dsn: str, sql: str, params: Any = None) -> list:
    conn = psycopg2.connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def scalar(dsn: str, sql: str, params: Any = None) -> Any:
    rows = query(dsn, sql, params)
    return rows[0][0] if rows else None


def states(dsn: str) -> Dict[str, int]:
    return dict(query(dsn, "SELECT state::text, count(*) FROM awa.jobs GROUP BY 1"))


def job_row(dsn: str, job_id: int) -> Optional[dict]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT * FROM awa.jobs WHERE id = %s", (job_id,))
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d.name for d in cur.description], row))
    finally:
        conn.close()


def count_lines(log_dir, kind: str) -> int:
    """Executions of `kind` recorded by tests/apps handlers."""
    import os

    total = 0
    for name in os.listdir(log_dir):
        if name.startswith("exec-"):
            with open(os.path.join(log_dir, name)) as f:
                total += sum(1 for line in f if line.split(" ", 1)[0] == kind)
    return total


def exec_records(log_dir) -> list:
    """[(kind, job_id, pid, time, extra)] recorded by tests/apps handlers."""
    import os

    records = []
    for name in os.listdir(log_dir):
        if name.startswith("exec-"):
            with open(os.path.join(log_dir, name)) as f:
                for line in f:
                    parts = line.rstrip("\n").split(" ", 4)
                    records.append((parts[0], int(parts[1]), int(parts[2]), float(parts[3]),
                                    parts[4] if len(parts) > 4 else ""))
    return sorted(records, key=lambda r: r[3])


def enqueue_jobs(dsn: str, jobs) -> list:
    """Enqueue jobs in one committed transaction; their ids in order."""
    import awa_pool

    conn = psycopg2.connect(dsn)
    try:
        ids = awa_pool.enqueue_many(conn, list(jobs))
        conn.commit()
        return ids
    finally:
        conn.close()


def record(dsn: str, job_id: int):
    """awa_pool.get_job on a fresh connection."""
    import awa_pool

    conn = psycopg2.connect(dsn)
    try:
        return awa_pool.get_job(conn, job_id)
    finally:
        conn.close()


@contextmanager
def pool_connection(pools: Any, dsn: str, app: str, workers: int = 2) -> Iterator[Any]:
    """A supervisor running `app`, and a connection to enqueue with; the
    supervisor must still be alive at the end."""
    supervisor = pools.start(app=app, workers=workers)
    conn = psycopg2.connect(dsn)
    try:
        yield conn
    finally:
        conn.close()
        assert supervisor.poll() is None, supervisor.log_path.read_text()[-2000:]


def start_idle_supervisors(pools: Any, count: int, *args: str, app: str = "apps.basic",
                           workers: int = 2) -> list:
    """Start `count` supervisors and wait until every one is registered and
    reports idle children: jobs enqueued now are shared among them instead
    of drained by the first to start."""
    procs = [pools.start(*args, app=app, workers=workers, name=f"supervisor{n}") for n in range(count)]
    wait_for(lambda: scalar(pools.dsn, "SELECT count(*) FROM awa.supervisors WHERE stopped_at IS NULL"
                                       " AND (stats->>'idle')::int = %s", (workers,)) == count,
             timeout=30, message=f"{count} supervisors with idle children")
    return procs


def let_polls_go_by(dsn: str, heartbeats: int = 2, timeout: float = 30.0) -> None:
    """Wait until every live supervisor has heartbeated `heartbeats` more
    times (every 2 s; it polls for work every second): for tests that show
    something does NOT happen while supervisors poll, an event to wait for
    instead of a fixed sleep."""
    def beats() -> dict:
        return dict(query(dsn, "SELECT id, heartbeat_at FROM awa.supervisors WHERE stopped_at IS NULL"))

    seen = {sup: [at] for sup, at in beats().items()}
    assert seen, "no live supervisor to wait for"

    def enough() -> bool:
        for sup, at in beats().items():
            if sup in seen and at != seen[sup][-1]:
                seen[sup].append(at)
        return all(len(ats) > heartbeats for ats in seen.values())

    wait_for(enough, timeout=timeout, interval=0.1, message=f"{heartbeats} heartbeats of every supervisor")
