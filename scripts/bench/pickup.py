"""Pickup latency of priority-1 jobs while a backlog drains, for one or more
awa_pool checkouts measured in turns on one database (an A/B of two commits
on the same machine and the same backlog).

    python scripts/bench/pickup.py --sources /path/to/old,/path/to/new
    python scripts/bench/pickup.py --sources /tmp/old,. --kind sleep --depth 20000 \\
        --supervisors 1 --workers 2 --rounds 3

Builds a backlog of `--depth` priority-2 jobs of `--kind` (noop: returns at
once; sleep: 20 ms) in one queue served with priority aging off, then, for
each round and each source in turn: starts the supervisors, waits for the
first completion, enqueues 100 priority-1 probe jobs at 50/s (one per
transaction) and times each from its commit to its handler's start, stops
the supervisors and tops the backlog up to its depth again (vacuumed, no
history). Prints p50 and p99 per run and the median of each per source.
The database (awa_pickup) is created on --server and dropped at the end.

With --floor, each run then times as many probes again under the same
drain, taken by a bare process instead (pickup_floor.py): the least any
Postgres queue can do on this machine under this load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Dict, List, Tuple

import psycopg2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # scripts/: scriptdb
sys.path.insert(0, HERE)

import scale_build as build  # noqa: E402
import scriptdb  # noqa: E402
from pickup_floor import floor_pickups  # noqa: E402
from scale_fleet import Fleet, done_count, p50_p99, probe_pickups, wait_for  # noqa: E402

QUEUE = "pickup"
PROBES, PROBE_HZ = 100, 50.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", required=True, help="awa_pool checkouts, comma-separated")
    parser.add_argument("--kind", choices=("noop", "sleep"), default="noop")
    parser.add_argument("--depth", type=int, default=1_000_000)
    parser.add_argument("--supervisors", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="children per supervisor")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-batch", type=int, help="max_batch_per_child (default: the pool's)")
    parser.add_argument("--floor", action="store_true", help="also time a bare listener's claims (the floor)")
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    sources = [os.path.abspath(s) for s in args.sources.split(",")]

    import awa_pool

    dsn = scriptdb.fresh_database(args.server, "awa_pickup")
    conn = psycopg2.connect(dsn)
    results: Dict[str, List[Tuple[float, float]]] = {s: [] for s in sources}
    floors: List[Tuple[float, float, float, float]] = []   # notified p50, p99; claimed p50, p99
    try:
        build.add_available(conn, QUEUE, args.depth, kind=args.kind)
        build.vacuum(conn, "awa.jobs_hot")
        next_arg = args.depth
        for rnd in range(1, args.rounds + 1):
            for source in sources:
                with Fleet(dsn, supervisors=args.supervisors, workers=args.workers,
                           queues=[f"{QUEUE},aging=0"], source=source, max_batch=args.max_batch) as fleet:
                    wait_for(lambda: done_count(conn, [QUEUE], args.kind) > 0, 120, "the first completion",
                             fleet, every=0.05)
                    p50, p99 = p50_p99(probe_pickups(dsn, fleet, QUEUE, PROBES, PROBE_HZ, awa_pool))
                    print(f"round {rnd} {source}: p50 {p50:.2f} ms, p99 {p99:.2f} ms "
                          f"(load {os.getloadavg()[0]:.2f})", flush=True)
                    if args.floor:
                        notified, claimed = floor_pickups(dsn, PROBES, PROBE_HZ, awa_pool)
                        floors.append(p50_p99(notified) + p50_p99(claimed))
                        print("round {} floor: notified p50 {:.2f} ms, p99 {:.2f} ms; claimed p50 {:.2f} ms, "
                              "p99 {:.2f} ms".format(rnd, *floors[-1]), flush=True)
                results[source].append((p50, p99))
                left = build.count(conn, "SELECT count(*) FROM awa.jobs_hot WHERE queue = %s", (QUEUE,))
                build.add_available(conn, QUEUE, args.depth - left, kind=args.kind, first=next_arg)
                next_arg += args.depth
                build.clear_done(conn)
                build.vacuum(conn, "awa.jobs_hot")
        for source, runs in results.items():
            print(f"{source}: p50 {statistics.median(r[0] for r in runs):.2f} ms, "
                  f"p99 {statistics.median(r[1] for r in runs):.2f} ms (medians of {len(runs)} runs)")
        if floors:
            print("floor: notified p50 {:.2f} ms, p99 {:.2f} ms; claimed p50 {:.2f} ms, p99 {:.2f} ms "
                  "(medians of {} runs)".format(*(statistics.median(f[i] for f in floors) for i in range(4)),
                                               len(floors)))
    finally:
        conn.close()
        scriptdb.drop_database(args.server, "awa_pickup")


if __name__ == "__main__":
    main()
