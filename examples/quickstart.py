"""awa_pool end to end in one command: python examples/quickstart.py

1. finds Postgres ($AWA_DATABASE_URL or $DATABASE_URL, else starts the
   embedded server) and applies the schema migrations;
2. enqueues, in one transaction, a batch of CPU-heavy `render_tile` jobs
   with an `assemble` follow-up, plus a `send_digest` job;
3. starts a worker pool (`awa-pool start --app tilework.tasks`) as a
   subprocess, waits for the jobs with awa_pool.wait, prints the results,
   then stops the pool with SIGTERM (it drains and exits 0).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # makes the example app `tilework` importable

import psycopg2  # noqa: E402

import awa_pool  # noqa: E402
from tilework import database_url  # noqa: E402
from tilework.tasks import assemble, render_tile, send_digest  # noqa: E402

BANDS = 8
TIMEOUT_S = 300


def start_pool(url: str) -> subprocess.Popen:
    """The same command you would run on a server, with the app importable."""
    env = dict(os.environ, AWA_DATABASE_URL=url)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    workers = str(min(8, os.cpu_count() or 2))
    return subprocess.Popen([sys.executable, "-m", "awa_pool", "start", "--app", "tilework.tasks",
                             "-w", workers, "--log-level", "warning"], env=env)


def wait_for(conn, pool: subprocess.Popen, ids: list) -> list:
    """awa_pool.wait, but say so when an attempt fails and give up at once
    if the pool died."""
    deadline = time.monotonic() + TIMEOUT_S
    reported = set()
    while True:
        try:
            return awa_pool.wait(conn, ids, timeout=2)
        except TimeoutError:
            for job_id in ids:
                record = awa_pool.get_job(conn, job_id)
                for error in record.errors:
                    if (job_id, error["attempt"]) not in reported:
                        reported.add((job_id, error["attempt"]))
                        print(f"  job {job_id} ({record.kind}) attempt {error['attempt']} failed: "
                              f"{error.get('error')}")
            conn.rollback()  # wait() needs a connection outside a transaction
            if pool.poll() is not None:
                sys.exit(f"the pool exited with code {pool.returncode} before the jobs finished")
            if time.monotonic() > deadline:
                sys.exit(f"the jobs did not finish within {TIMEOUT_S}s")


def main() -> int:
    url = database_url(announce=True)
    conn = psycopg2.connect(url)
    applied = awa_pool.migrate(conn)
    print(f"schema ready ({len(applied)} migration(s) applied)")

    with conn:  # one transaction: all these jobs exist, or none does
        batch = awa_pool.enqueue_batch(
            conn, [render_tile.job(band=band, bands=BANDS) for band in range(BANDS)],
            then=assemble.job(title="quickstart"))
        digest_id = send_digest.enqueue(conn, to="you@example.com")
    print(f"enqueued {len(batch.ids)} render_tile jobs (ids {batch.ids[0]}..{batch.ids[-1]}), "
          f"their assemble follow-up ({batch.then_id}) and a send_digest job ({digest_id})")

    started = time.monotonic()
    pool = start_pool(url)
    try:
        records = wait_for(conn, pool, [*batch.ids, batch.then_id, digest_id])
    finally:
        pool.send_signal(signal.SIGTERM)  # drain: running jobs finish, then exit 0
        pool.wait(timeout=60)
    elapsed = time.monotonic() - started

    tiles, picture, digest = records[:BANDS], records[BANDS], records[BANDS + 1]
    for tile in tiles:
        print(f"  tile {tile.result['band']}: {tile.state.value} in child {tile.result['pid']}, "
              f"{tile.result['cpu_s']:.2f}s CPU")
    print(f"assemble: {picture.state.value}, {picture.result['tiles']} tiles from "
          f"{len(picture.result['children'])} child process(es), {picture.result['cpu_s']:.1f}s CPU "
          f"in {elapsed:.1f}s wall")
    print("\n".join(picture.result["rows"]))
    print(f"send_digest: {digest.state.value}, sent to {digest.result['sent_to']}")
    print(f"pool stopped (exit code {pool.returncode})")
    print("next: awa-pool jobs list, awa-pool kinds, awa-pool queues, awa-pool top")
    conn.close()
    ok = all(record.state == "completed" for record in records) and pool.returncode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
