#!/usr/bin/env python3
"""Per-test cost of the pytest plugin's database fixtures.

    AWA_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        python scripts/plugin_overhead.py --tests 50

Writes N trivial tests into a temporary folder twice: once taking `awa_conn`
(a fresh clone of the migrated template per test, a connection to it, the
clone dropped afterwards) and once taking no fixture, and runs each set with
pytest in a subprocess (one process, no xdist), alternating, `--repeats`
times. Reports per test, medians over the repeats:
- set-up + teardown as pytest measures them around each test (--durations),
  without the last test's teardown, which is where the session's fixtures
  end: awa_server waits there for the background drops still queued;
- that wait, once per session;
- the whole session's extra wall time over the fixture-less one, divided by
  N: everything, the session's first template check and the drops included.
The template must exist already for a steady-state figure: a warm-up session
runs first (it builds the template if the schema is new to the server).
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WITH_FIXTURES = "def test_{n}(awa_conn):\n    pass\n"
WITHOUT = "def test_{n}():\n    pass\n"
DURATION = re.compile(r"^([0-9.]+)s (setup|teardown|call)\s+\S+::test_(\d+)", re.M)


def session(folder: Path, body: str, tests: int) -> tuple:
    """(wall, summed set-up + teardown but the last teardown, the last
    teardown) of one pytest run, in seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "test_overhead.py").write_text("\n".join(body.format(n=n) for n in range(tests)))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--durations=0", "--durations-min=0", str(folder)],
                          cwd=folder, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"pytest failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    fixtures = last = 0.0
    for seconds, phase, number in DURATION.findall(done.stdout):
        if phase == "teardown" and int(number) == tests - 1:
            last = float(seconds)
        elif phase != "call":
            fixtures += float(seconds)
    return wall, fixtures, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="awa-plugin-overhead-") as tmp:
        root = Path(tmp)
        session(root / "warmup", WITH_FIXTURES, 1)
        per_test, end_wait, extra_wall = [], [], []
        for repeat in range(options.repeats):
            bare_wall, _, _ = session(root / f"bare{repeat}", WITHOUT, options.tests)
            wall, fixtures, last = session(root / f"db{repeat}", WITH_FIXTURES, options.tests)
            per_test.append(fixtures / options.tests)
            end_wait.append(last)
            extra_wall.append((wall - bare_wall) / options.tests)
            print(f"repeat {repeat + 1}: set-up + teardown {1000 * per_test[-1]:.0f} ms/test, "
                  f"drops at the end {last:.1f} s, session wall +{1000 * extra_wall[-1]:.0f} ms/test "
                  f"({wall:.1f} s vs {bare_wall:.1f} s without the fixtures)", flush=True)
        print(f"median over {options.repeats} x {options.tests} tests: set-up + teardown "
              f"{1000 * statistics.median(per_test):.0f} ms per test, waiting for the drops at the "
              f"end {statistics.median(end_wait):.1f} s per session, session wall "
              f"+{1000 * statistics.median(extra_wall):.0f} ms per test")


if __name__ == "__main__":
    main()
