"""How long the read commands of `awa-pool` take on a database that has just
drained a burst, against the CLI's own start-up (`awa-pool --version`).

    python scripts/cli_reads.py --server-url postgresql://postgres@127.0.0.1:5432/postgres \
        --jobs 300000 --repeats 7

Builds a fresh database, enqueues --jobs no-op jobs of two kinds, drains
them with one supervisor (-w 2), stops it, and runs each read command
--repeats times right away (before autovacuum's ANALYZE has looked at the
new history), printing the median wall time of each and its excess over
`--version`. Issue 41's bar: every read command within 300 ms of it.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scriptdb import fresh_database  # noqa: E402

READS = [["--version"], ["kinds", "--json"], ["kinds"], ["queues", "--json"], ["queues"],
         ["jobs", "list", "--json"], ["jobs", "list", "--state", "failed"], ["dlq", "list", "--json"],
         ["cron", "list", "--json"], ["top", "--once", "--json"], ["health"]]

APP = '''import awa_pool

@awa_pool.task("noop")
def noop(**_):
    return None

@awa_pool.task("other")
def other(**_):
    return {"ok": True}
'''


def _count(url: str, sql: str) -> int:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchone()[0]
    finally:
        conn.close()


def drain(url: str, jobs: int, workdir: Path) -> float:
    import awa_pool

    conn = psycopg2.connect(url)
    try:
        for start in range(0, jobs, 5000):
            awa_pool.enqueue_many(conn, [awa_pool.Job("noop" if i % 3 else "other", {"i": i})
                                         for i in range(start, min(jobs, start + 5000))])
        conn.commit()
    finally:
        conn.close()
    (workdir / "cli_reads_app.py").write_text(APP)
    env = dict(os.environ, PYTHONPATH=str(workdir))
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "awa_pool", "start", "--app", "cli_reads_app", "-w", "2",
                             "--database-url", url, "--log-level", "warning"], env=env, cwd=str(workdir))
    try:
        while _count(url, "SELECT count(*) FROM awa.jobs_hot") or _count(url, "SELECT count(*) FROM awa.jobs_done") < jobs:
            if time.monotonic() - started > 900:
                raise SystemExit("the drain took over 15 minutes")
            time.sleep(0.5)
        return time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def median_ms(args: list, url: str, repeats: int) -> float:
    script = os.path.join(os.path.dirname(sys.executable), "awa-pool")  # this environment's console script
    prefix = [script] if os.path.exists(script) else [sys.executable, "-m", "awa_pool"]
    env = dict(os.environ, DATABASE_URL=url)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(prefix + args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="awa_cli_reads")
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    url = fresh_database(options.server_url, options.database)
    with tempfile.TemporaryDirectory() as workdir:
        took = drain(url, options.jobs, Path(workdir))
    print(f"drained {options.jobs:,} jobs in {took:.1f} s; medians of {options.repeats} runs:")
    base = None
    for args in READS:
        ms = median_ms(args, url, options.repeats)
        base = ms if base is None else base
        extra = "" if args == ["--version"] else f"  (+{ms - base:.0f} ms)"
        print(f"  awa-pool {' '.join(args):32} {ms:6.0f} ms{extra}")


if __name__ == "__main__":
    main()
