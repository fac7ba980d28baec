"""The handlers scale.py's supervisors run, and the supervisor process itself.

    python scale_tasks.py DSN --workers 1 --queue q [--queue r=2 ...] [--metrics-port P]
                          [--source CHECKOUT] [--no-leader]

runs one awa_pool.Pool (a supervisor and its children) until SIGTERM, with
these tasks registered before it forks:

  noop   returns at once (the drain curves)
  probe  writes "<tag> <time.time()>" to $SCALE_REC_DIR/probe-<pid>.txt when
         its handler starts (pickup latency: commit to handler start)
  sleep  sleeps `ms` milliseconds (weighted shares, like the harness's W5),
         and writes "<queue> <time.time()>" to $SCALE_REC_DIR/start-<pid>.txt
  echo   returns its `blob` argument as its result (payload sizes)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _record(prefix: str, line: str) -> None:
    path = os.path.join(os.environ["SCALE_REC_DIR"], f"{prefix}-{os.getpid()}.txt")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def register(awa_pool) -> None:
    @awa_pool.task("noop")
    def noop(**_args) -> None:
        return None

    @awa_pool.task("probe")
    def probe(tag: int) -> None:
        _record("probe", f"{tag} {time.time():.6f}\n")

    @awa_pool.task("sleep", pass_context=True)
    def sleep(ctx, ms: int = 20, **_args) -> None:
        _record("start", f"{ctx.queue} {time.time():.6f}\n")
        time.sleep(ms / 1000.0)

    @awa_pool.task("echo")
    def echo(blob: str) -> dict:
        return {"blob": blob}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--queue", action="append", default=[], help="a CLI queue spec; repeat")
    parser.add_argument("--queue-file", help="a file of queue specs, one a line (many queues)")
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--source", help="import awa_pool from this checkout")
    parser.add_argument("--no-leader", action="store_true", help="never campaign for leader")
    parser.add_argument("--max-batch", type=int, help="PoolConfig.max_batch_per_child")
    args = parser.parse_args()
    if args.source:
        sys.path.insert(0, os.path.dirname(HERE))
        from scriptdb import use_checkout

        use_checkout(args.source)
    import awa_pool

    queues = list(args.queue)
    if args.queue_file:
        with open(args.queue_file) as f:
            queues += [line.strip() for line in f if line.strip()]
    register(awa_pool)
    options = {"leader": not args.no_leader}
    if args.metrics_port is not None:
        options["metrics_port"] = args.metrics_port
    if args.max_batch is not None:
        options["max_batch_per_child"] = args.max_batch
    sys.exit(awa_pool.Pool(args.dsn, workers=args.workers, queues=queues, **options).run())


if __name__ == "__main__":
    main()
