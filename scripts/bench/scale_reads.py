"""The operator reads scale.py times against a big history: the Python API
(queue_stats, list_jobs, get_job, kind_stats), the CLI commands operators
type (run in-process, so Python's start-up is not counted, but connecting,
the schema check, the query and the formatting are), the dashboard's pages
(through its WSGI app, rendering included) and a Prometheus scrape of a
live supervisor.
"""
from __future__ import annotations

import contextlib
import io
import time
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg2


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return 1000.0 * (time.perf_counter() - t)


def cli(argv: List[str]) -> Callable[[], None]:
    """A call of `awa-pool ARGV` in this process; fails unless it exits 0."""
    from awa_pool.ops.cli import main

    def run() -> None:
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code or 0
        if code:
            raise RuntimeError(f"awa-pool {' '.join(argv)} exited {code}: {err.getvalue().strip()}")
    return run


def scrape(port: int) -> Callable[[], None]:
    def fetch() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            return resp.read().decode()

    def run() -> None:
        try:
            body = fetch()
        except ConnectionResetError:
            # seen once under load (cause not found yet): say so and try again
            print(f"  the scrape of port {port} was reset; scraping again", flush=True)
            body = fetch()
        if "awa_queue_stats_up 1.0" not in body:
            raise RuntimeError("the scrape's queue gauges failed (awa_queue_stats_up is not 1)")
    return run


def api_reads(dsn: str, sample_id: int, deep_age_s: float) -> List[Tuple[str, Callable[[], None]]]:
    """(name, call) for each API read, on one connection, each in its own
    transaction (rolled back: reads only)."""
    import awa_pool
    from awa_pool.ops.stats import kind_stats

    conn = psycopg2.connect(dsn)

    def in_tx(fn: Callable[[Any], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(conn)
            finally:
                conn.rollback()
        return run

    return [
        ("queue_stats", in_tx(awa_pool.queue_stats)),
        ("list_jobs first page", in_tx(lambda c: awa_pool.list_jobs(c, limit=100))),
        ("list_jobs deep page", in_tx(lambda c: awa_pool.list_jobs(c, limit=100, older_than=deep_age_s))),
        ("list_jobs state=failed", in_tx(lambda c: awa_pool.list_jobs(c, state="failed", limit=100))),
        ("get_job", in_tx(lambda c: awa_pool.get_job(c, sample_id))),
        ("kind_stats", in_tx(lambda c: kind_stats(c))),
        ("kind_stats since 1h", in_tx(lambda c: kind_stats(c, since_s=3600.0))),
    ], conn


def cli_reads(dsn: str) -> List[Tuple[str, Callable[[], None]]]:
    base = ["--database-url", dsn]
    return [
        # typer builds the command tree on every invocation: the floor under every CLI figure
        ("awa-pool --version (no database)", cli(["--version"])),
        ("awa-pool queues", cli(["queues"] + base)),
        ("awa-pool kinds", cli(["kinds"] + base)),
        ("awa-pool kinds --since 1h", cli(["kinds", "--since", "1h"] + base)),
        ("awa-pool jobs list", cli(["jobs", "list"] + base)),
    ]


def dashboard_reads(dsn: str, sample_id: Optional[int], middle_id: int,
                    kind: str) -> List[Tuple[str, Callable[[], None]]]:
    """(name, call) for the dashboard's pages, each a GET through the app's
    test client that must answer 200. The kinds pages keep the slices of
    time that have closed, so their repeated calls read only the newest
    slice; time_reads' untimed first call pays for the rest (a fresh
    dashboard's first view, which dashboard_speed.py reports separately).
    With no sample job (an empty history) the job page is left out."""
    from awa_pool.dashboard import create_app

    client = create_app(dsn).test_client()

    def page(path: str) -> Callable[[], None]:
        def run() -> None:
            status = client.get(path).status_code
            if status != 200:
                raise RuntimeError(f"dashboard {path}: HTTP {status}")
        return run

    return [(f"dashboard {label}", page(path)) for label, path in [
        ("overview", "/"),
        ("overview fragment", "/fragment/overview"),
        ("jobs, first page", "/jobs"),
        ("jobs, deep page", f"/jobs?before={middle_id}"),
        ("jobs, state=failed", "/jobs?state=failed"),
        (f"jobs, kind={kind}", f"/jobs?kind={kind}"),
        *([("job detail", f"/jobs/{sample_id}")] if sample_id is not None else []),
        ("kinds, last hour", "/kinds"),
        ("kinds, last 24 h", "/kinds?window=24h"),
        ("dead letters", "/dlq"),
    ]]


def time_reads(reads: List[Tuple[str, Callable[[], None]]], reps: int, pause_s: float = 0.0,
               timeout_ms: float = 600_000) -> Dict[str, List[float]]:
    """Each read `reps` times (after one untimed warm-up call, so caches are
    as an operator who looks twice finds them); milliseconds per call."""
    out: Dict[str, List[float]] = {}
    for name, fn in reads:
        first = _timed(fn)
        times = []
        if first < timeout_ms:
            for _ in range(reps):
                if pause_s:
                    time.sleep(pause_s)
                times.append(_timed(fn))
        out[name] = times or [first]
    return out
