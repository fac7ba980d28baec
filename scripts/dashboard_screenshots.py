"""Screenshots of the dashboard with real data from the example app, for
the README (docs/img/dashboard-*.png).

Creates a database, starts a real pool of the example app
(`awa-pool start --app tilework.tasks`), and for --minutes feeds it what
the quickstart does, in waves: batches of render_tile bands with their
assemble follow-up, send_digest jobs, and now and then a tile with bad
arguments (it fails with a real traceback after its 3 attempts). Then it
serves `awa-pool dashboard` and photographs its pages in headless chromium.

    python scripts/dashboard_screenshots.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(EXAMPLES))

import psycopg2  # noqa: E402

import awa_pool  # noqa: E402
from scriptdb import drop_database, fresh_database  # noqa: E402

TILE = {"width": 60, "height": 24, "max_iter": 1500, "samples": 2}   # ~0.1-0.5 s of CPU per band


def _env(url: str) -> dict:
    env = dict(os.environ, AWA_DATABASE_URL=url)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES), env.get("PYTHONPATH")]))
    return env


def feed(url: str, minutes: float) -> None:
    from tilework.tasks import assemble, render_tile, send_digest

    conn = psycopg2.connect(url)
    deadline = time.monotonic() + minutes * 60
    wave = 0
    try:
        while time.monotonic() < deadline:
            wave += 1
            bands = 4 + wave % 5
            with conn:
                awa_pool.enqueue_batch(conn, [render_tile.job(band=b, bands=bands, **TILE) for b in range(bands)],
                                       then=assemble.job(title=f"render-{wave}"))
                for n in range(3):
                    send_digest.enqueue(conn, to=f"team-{(wave + n) % 4}@example.com")
                if wave % 6 == 0:   # a tile with impossible arguments: ZeroDivisionError, 3 attempts
                    awa_pool.enqueue(conn, render_tile.job(band=1, bands=0, **TILE))
            time.sleep(6)
    finally:
        conn.close()


def photograph(base: str, url: str, out: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT max(id) FROM awa.jobs WHERE state = 'failed'")
        failed = cur.fetchone()[0]
    conn.close()
    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = out / ".chromium-profile"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", "--force-device-scale-factor=1", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        shots = [("overview", "/"), ("jobs", "/jobs"), ("job", f"/jobs/{failed}"), ("kinds", "/kinds"),
                 ("cron", "/cron")]
        for name, path in shots:
            # the page's own size, not the window's: headless chromium's
            # window includes space that is not viewport
            metrics = {"width": 1440, "height": 300, "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
            driver.get(base + path)
            time.sleep(0.5)
            height = driver.execute_script("return document.documentElement.scrollHeight")
            # the jobs list is long: its first rows say enough
            metrics["height"] = min(height, 1000 if name == "jobs" else 2400)
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
            time.sleep(0.3)
            driver.save_screenshot(str(out / f"dashboard-{name}.png"))
            print(f"docs/img/dashboard-{name}.png")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="a server URL (a database is created on it)")
    parser.add_argument("--database", default="awa_dashboard_shots")
    parser.add_argument("--minutes", type=float, default=8.0, help="how long to feed the pool")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the database (and the pool running)")
    parser.add_argument("--reuse", action="store_true",
                        help="feed and photograph a database kept by --keep (give --minutes)")
    args = parser.parse_args()

    out = ROOT / "docs" / "img"
    out.mkdir(parents=True, exist_ok=True)
    from scriptdb import with_database

    url = with_database(args.database_url, args.database) if args.reuse else \
        fresh_database(args.database_url, args.database)
    env = _env(url)
    pool = subprocess.Popen([sys.executable, "-m", "awa_pool", "start", "--app", "tilework.tasks",
                             "-w", str(args.workers), "--log-level", "warning"], env=env, cwd=str(EXAMPLES))
    dashboard = None
    try:
        feed(url, args.minutes)   # with --reuse too: the pool is busy when photographed
        if not args.reuse:
            conn = psycopg2.connect(url)
            with conn:   # a paused queue with work waiting, as an operator would see it
                awa_pool.pause_queue(conn, "default")
                for n in range(5):
                    awa_pool.enqueue(conn, awa_pool.Job("send_digest", {"to": f"late-{n}@example.com"}))
            conn.close()
        time.sleep(3)
        dashboard = subprocess.Popen([sys.executable, "-m", "awa_pool", "dashboard", "--port", "0"],
                                     env=env, stderr=subprocess.PIPE, text=True)
        line = dashboard.stderr.readline()
        base = re.search(r"on (http://\S+?)/? ", line).group(1)
        photograph(base, url, out)
    finally:
        for proc in (dashboard, pool):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        if not args.keep:
            drop_database(args.database_url, args.database)


if __name__ == "__main__":
    main()
