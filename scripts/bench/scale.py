"""How awa_pool's cost grows: seven curves (issue 23), each point the median of
at least three measurements, written as CSV (every measurement) and PNG.

    .venv/bin/python scripts/bench/scale.py                       # every curve, full sizes
    .venv/bin/python scripts/bench/scale.py --size small          # quick validation sizes
    .venv/bin/python scripts/bench/scale.py --curves history --points 0,1000000
    .venv/bin/python scripts/bench/scale.py --curves history --source /tmp/old --tag before

Curves (full sizes; --points overrides one curve's):
  backlog      20k, 200k, 1M, 5M available jobs: drain rate, enqueue rate into
               the deep queue (one per transaction and enqueue_many), pickup
               p50/p99 of a priority-1 job enqueued while the backlog drains
  history      0, 1M, 10M rows of terminal history: every operator read,
               the retention rotation, enqueue and drain rate
  scheduled    1M jobs due at one moment: promotion rate, delay until the
               last one runs
  queues       1, 10, 100, 1,000 queues with work: weighted shares (2:1) and
               drain rate and CPU per job
  payloads     args and results of 100 B, 10 KB, 1 MB: throughput, peak RSS
               of the supervisor and of its children
  supervisors  1, 2, 4, 8 supervisors on one database: total drain rate
  live         0, 20k, 200k, 1M, 5M available jobs (and a tenth as many
               scheduled): the reads that count live jobs (queue_stats,
               queue_depth, `awa-pool queues`, the dashboard's overview, a
               scrape) and the leader's census of them

Needs PostgreSQL (--server, default postgresql://postgres@127.0.0.1:5432/postgres);
creates and drops the database awa_scale (--db). Writes
scripts/bench/results/scale-<curve>-<stamp>.csv and, with matplotlib,
scripts/bench/results/scale-<curve>-<stamp>.png (--png-dir to put them
elsewhere). --source measures another checkout of awa_pool (its SQL and
code; the database is migrated by it).
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # scripts/: scriptdb
sys.path.insert(0, HERE)

FULL = {"backlog": [20_000, 200_000, 1_000_000, 5_000_000], "history": [0, 1_000_000, 10_000_000],
        "scheduled": [1_000_000], "queues": [1, 10, 100, 1000], "payloads": [100, 10_000, 1_000_000],
        "supervisors": [1, 2, 4, 8], "live": [0, 20_000, 200_000, 1_000_000, 5_000_000]}
SMALL = {"backlog": [2_000, 20_000, 100_000], "history": [0, 50_000, 200_000], "scheduled": [50_000],
         "queues": [1, 10, 100], "payloads": [100, 10_000, 100_000], "supervisors": [1, 2],
         "live": [0, 20_000, 200_000]}


class Context:
    """What a curve needs: the server, a fresh database, the awa_pool under
    test, and a recorder of measurements."""

    def __init__(self, args: Any, awa_pool: Any) -> None:
        self.server = args.server
        self.dbname = args.db
        self.source = args.source
        self.reps = args.reps
        self.small = args.size == "small"
        self.awa = awa_pool
        self.rows: List[Dict[str, Any]] = []
        self.curve = ""
        self.dsn = ""
        self.path = ""
        self.info: Dict[str, str] = {}

    def fresh(self) -> str:
        """Drop and re-create the database, migrated; returns its URL."""
        import scriptdb

        self.dsn = scriptdb.fresh_database(self.server, self.dbname)
        return self.dsn

    def connect(self):
        import psycopg2

        return psycopg2.connect(self.dsn, options="-c jit=off")

    def record(self, point: Any, metric: str, value: float, rep: int, unit: str) -> None:
        row = {"curve": self.curve, "point": point, "metric": metric, "rep": rep, "value": value,
               "unit": unit, "loadavg": "/".join(f"{x:.2f}" for x in os.getloadavg()),
               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.rows.append(row)
        if self.path:  # every measurement on disk at once: a later failure loses nothing
            write_csv(self.path, self.rows, self.info)
        print(f"  {self.curve} {point} rep {rep}: {metric} = {value:,.3f} {unit} (load {row['loadavg']})",
              flush=True)

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def machine(server: str, source: str) -> Dict[str, str]:
    import psycopg2

    conn = psycopg2.connect(server)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT version()")
            pg = cur.fetchone()[0].split(" on ")[0]
            cur.execute("SHOW shared_buffers")
            shared = cur.fetchone()[0]
    finally:
        conn.close()
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    root = source or os.path.dirname(os.path.dirname(HERE))
    rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    marker = os.path.join(root, "BENCH_SOURCE")
    if os.path.exists(marker):
        with open(marker) as f:
            rev = f.read().strip()[:7]
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "nproc": str(os.cpu_count()),
            "cpu": cpu, "postgres": f"{pg}, shared_buffers {shared}", "python": platform.python_version(),
            "awa_pool": rev or "?", "source": root}


def write_csv(path: str, rows: List[Dict[str, Any]], info: Dict[str, str]) -> None:
    with open(path, "w", newline="") as f:
        for key, value in info.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=["curve", "point", "metric", "rep", "value", "unit",
                                               "loadavg", "at"])
        writer.writeheader()
        writer.writerows(rows)


def summary(rows: List[Dict[str, Any]]) -> List[str]:
    """One line per (point, metric): median of the repetitions, min, max."""
    groups: Dict[tuple, List[float]] = {}
    for row in rows:
        groups.setdefault((row["point"], row["metric"], row["unit"]), []).append(float(row["value"]))
    return [f"{point} {metric}: median {statistics.median(v):,.3f} {unit} "
            f"(min {min(v):,.3f}, max {max(v):,.3f}, n={len(v)})"
            for (point, metric, unit), v in groups.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--curves", default=",".join(FULL), help="comma-separated; default: all seven")
    parser.add_argument("--size", choices=("full", "small"), default="full")
    parser.add_argument("--points", help="this curve's points, comma-separated (one curve only)")
    parser.add_argument("--reps", type=int, default=3, help="measurements per point (median)")
    parser.add_argument("--server", default=os.environ.get("AWA_SCALE_SERVER",
                                                           "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--db", default="awa_scale")
    parser.add_argument("--source", help="measure this awa_pool checkout instead of the installed one")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--png-dir", help="where the PNGs go (default: --out)")
    parser.add_argument("--tag", default="")
    parser.add_argument("--keep", action="store_true", help="leave the database behind")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.source:
        import scriptdb

        args.source = os.path.abspath(args.source)
        scriptdb.use_checkout(args.source)
    import awa_pool

    import scale_curves
    import scriptdb

    curves = [c.strip() for c in args.curves.split(",") if c.strip()]
    unknown = [c for c in curves if c not in FULL]
    if unknown:
        parser.error(f"unknown curve(s) {', '.join(unknown)}: use {', '.join(FULL)}")
    if args.points and len(curves) != 1:
        parser.error("--points needs exactly one curve")
    sizes = SMALL if args.size == "small" else FULL
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S") + (f"-{args.tag}" if args.tag else "")
    info = machine(args.server, args.source)
    print("; ".join(f"{k}: {v}" for k, v in info.items()), flush=True)
    ctx = Context(args, awa_pool)
    failed: List[str] = []
    try:
        for curve in curves:
            points = [int(p) for p in args.points.split(",")] if args.points else sizes[curve]
            path = os.path.join(args.out, f"scale-{curve}-{stamp}.csv")
            ctx.curve, ctx.rows, ctx.path, ctx.info = curve, [], path, info
            ctx.say(f"curve {curve}: points {points}, {args.reps} measurements each")
            try:
                getattr(scale_curves, curve)(ctx, points)
            except Exception as exc:  # one curve's failure does not cost the others
                ctx.say(f"curve {curve} FAILED: {type(exc).__name__}: {exc}")
                failed.append(curve)
            write_csv(path, ctx.rows, {**info, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                       **({"failed": "yes, see the run's log"} if curve in failed else {})})
            print("\n".join(summary(ctx.rows)) + f"\nwrote {path}", flush=True)
            if not ctx.rows:
                continue   # nothing measured: nothing to draw
            try:
                import scale_plot

                png = scale_plot.plot(path, out_dir=args.png_dir or args.out)
                print(f"wrote {png}", flush=True)
            except ImportError as exc:
                print(f"no plot ({exc}): install matplotlib", flush=True)
    finally:
        if not args.keep:
            scriptdb.drop_database(args.server, args.db)
    if failed:
        sys.exit(f"failed curves: {', '.join(failed)}")


if __name__ == "__main__":
    main()
